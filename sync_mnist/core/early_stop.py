"""Stopping the whole cluster on one update: at --target-accuracy, or when a task is preempted.

Time to accuracy: the chief evaluates on the model's evaluation data every --eval-every updates, and the
cluster stops at the first evaluation that reaches --target-accuracy. Preemption (preemption.py):
a task sent SIGTERM or SIGUSR1 asks for the stop the same way, and the cluster stops on one
update, saves there and exits 143.

Why the stop goes through an update, with R = N (lockstep): the chief evaluates after update s,
holding the token of s and not yet having pushed for s + 1, while the other workers may have
pushed for s + 1 already and wait for their tokens. So update s + 1 must still be made, and be
the last. The chief writes `reached_at = s` on ps 0 and then pushes as usual. The next update
(s + 1, which needs the chief's gradient) reads `reached_at` inside the update op, after
global_step += 1 and before it hands out its tokens, and latches `stop_step` to its own global
step. Each worker reads `stop_step` in the same run as its token, after the token: the token of
s + 1 comes with stop_step = s + 1, and every worker stops on it. Nobody waits for a token that
never comes, and the counters verify as for a run planned to s + 1 updates.

With backup workers (R < N) an update can be made without the chief, so the update that
latches is the first one after the chief's write, whichever it is: its tokens are the first to
carry the stop, and the tokens of earlier updates never do. A worker holding an older token
sees stop_step ahead of it and pushes on (a stale gradient, dropped) until it takes a token of
the last update, exactly as at the planned end (sync.train_loop).

In async mode there are no tokens and nothing to wait for: the chief sets stop_step itself, and
each worker stops after the step in which it reads it.

A preemption asks through `preempt_at` instead of `reached_at`, from any task at any moment (a
ps between its polls, a worker between two steps): the argument above does not need the asker
to hold a token. Any update after the request is made with every worker's push (R = N), so its
tokens reach every worker with the stop. The latch records why it latched (`reason`), so every
task, the ps included, ends with the same code. A stop is latched only before the planned
end: a request that comes later changes nothing, and the run ends complete.

A worker whose streamed input ends (core/stream.py: files of unequal length) asks the same way,
through `input_ended_at`, before it pushes its last batch's gradient: the update that gradient
joins is the last, and the run ends complete (INPUT_ENDED; exit 0), verified as one planned to
that update. Were two reasons asked at once, the target comes first, then the input's end (a
run whose input ended has nothing left to resume), then the preemption.

Each step reads stop_step on ps 0 right after its token is taken there, in the same run: one
scalar more from ps 0, and no round trip more.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, NamedTuple

import tensorflow as tf

tf1 = tf.compat.v1
log = logging.getLogger("sync_mnist.task.worker")  # the chief's lines, tagged as its others

NONE = 0  # reached_at and stop_step before the target is reached (global steps start at 1)
TARGET, PREEMPTED, INPUT_ENDED = 1, 2, 3  # why the cluster stopped early (StopVars.reason)


class StopVars(NamedTuple):
    """Scalars on ps 0, built by every task (protocol.build_shared); not checkpointed."""

    reached_at: tf.Variable  # int64: global step whose evaluation reached the target; 0: not yet
    stop_step: tf.Variable  # int64: the update the cluster stops on; 0: the planned end
    preempt_at: tf.Variable  # int64: > 0 once a task was preempted (the global step it saw + 1)
    reason: tf.Variable  # int64: TARGET, PREEMPTED or INPUT_ENDED once latched; else NONE
    input_ended_at: tf.Variable  # int64: > 0 once a worker's input is at its last batch

    @property
    def transient(self) -> list[tf.Variable]:
        return list(self)


class StopOps(NamedTuple):
    """What a worker's graph adds to ask for the stop and to see it."""

    read: tf.Tensor  # stop_step, read after this worker's token (same run as the train op)
    step: tf.Tensor  # placeholder int64: the global step the chief's evaluation reached it at
    request: tf.Operation  # the chief's: reached_at = step (and stop_step = step in async mode)
    preempt: tf.Operation  # any task's, when it is preempted (preempt_op)
    input_ends: tf.Operation  # a worker's, before it pushes its input's last batch


