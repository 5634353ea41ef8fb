"""A worker trains in lockstep: one gradient per local step, each step's token the update that
gradient joined, until the token reaches the target or the cluster's agreed stop."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import tensorflow as tf

from sync_mnist.core import early_stop, stream, sync
from sync_mnist.core.config import TaskTimeout, first_line
from sync_mnist.core.shard import DataError, check_ids, check_pass
from sync_mnist.task import preemption, progress_log, report, waits

tf1 = tf.compat.v1
log = logging.getLogger(__name__)


class StepCutShort(RuntimeError):
    """A training step ended in OutOfRangeError or StopIteration: a failure, never an end."""


@contextlib.contextmanager
def no_silent_end(me: str):
    """Turns OutOfRangeError and StopIteration into StepCutShort.

    MonitoredSession.__exit__ takes these two for "training is over" and swallows them, so a
    step that met one would skip the finish phase without a word. Use it inside the session's
    `with`, around everything that runs steps.
    """
    try:
        yield
    except (tf.errors.OutOfRangeError, StopIteration) as e:
        raise StepCutShort(f"{me}: a step ended in {type(e).__name__} (a queue on the ps was "
                           f"closed under it): {first_line(e)}") from e


class BatchFeed(tf.compat.v1.train.SessionRunHook):
    """Feeds each step its batch from inside the training session (`use` names the step).

    Sync: MonitoredSession runs a step again, with the same feed, after it re-created its
    session for a lost ps; a ps restored from a checkpoint has rolled global_step back, and the
    step now joins the update after the restored one. Fed here, the batch is that update's
    (read after the re-creation, lockstep only): the updates lost with the ps are made again
    from their own batches, and no example counts in two updates (the in-memory shard as well
    as a stream's).
    """

    def __init__(self, w):
        self.w = w
        self.lockstep = (w.config.train.mode == "sync"
                         and w.aggregate == w.config.cluster.num_workers)
        self.step: int | None = None  # the step whose batch is fed; None: before training
        self._batch = None
        self._pass = 0  # the batch's pass, from 0 (--count-examples counts the uses by pass)

    def use(self, step: int):
        """The batch of `step` (features, labels), fed to the runs that follow."""
        self.step, self._batch = step, self.w.shard.batch(step)
        train = self.w.config.train
        if train.count_examples:
            where = f"batch {step} of worker {self.w.config.index}"
            check_ids(self._batch[0][train.count_examples], train.count_examples,
                      train.count_examples_ids, where)
            self._pass = self.w.shard.pass_of(step)
            check_pass(self._pass, train.count_examples, where)
        return self._batch

    def after_create_session(self, session, coord) -> None:
        if self.step is not None and self.lockstep:  # re-created mid-run
            restored = int(session.run(self.w.g.state.global_step, options=self.w.bounded))
            if restored != self.step:
                log.warning("the session was re-created at global_step %d: my step feeds its "
                            "batch, not that of step %d", restored, self.step)
                self.use(restored)

    def before_run(self, run_context):
        if self._batch is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(None, feed_dict=self.w.g.feed(*self._batch,
                                                                            self._pass))


def token_owed(side, g, index: int, options) -> int | None:
    """With R = N: global_step, where this worker is owed the token of its last push without
    pushing again (its gradient waits for the update, or the update left the token); else None.

    One reading decides: an update puts the tokens into their owners' queues before it makes
    the new global step visible, and the queue is read after global_step, so whoever reads the
    new step also finds the token (sync.build_train_op).
    """
    step, last_push, waiting = side.run(g.training.rejoin_reading, options=options)
    step, last_push, waiting = int(step), int(last_push[index]), int(waiting)
    if not sync.rejoin_needed(last_push=last_push, global_step=step, tokens_waiting=waiting):
        return None
    return step


@dataclasses.dataclass
class Trained:
    """What the lockstep loop did."""

    local_steps: int
    last_token: int  # the update this worker's last gradient joined (early_stop.NONE: none)
    stopped_early: bool  # the cluster's agreed stop (target accuracy, preemption) ended it
    finished_at: float  # unix time the last step returned
    train_s: float  # session ready to last step


def train(w, joined, sess, evaluations: early_stop.ChiefEvaluations | None) -> Trained:
    """Runs the local steps from `joined.start_step`; `evaluations`: the chief's, during
    training (--eval-every), else None."""
    config, train_config, g, side = w.config, w.config.train, w.g, joined.side
    progress = progress_log.Progress(config, side, g.state, w.writer, w.target)
    step_runner = _StepRunner(w, joined, sess, evaluations, progress)
    train_started = time.monotonic()

    def stopped(token: int) -> bool:
        return early_stop.should_stop(token, step_runner.stop_step, train_config.mode)

    local = sync.train_loop(step_runner, start_step=joined.start_step, planned=joined.planned,
                            target=w.target, stop_on_token=train_config.mode == "sync",
                            stopped=stopped)
    last_token = step_runner.last_token
    stopped_early = stopped(last_token)
    if stopped_early and not sync.ran_the_plan(local=local, token=last_token,
                                               planned=joined.planned, target=w.target,
                                               stop_on_token=train_config.mode == "sync"):
        streamed = w.target == stream.UNTIL_INPUT_ENDS
        causes = [*(["the chief's evaluation reached the target accuracy"]
                    if train_config.target_accuracy is not None else []),
                  *(["a worker's input ended"] if streamed else []), "a task was preempted"]
        log.info("stopped after %d local steps, at global_step %d: %s (planned: %s)",
                 local, last_token, ", or ".join(causes),
                 "until a worker's input ends" if streamed else
                 f"{joined.planned} local steps" if train_config.mode == "async"
                 else f"{w.target} updates")
    return Trained(local, last_token, stopped_early, time.time(),
                   time.monotonic() - train_started)


def refused_input(error: tf.errors.InvalidArgumentError, step: int, index: int) -> Exception:
    """A step's InvalidArgumentError as what it is: where it is the model's own check of its
    input failing (an Assert in its graph: a canned classifier's label out of range), bad
    input (DataError, exit 2) naming the batch and what the check said; else itself."""
    text = error.message
    if "assertion failed: " not in text:
        return error
    said = text.split("assertion failed: ", 1)[1].split("\n", 1)[0].strip()
    return DataError(f"batch {step} of worker {index}'s input failed the model's check: {said}")


class _StepRunner:
    """One local step, as sync.train_loop calls it: the batch of `step`, its push, and what the
    update's token says."""

    def __init__(self, w, joined, sess, evaluations, progress: progress_log.Progress):
        self.w, self.joined, self.sess = w, joined, sess
        self.evaluations, self.progress = evaluations, progress
        g = w.g
        # Sync: the stop step, read after the token
        self.fetches = [g.training.train_op, g.spec.loss, dict(g.spec.train_metrics),
                        g.stop.read]
        self.lockstep = (w.config.train.mode == "sync"
                         and w.aggregate == w.config.cluster.num_workers)
        self.steps_run = 0
        self.stop_step = self.last_token = early_stop.NONE
        self.asked_to_stop = self.input_ended = False
        preemption.arm()

    def __call__(self, step: int) -> int:
        w, g, side = self.w, self.w.g, self.joined.side
        self.joined.feed.use(step)
        if (blob := w.shard.position()) is not None:  # kept for a restart (stream.py)
            self._keep(blob)
        if w.shard.ends_after(step) and not self.input_ended:
            # Sync: before this push, so that the update it joins is the cluster's last
            # (early_stop.py): no worker waits for a gradient of mine that will not come.
            log.info("my input ends with batch %d: asking the cluster to stop on the update "
                     "its gradient joins (%d)", step, step + 1)
            side.run(g.stop.input_ends, options=w.bounded)
            self.input_ended = True
        sessions = self.joined.status.sessions
        try:
            # The chief's periodic checkpoint save runs in this run (the saver hook's after_run),
            # bounded by a bounded_call whose timeout names no ps.
            with waits.naming_silent_ps(worker=w.config.index, side=side, graph=w.graph,
                                        cluster=w.config.cluster):
                token, loss, train_metrics, stop_step = self.sess.run(self.fetches,
                                                                      options=w.bounded)
        except tf.errors.DeadlineExceededError:
            token, loss, train_metrics, stop_step = self._after_a_stall(step)
        except tf.errors.InvalidArgumentError as e:
            raise refused_input(e, step, w.config.index) from e
        if self.lockstep and token != step + 1:
            if self.joined.status.sessions == sessions:
                # Sync: a token can only come from the update this push joined; another
                # one means the lockstep broke (tokens are owned: sync.build_train_op).
                raise self._stalled(f"pushed for update {step + 1} but was handed token "
                                    f"{token}, in the same session: the lockstep is broken")
            # Sync: the ps was lost and the chief restored it from the last checkpoint.
            log.warning("global_step went back from %d to %d: the ps was restored from "
                        "a checkpoint; training on from there", step + 1, token)
        self.steps_run += 1
        if loss is not None:  # (a step that waited past a stall has none: _after_a_stall)
            self.progress.step(self.steps_run, loss, train_metrics)
        self.last_token, self.stop_step = int(token), int(stop_step)
        if preemption.requested() and not self.asked_to_stop:
            # Sync: the next update is the cluster's last (early_stop.py)
            side.run(g.stop.preempt, options=w.bounded)
            self.asked_to_stop = True
        if self.evaluations:
            self.evaluations.after_update(self.last_token)
        return self.last_token

    def _keep(self, blob: bytes) -> None:
        """Writes an input position on ps 0. Best effort: a position not kept costs a restart
        some reading (it starts from an earlier one), never the run; a lost ps shows in the
        step that follows."""
        w, g = self.w, self.w.g
        try:
            self.joined.side.run(g.positions.write, {g.positions.slot: [stream.position_slot(
                w.config.index, blob)], g.positions.blob: [blob]}, options=w.bounded)
        except tf.errors.OpError as e:
            log.warning("could not keep my input's position on the ps (%s: %s): a restart "
                        "reads from an earlier one", type(e).__name__, first_line(e))

    def _after_a_stall(self, step: int) -> tuple[int, float | None, dict, int]:
        """What the step's run would have fetched (its loss and metrics lost), once it waited
        --timeout for its update: where the update waits for other workers only, this worker
        says so (report.WAITING_FOR_REPLACEMENT: a launcher restarts them at once) and waits
        --restart-grace more for its token, its gradient already pushed. Else TaskTimeout.

        Sync: a worker cut off, frozen or dead holds every other up; restarting each of them
        too would turn one fault into N (found by make chaos: a partition of one worker
        restarted all three).
        """
        w, g, side = self.w, self.w.g, self.joined.side
        me, grace = f"worker {w.config.index}", w.config.train.restart_grace
        what = f"waited {w.config.train.timeout:g} s for an update after local step {step}"
        text, missing = progress_log.stalled(side, g.state, g.members, w.config)
        stalled = TaskTimeout(f"{me}: {what}; {text}", missing=missing)
        if not (self.lockstep and grace > 0 and missing and me not in missing
                and all(m.startswith("worker ") for m in missing)):
            raise stalled
        stalled.handled()
        log.warning("%s; %s; %s %s, for up to --restart-grace %g s more", what, text,
                    report.WAITING_FOR_REPLACEMENT, ", ".join(missing), grace)
        since, token = time.monotonic(), None
        if token_owed(side, g, w.config.index, w.bounded) is not None:  # my push is in
            try:
                token = int(side.run(g.training.rejoin, options=tf1.RunOptions(
                    timeout_in_ms=int(grace * 1000))))
            except tf.errors.DeadlineExceededError:
                pass
        if token is None:
            raise TaskTimeout(f"{me}: {what}, and --restart-grace {grace:g} s more for the "
                              f"replacement of {', '.join(missing)}; {text}", missing=missing)
        log.info("update %d came %.1f s later: training on", token, time.monotonic() - since)
        return token, None, {}, int(side.run(g.stop_vars.stop_step, options=w.bounded))

    def _stalled(self, what: str) -> TaskTimeout:
        """A timeout of this worker's: what it waited for, what the ps says so far, and the
        workers the next update still waits for."""
        w = self.w
        text, missing = progress_log.stalled(self.joined.side, w.g.state, w.g.members, w.config)
        return TaskTimeout(f"worker {w.config.index}: {what}; {text}", missing=missing)
