"""One worker's life, phase by phase: prepare (its shard, server and graph: prepare.py), join
the cluster (join.py), train in lockstep (lockstep.py), finish and verify (finish.py), the
chief's duties (chief.py), then report done; and the one place that fills its result record.

core/protocol.py's docstring tells the whole protocol that these phases are one side of. Lines
that exist only because training is distributed and synchronous carry a `# Sync:` tag.
"""

from __future__ import annotations

import logging

from sync_mnist import api
from sync_mnist.models import registry
from sync_mnist.core.config import TaskConfig
from sync_mnist.core import stream
from sync_mnist.task import inputs, lockstep, report
from sync_mnist.task.chief import Chief, Evaluated
from sync_mnist.task.finish import Finished, awaiting, finish, say_done
from sync_mnist.task.join import Joined, join
from sync_mnist.task.lockstep import Trained
from sync_mnist.task.prepare import Worker, prepare

log = logging.getLogger(__name__)


def run_worker(config: TaskConfig, *, model: api.Model | None = None, server=None,
               failed: report.TaskResult | None = None) -> report.TaskResult:
    """Trains this worker's shard to the end and returns its result record.

    Args:
      config: the task and training configuration.
      model: the model and its data; the one --model names when None (tests pass their own).
      server: an already started tf.distribute.Server for this task (tests); started if None.
      failed: the record the caller keeps if the run raises; it learns whether the ps had
        taken this worker's done report (the chief's SavedModel fails after it), which a
        restart cannot undo. Nothing else: a failed run claims no verdict.
    """
    w = prepare(config, model or registry.resolve(config.train.model), server)
    chief = Chief(w) if config.is_chief else None
    finished = evaluated = None
    with join(w) as (sess, joined):
        if chief and config.train.eval_at_start:
            chief.at_the_start(joined.start_step)
        trained = lockstep.train(w, joined, sess,
                                 chief.during_training(joined.side) if chief else None)
        if chief:
            chief.save_final(sess, joined.status)
        finished = finish(w, joined.side)
        # A preempted run has no time for an evaluation or a model: the rerun makes them.
        if chief and not finished.preempted:
            evaluated = chief.at_the_finish(finished.counters, awaiting(w, joined.side))
    joined.side.close()
    if chief:
        chief.close()
    if w.writer:
        w.writer.close()
    if finished is None:  # never report done for a run that did not finish
        raise RuntimeError(f"{config.name}: the training session ended before the finish "
                           "phase")
    # The chief writes its model first: once it has reported done the ps may exit, and a
    # chief restarted after that could never read the weights again.
    write_error = chief.write_model() if evaluated and w.export_dir else None
    done_reported = say_done(w, finished.verdict)
    if failed is not None:
        failed.done_reported = done_reported
    if write_error is not None:  # raised only now, once the ps are not held up by it
        raise write_error
    log.info("verdict: %s", finished.verdict.line)
    log.info("data: %s", finished.data.line)
    return _result(w, joined, trained, finished, chief, evaluated, done_reported)


def _result(w: Worker, joined: Joined, trained: Trained, finished: Finished,
            chief: Chief | None, evaluated: Evaluated | None,
            done_reported: bool) -> report.TaskResult:
    """The worker's result record, from what each phase returned: the one place it is filled."""
    config, train = w.config, w.config.train
    result = report.TaskResult(role="worker", index=config.index, mode=train.mode,
                               replicas_to_aggregate=w.aggregate, model=train.model)
    result.target_steps = None if w.target == stream.UNTIL_INPUT_ENDS else w.target
    result.dataset = inputs.data_name(w.params)
    result.dataset_description = w.description
    result.ready_at, result.startup_s = joined.ready_at, joined.startup_s
    result.chief_wait_s = joined.chief_wait_s
    result.rejoined, result.start_step = joined.rejoined, joined.start_step
    result.sessions = joined.status.sessions
    result.failed_saves, result.save_error = joined.status.failed_saves, joined.status.save_error
    if chief:
        result.evaluation_at_start = chief.evaluation_at_start
    if w.warm and joined.status.model == "initialised":
        result.warm_started = {"from": w.warm.source, "variables": len(w.warm.names),
                               "optimizer_variables": len(w.warm.state)}
    result.finished_at, result.train_s = trained.finished_at, trained.train_s
    result.local_steps, result.last_token = trained.local_steps, trained.last_token or None
    result.examples_per_sec = (train.batch_size * trained.local_steps
                               / max(trained.train_s, 1e-9))
    result.stop_step = finished.stop_step or None
    if train.target_accuracy is not None:
        result.target_accuracy = train.target_accuracy
    if finished.preempted:
        result.preempted_at = finished.stop_step
    result.input_left = finished.input_left
    result.record_counters(finished.counters)
    result.lost = finished.lost
    result.synchronous, result.verdict = finished.verdict.synchronous, finished.verdict.line
    result.data_covered, result.data_verdict = finished.data.covered, finished.data.line
    if chief:
        result.test_metrics = chief.test_metrics
        if chief.evaluations and not finished.preempted:
            chief.evaluations.record(result)
    if evaluated:
        result.test_accuracy, result.test_loss = evaluated.accuracy, evaluated.loss
    result.done_reported = done_reported
    return result