def build_stop_vars() -> StopVars:
    """The shared stop variables, explicitly on ps 0, outside the replica setter's round-robin."""
    # Sync: on ps 0 with global_step, where the update op that latches the stop runs.
    with tf1.device("/job:ps/task:0"), tf1.variable_scope("sync_stop"):
        def scalar(name):
            return tf1.get_variable(name, [], tf.int64, tf1.zeros_initializer(),
                                    trainable=False)

        return StopVars(scalar("reached_at"), scalar("stop_step"), scalar("preempt_at"),
                        scalar("reason"), scalar("input_ended_at"))


def latch(stop: StopVars, step: tf.Tensor, end: int) -> tf.Operation:
    """The first update after a request becomes the stop step, unless it is the planned end
    `end` or past it (sync mode).

    Built inside the update op: `step` is the global step this update makes, and the latch runs
    before the update's tokens are handed out (sync.build_train_op's `after_update`).
    """
    current = stop.stop_step.read_value()
    reached = stop.reached_at.read_value() > NONE
    ended = stop.input_ended_at.read_value() > NONE
    asked = tf.reduce_any([reached, ended, stop.preempt_at.read_value() > NONE])
    # Only this op writes stop_step in sync mode, and the chief's queue runner makes one update
    # at a time, so a read-then-write cannot lose a latch.
    first = tf.logical_and(tf.logical_and(asked, tf.equal(current, NONE)),
                           step < tf.cast(end, step.dtype))
    why = tf.where(reached, tf.constant(TARGET, tf.int64),
                   tf.where(ended, tf.constant(INPUT_ENDED, tf.int64),
                            tf.constant(PREEMPTED, tf.int64)))
    return tf.group(tf1.assign(stop.stop_step, tf.where(first, tf.cast(step, tf.int64), current)),
                    tf1.assign(stop.reason, tf.where(first, why, stop.reason.read_value())),
                    name="latch_stop_step")


def build_stop_ops(stop: StopVars, token: tf.Tensor, global_step: tf.Variable,
                   mode: str) -> StopOps:
    """The read that follows each step's token, and the requests.

    `token` is the step's token where it is taken, on ps 0 (sync.SyncTraining.token_on_ps): the
    read waits for it there, and crosses to the worker beside it.
    """
    with tf1.device(stop.stop_step.device), tf.control_dependencies([token]):
        # Sync: after the token, never before it
        read = tf.identity(stop.stop_step.read_value(), name="stop_step_after_token")
    with tf1.device(stop.reached_at.device):
        step = tf1.placeholder(tf.int64, [], name="target_reached_at")
        request = [tf1.assign(stop.reached_at, step)]
        if mode == "async":  # every push is an update of its own: no update to latch it
            request += _stop_now(stop, step, TARGET)
    return StopOps(read, step, tf.group(*request, name="request_stop"),
                   preempt_op(stop, global_step, mode),
                   _next_update_op(stop, stop.input_ended_at, INPUT_ENDED, global_step, mode,
                                   "request_input_ended_stop"))


def preempt_op(stop: StopVars, global_step: tf.Variable, mode: str) -> tf.Operation:
    """A preempted task's request: the cluster stops on the next update (async: now)."""
    return _next_update_op(stop, stop.preempt_at, PREEMPTED, global_step, mode,
                           "request_preempted_stop")


def _next_update_op(stop: StopVars, asked: tf.Variable, why: int, global_step: tf.Variable,
                    mode: str, name: str) -> tf.Operation:
    """A request that the cluster stop on the next update (async: now), written to `asked`."""
    with tf1.device(asked.device):
        seen = tf.cast(global_step.read_value(), tf.int64) + 1
        request = [tf1.assign(asked, seen)]
        if mode == "async":
            request += _stop_now(stop, seen, why)
    return tf.group(*request, name=name)


