"""Synchronous training: the SyncReplicasOptimizer wiring, the counters that prove it, the verdict.

How one synchronous update works (SyncReplicasOptimizer, between-graph replication):
  1. Each worker computes gradients and pushes them into one ConditionalAccumulator per
     variable, on that variable's ps, tagged with the worker's local step.
  2. The worker then blocks on the token queue.
  3. The chief's queue runner waits until every accumulator holds R gradients, applies their
     average with the real optimizer (global_step += 1), and enqueues one token per worker.

Counting is done on the ps, never assumed:
  * `pushed[w]`   += 1 in worker w's own step, just before its gradients are pushed.
  * `accepted[w]` is written by the update itself. Each worker also pushes one_hot(w) into an
    accumulator of its own, next to the gradients, so the update receives the mean of the R
    one-hot vectors it averaged; times R that is exactly how many gradients of each worker went
    into this update. A gradient the accumulator drops as stale never reaches it.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import tensorflow as tf

tf1 = tf.compat.v1


class SharedState(NamedTuple):
    """Variables on the ps that every task of the cluster reads."""

    global_step: tf.Variable
    pushed: tf.Variable  # int64 [workers]: gradients each worker pushed
    accepted: tf.Variable  # int64 [workers]: gradients of each worker that some update averaged
    repeat_updates: tf.Variable  # updates that averaged two gradients of one worker
    solo_updates: tf.Variable  # updates whose gradients all came from a single worker (R > 1)


class SyncTraining(NamedTuple):
    train_op: tf.Tensor  # its value: the global step after the update this push belongs to
    hooks: list


def build_shared_state(num_workers: int) -> SharedState:
    """Creates global_step and the counters. Call it first under the replica device setter.

    Every task calls this in the same order, so replica_device_setter's round-robin puts each
    variable on the same ps in every task's graph; that is what lets a ps read the counters.
    """
    global_step = tf1.train.get_or_create_global_step()
    with tf1.variable_scope("sync_counters"):
        def counter(name, shape=()):
            return tf1.get_variable(name, shape, tf.int64, tf1.zeros_initializer(),
                                    trainable=False)

        return SharedState(global_step, counter("pushed", [num_workers]),
                           counter("accepted", [num_workers]), counter("repeat_updates"),
                           counter("solo_updates"))


def build_train_op(loss: tf.Tensor, state: SharedState, optimizer: tf1.train.Optimizer, *,
                   worker_index: int, num_workers: int, replicas_to_aggregate: int,
                   is_chief: bool, mode: str = "sync") -> SyncTraining:
    """Builds one worker's training step.

    Args:
      loss: the scalar loss of this worker's graph.
      state: from build_shared_state.
      optimizer: the real optimizer (Adam by default).
      worker_index: this worker, 0 being the chief.
      num_workers: workers in the cluster.
      replicas_to_aggregate: gradients averaged per update; num_workers for strict lockstep.
      is_chief: whether this worker runs the update loop.
      mode: "sync", or "async" for the plain optimizer (every push is an update of its own).

    Returns:
      SyncTraining with the op to run each step and the hooks the session needs.
    """
    grads_and_vars = optimizer.compute_gradients(loss)
    count_push = tf1.scatter_add(state.pushed, [worker_index], tf.ones([1], tf.int64))
    with tf.control_dependencies([count_push]):
        grads_and_vars = [(tf.identity(g), v) for g, v in grads_and_vars]

    if mode == "async":
        apply = optimizer.apply_gradients(grads_and_vars, state.global_step)
        with tf.control_dependencies([apply]):
            count = tf1.scatter_add(state.accepted, [worker_index], tf.ones([1], tf.int64))
        with tf.control_dependencies([count]):
            return SyncTraining(tf.identity(state.global_step.read_value()), [])

    # Sync: the pseudo-gradient one_hot(worker) rides along with the real gradients, in an
    # accumulator of its own, and _AcceptanceCounter turns its average into per-worker counts.
    who = tf.one_hot(worker_index, num_workers, dtype=tf.float32)
    counting = _AcceptanceCounter(optimizer, state, replicas_to_aggregate)
    sync_optimizer = tf1.train.SyncReplicasOptimizer(
        counting, replicas_to_aggregate=replicas_to_aggregate, total_num_replicas=num_workers)
    train_op = sync_optimizer.apply_gradients(grads_and_vars + [(who, state.accepted)],
                                              global_step=state.global_step)
    # Sync: num_tokens=0 is the fix for the question's asynchrony. The default preloads R
    # tokens that any worker may take, so one fast worker can supply every gradient of an
    # update. With no preloaded tokens, a worker gets its next token only from the update its
    # last gradient joined, so with R = N each update holds exactly one gradient per worker.
    hook = sync_optimizer.make_session_run_hook(is_chief, num_tokens=0)
    _quiet_queue_runner_at_close(sync_optimizer)
    return SyncTraining(train_op, [hook])


def _quiet_queue_runner_at_close(sync_optimizer) -> None:
    """Lets the chief's queue runner end quietly when its session closes.

    After the last update the queue runner is blocked waiting for gradients that will never
    come; closing the session cancels that wait. The stock runner treats the CancelledError as
    a failure and prints a traceback from its thread, so rebuild it with the same op and
    CancelledError counted as a normal end, like a closed queue. (Private attributes: the
    optimizer offers no public way to configure its runner.)
    """
    stock = sync_optimizer._chief_queue_runner  # pylint: disable=protected-access
    sync_optimizer._chief_queue_runner = tf1.train.QueueRunner(  # pylint: disable=protected-access
        stock.queue, stock.enqueue_ops,
        queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError))


class _AcceptanceCounter(tf1.train.Optimizer):
    """The real optimizer plus bookkeeping, as SyncReplicasOptimizer's inner optimizer.

    SyncReplicasOptimizer hands the averaged gradients of each update to this object; the
    `accepted` pair among them is the mean of the one-hot worker vectors of that update.
    """

    def __init__(self, optimizer: tf1.train.Optimizer, state: SharedState, replicas: int):
        super().__init__(use_locking=False, name=optimizer.get_name())
        self._optimizer = optimizer
        self._state = state
        self._replicas = replicas

    def compute_gradients(self, *args, **kwargs):
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        model_grads, mean_one_hot = [], None
        for grad, var in grads_and_vars:
            if var is self._state.accepted:
                mean_one_hot = grad
            else:
                model_grads.append((grad, var))
        update = self._optimizer.apply_gradients(model_grads, global_step, name=name)
        # Gradients of each worker in this update: the mean of R one-hot vectors, times R.
        per_worker = tf.cast(tf.round(mean_one_hot * self._replicas), tf.int64)
        most = tf.reduce_max(per_worker)
        bookkeeping = [
            tf1.assign_add(self._state.accepted, per_worker),
            tf1.assign_add(self._state.repeat_updates, tf.cast(most > 1, tf.int64)),
            tf1.assign_add(self._state.solo_updates,
                           tf.cast(tf.logical_and(most == self._replicas, self._replicas > 1),
                                   tf.int64)),
        ]
        return tf.group(update, *bookkeeping)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self):
        return self._optimizer.variables()


@dataclasses.dataclass(frozen=True)
class Counters:
    """A reading of SharedState, as plain numbers."""

    global_step: int
    pushed: list[int]
    accepted: list[int]
    repeat_updates: int
    solo_updates: int

    @property
    def unused(self) -> list[int]:
        """Pushed gradients that no update averaged: dropped as stale, or left over at the end."""
        return [p - a for p, a in zip(self.pushed, self.accepted)]

    @classmethod
    def read(cls, session, state: SharedState, **run_kwargs) -> Counters:
        values = session.run(state, **run_kwargs)
        return cls(int(values.global_step), [int(v) for v in values.pushed],
                   [int(v) for v in values.accepted], int(values.repeat_updates),
                   int(values.solo_updates))


@dataclasses.dataclass(frozen=True)
class Verdict:
    synchronous: bool  # every update averaged R gradients from R distinct workers, as planned
    as_promised: bool  # the run behaved as its mode promises (sync: synchronous; async: async)
    line: str


def verify(counters: Counters, *, mode: str, target_steps: int,
           replicas_to_aggregate: int) -> Verdict:
    """Judges a run from its counters alone. Pure: the same counters give the same verdict."""
    c, r = counters, replicas_to_aggregate
    n = len(c.accepted)
    if mode == "async":
        total = sum(c.pushed)
        signature = c.global_step == total and c.accepted == c.pushed
        line = (f"asynchronous (--mode async): global_step {c.global_step} "
                f"{'=' if c.global_step == total else '!='} total local steps {total} "
                f"{c.pushed}; each update applied one worker's gradient alone")
        return Verdict(False, signature, line)

    problems = []
    if c.global_step != target_steps:
        problems.append(f"global_step {c.global_step} != {target_steps} planned")
    if sum(c.accepted) != r * c.global_step:
        problems.append(f"{sum(c.accepted)} gradients averaged, not {r} x {c.global_step}")
    if r == n:
        off = [w for w, a in enumerate(c.accepted) if a != c.global_step]
        if off:
            problems.append(f"contributions {c.accepted} are not {c.global_step} for every worker "
                            f"(off: worker{'s' if len(off) > 1 else ''} "
                            f"{', '.join(map(str, off))})")
    if c.repeat_updates:
        problems.append(f"{c.repeat_updates} of {c.global_step} updates averaged more than one "
                        f"gradient of the same worker")
    if c.solo_updates:
        problems.append(f"{c.solo_updates} updates were made of a single worker's gradients")
    if problems:
        return Verdict(False, False, "NOT synchronous: " + "; ".join(problems))
    if r == n:
        line = (f"synchronous: each of {c.global_step} updates averaged exactly one gradient "
                f"from each of {n} workers; contributions {c.accepted}")
    else:
        unused = ", ".join(f"w{w} {u}" for w, u in enumerate(c.unused))
        line = (f"synchronous with {n - r} backup worker{'s' if n - r > 1 else ''}: each of "
                f"{c.global_step} updates averaged exactly {r} fresh gradients from distinct "
                f"workers; {sum(c.unused)} gradients unused ({unused})")
    return Verdict(True, True, line)
