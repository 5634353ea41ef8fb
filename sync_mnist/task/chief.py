"""What only the chief (worker 0) does: evaluate the model, during training (--eval-every) and
at the end, write the summaries, save the final checkpoint and write the SavedModel."""

from __future__ import annotations

import dataclasses
import logging

from sync_mnist.core import early_stop, checkpoints, sessions
from sync_mnist.core.sessions import SideSession
from sync_mnist.core.verdict import Counters
from sync_mnist.task import evaluation, export, inputs, preemption, progress_log, waits
from sync_mnist.task.prepare import Worker

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Evaluated:
    """The chief's final evaluation."""

    accuracy: float | None  # its "accuracy" metric, if the model has one
    loss: float
    metrics: dict  # every eval_metric_ops value


class Chief:
    """The chief's duties over one run. The evaluation data is read, and the evaluation graph
    built, at the first evaluation: while it trains, the chief holds only its shard."""

    def __init__(self, w: Worker):
        self.w = w
        self.eval_data = self.evaluator = self.side = None
        self.evaluations: early_stop.ChiefEvaluations | None = None
        self.test_metrics: dict | None = None  # the last evaluation's
        self.evaluation_at_start: dict | None = None  # --eval-at-start's (at_the_start)
        self.weights = None  # read for the SavedModel at the finish

    def during_training(self, side: SideSession) -> early_stop.ChiefEvaluations | None:
        """The evaluations during training (--eval-every), and the stop at the target."""
        self.side = side
        w, g, train = self.w, self.w.g, self.w.config.train
        if not train.eval_every:
            return None

        def request_stop(step: int) -> None:
            side.run(g.stop.request, {g.stop.step: step}, options=w.bounded)

        self.evaluations = early_stop.ChiefEvaluations(
            every=train.eval_every, target=train.target_accuracy,
            evaluate=self.evaluate,
            read_step=lambda: int(side.run(g.state.global_step, options=w.bounded)),
            request_stop=request_stop, writer=w.writer)
        return self.evaluations

    def evaluate(self) -> tuple[float | None, float]:
        """(The "accuracy" metric, if the model has one, and the mean loss) on the model's
        evaluation data."""
        w = self.w
        if self.evaluator is None:
            config = w.config
            self.eval_data = inputs.load_eval(w.model, w.params, config.train.seed)
            self.evaluator = evaluation.Evaluator(
                w.model, w.params, num_ps=config.cluster.num_ps,
                worker=f"/job:worker/task:{config.index}", target=w.server.target,
                tf_config=w.tf_config, ps_hosts=config.cluster.ps_hosts)
        if isinstance(self.eval_data, tuple):
            self.test_metrics, loss = self.evaluator(*self.eval_data, w.bounded)
        else:  # a stream, read whole
            self.test_metrics, loss = self.evaluator.over(self.eval_data, w.bounded)
        return self.test_metrics.get(evaluation.ACCURACY), loss

    def save_final(self, sess, status: sessions.SessionStatus) -> None:
        """sessions.save_final; its timeout (a bounded_call's, which names no ps) also says which
        ps is silent, so that the launcher restarts that ps, not only this task (found by make
        chaos: ps 0 of 2 frozen as the chief saved; the workers named ps 0 and the chief did
        not, and the launcher had no restart left for the chief)."""
        with waits.naming_silent_ps(worker=0, side=self.side, graph=self.w.graph,
                                    cluster=self.w.config.cluster):
            sessions.save_final(sess, status)

    def at_the_start(self, step: int) -> None:
        """--eval-at-start: the model as the chief starts to train, at global step `step`,
        before its first update (the other workers wait for it, as for any evaluation)."""
        accuracy, loss = self.evaluate()
        log.info("evaluation at the start, global_step=%d: test_accuracy=%s test_loss=%.4f on "
                 "%d evaluation examples (%s)", step,
                 "-" if accuracy is None else f"{accuracy:.4f}", loss, self.evaluator.examples,
                 " ".join(f"{k}={v:.4f}" for k, v in self.test_metrics.items()))
        self.evaluation_at_start = {"global_step": step, "loss": loss, **self.test_metrics}

    def at_the_finish(self, counters: Counters, awaiting) -> Evaluated:
        """The final evaluation, the summaries, and the weights for the SavedModel, read while
        the ps serves. `awaiting(what)` bounds each read of the ps (finish.py)."""
        w = self.w
        w.shard = None  # trained: make room for the evaluation data
        with awaiting("to evaluate the model"):
            accuracy, loss = self.evaluate()
        log.info("test_accuracy=%s test_loss=%.4f on %d evaluation examples (%s)",
                 "-" if accuracy is None else f"{accuracy:.4f}", loss, self.evaluator.examples,
                 " ".join(f"{k}={v:.4f}" for k, v in self.test_metrics.items()))
        if w.writer:
            progress_log.write_summaries(w.writer, counters, test_accuracy=accuracy)
        if w.export_dir:  # the weights evaluated just now, read while the ps serves
            with awaiting("to read the trained weights for the export"):
                self.weights = export.read_weights(
                    lambda fetches: self.side.run(fetches, options=w.bounded), w.graph,
                    export.variable_names(w.model, w.params, w.example))
        return Evaluated(accuracy, loss, self.test_metrics)

    def write_model(self) -> Exception | None:
        """Writes the SavedModel; the error if it could not. A disk with no room is tried again
        for up to --timeout (checkpoints.retry_for_room), so that a disk freed within the bound
        every fault has keeps the run's product; the ps wait that long more for the chief's
        done report (ps.py, _watchdog). Not once a preemption has been asked for."""
        w = self.w
        try:
            _, tries = checkpoints.retry_for_room(
                lambda: export.write_saved_model(w.model, w.params, w.example, self.weights,
                                                 w.export_dir),
                export.ExportError, w.config.train.timeout, stop=preemption.signalled,
                bound="--timeout")
        except Exception as e:
            return e
        log.info("saved the trained model to %s%s", w.export_dir,
                 f" (try {tries})" if tries > 1 else "")
        return None

    def close(self) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
        if hasattr(self.eval_data, "close"):  # a stream's session
            self.eval_data.close()