def _stop_now(stop: StopVars, step: tf.Tensor, why: int) -> list[tf.Operation]:
    """Async mode: the stop step set at once, by the first request only."""
    first = tf.equal(stop.stop_step.read_value(), NONE)
    return [tf1.assign(stop.stop_step, tf.where(first, step, stop.stop_step.read_value())),
            tf1.assign(stop.reason, tf.where(first, tf.constant(why, tf.int64),
                                             stop.reason.read_value()))]


def should_stop(token: int, stop_step: int, mode: str) -> bool:
    """Whether a worker that was just handed `token` and read `stop_step` stops now.

    Sync: once its token reaches the stop step, the last update (an older token, with backups,
    means its gradient was stale: it pushes on). Async: as soon as a stop is announced.
    """
    if stop_step == NONE:
        return False
    return mode == "async" or token >= stop_step


def end_step(planned: int, stop_step: int) -> int:
    """The global step training ends at: the planned one, or the stop step if it came first."""
    return planned if stop_step == NONE else min(planned, stop_step)


@dataclasses.dataclass(frozen=True)
class Point:
    global_step: int  # of the weights evaluated (read on the ps just before)
    seconds: float  # since the chief's training started, when the update was made
    accuracy: float
    loss: float

    def as_list(self) -> list:
        return [self.global_step, round(self.seconds, 3), self.accuracy, self.loss]


class ChiefEvaluations:
    """The chief's evaluations every `every` updates, and the stop at `target`.

    With R = N the weights evaluated are exactly those after the update of the token: nothing
    is updated until the chief pushes again. With backups or in async mode the other workers
    may update them during the evaluation; the point is then of about that global step.
    """

    def __init__(self, *, every: int, target: float | None,
                 evaluate: Callable[[], tuple[float, float]], read_step: Callable[[], int],
                 request_stop: Callable[[int], None], writer=None,
                 clock: Callable[[], float] = time.monotonic):
        self._every, self.target = every, target
        self._evaluate, self._read_step, self._request_stop = evaluate, read_step, request_stop
        self._writer, self._clock = writer, clock
        self._started = clock()
        self._next = every
        self.points: list[Point] = []
        self.reached: Point | None = None  # the first point at or above the target

    def after_update(self, token: int) -> None:
        """Called with each token the chief is handed; evaluates once per multiple of `every`
        that the global step has passed (a token may skip one with backups or in async mode)."""
        if token < self._next or self.reached is not None:
            return
        self._next = (token // self._every + 1) * self._every
        seconds = self._clock() - self._started
        step = self._read_step()
        accuracy, loss = self._evaluate()
        point = Point(step, seconds, accuracy, loss)
        self.points.append(point)
        if self._writer:
            self._writer.add_summary(tf1.Summary(value=[
                tf1.Summary.Value(tag="test/accuracy", simple_value=accuracy),
                tf1.Summary.Value(tag="test/loss", simple_value=loss)]), step)
            self._writer.flush()
        log.info("evaluation at global_step=%d (%.1f s): test_accuracy=%.4f test_loss=%.4f",
                 step, seconds, accuracy, loss)
        if self.target is not None and accuracy >= self.target:
            self.reached = point
            # Sync: announced through ps 0 before the chief's next push; the update that push
            # completes is the cluster's last.
            self._request_stop(step)
            log.info("target test_accuracy %g reached at global_step %d after %.1f s; "
                     "stopping the cluster", self.target, step, seconds)

    def record(self, result) -> None:
        """Fills the result record's time-to-accuracy fields (report.TaskResult)."""
        result.evaluations = [p.as_list() for p in self.points]
        if self.target is not None and self.reached is None:
            best = max(self.points, key=lambda p: p.accuracy, default=None)
            log.info("target test_accuracy %g not reached in %d evaluations%s; trained the "
                     "planned length", self.target, len(self.points),
                     f" (best {best.accuracy:.4f} at global_step {best.global_step})"
                     if best else "")
        if self.reached is not None:
            result.time_to_target_s = round(self.reached.seconds, 3)
            result.updates_to_target = self.reached.global_step
            result.accuracy_at_target = self.reached.accuracy
