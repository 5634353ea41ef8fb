"""A parameter server's life, and the queues that end a run cleanly.

The question's ps called `server.join()`, which never returns. Here each ps owns a done-queue;
every worker enqueues its index there when it has finished, and the ps exits once it has
drained one entry per worker. While it waits, a watchdog bounds the wait: if global_step has
not moved and no worker has reported done for --timeout seconds, the ps gives up and says why.
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf

from sync_mnist import report, session, sync
from sync_mnist.config import TaskConfig

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

POLL_SECS = 1.0  # how often the ps checks for progress while it waits for done entries


class TaskTimeout(RuntimeError):
    """A bounded wait expired; the message says what was awaited and what was seen."""


def done_queue(ps_index: int, num_workers: int):
    """Worker -> ps 'I have finished' messages. Shared by name between the graphs of all tasks."""
    with tf1.device(f"/job:ps/task:{ps_index}"):
        return tf1.FIFOQueue(num_workers, tf.int32, shapes=[], name=f"done_queue_{ps_index}",
                             shared_name=f"done_queue_{ps_index}")


def finished_queue(num_workers: int):
    """A barrier on ps 0: each worker enqueues once after its last step and waits for all N.

    Queues, unlike variables, are not checkpointed, so a resumed run starts with an empty barrier.
    """
    with tf1.device("/job:ps/task:0"):
        return tf1.FIFOQueue(num_workers, tf.int32, shapes=[], name="finished_queue",
                             shared_name="finished_queue")


def build_shared_graph(config: TaskConfig) -> tuple[sync.SharedState, list, object]:
    """global_step and counters (placed exactly as the workers place them) plus the queues."""
    cluster = config.cluster.spec()
    with tf1.device(tf1.train.replica_device_setter(cluster=cluster)):
        state = sync.build_shared_state(config.cluster.num_workers)
    n = config.cluster.num_workers
    return state, [done_queue(p, n) for p in range(config.cluster.num_ps)], finished_queue(n)


def run_ps(config: TaskConfig, *, server=None) -> report.TaskResult:
    """Serves variables until every worker has reported done; returns the counters it holds."""
    started = time.monotonic()
    n, timeout = config.cluster.num_workers, config.train.timeout
    if server is None:
        server = tf.distribute.Server(config.cluster.spec(), job_name="ps",
                                      task_index=config.index, start=True)
    result = report.TaskResult(role="ps", index=config.index, mode=config.train.mode,
                               replicas_to_aggregate=config.train.aggregate(n))
    graph = tf.Graph()
    with graph.as_default():
        state, done_queues, _ = build_shared_graph(config)
        take_done = done_queues[config.index].dequeue()
    poll = tf1.RunOptions(timeout_in_ms=int(POLL_SECS * 1000))
    log.info("serving %s; waiting for %d workers to report done (timeout %g s without progress)",
             config.cluster.address("ps", config.index), n, timeout)
    done: list[int] = []
    last_step, last_progress = None, time.monotonic()
    with tf1.Session(server.target, graph=graph,
                     config=session.session_config(["/job:ps"])) as sess:
        while len(done) < n:
            try:
                done.append(int(sess.run(take_done, options=poll)))
                last_progress = time.monotonic()
                log.info("worker %d reported done (%d of %d)", done[-1], len(done), n)
                continue
            except tf.errors.DeadlineExceededError:
                pass
            step = _read_global_step(sess, state)
            if step != last_step:
                last_step, last_progress = step, time.monotonic()
            idle = time.monotonic() - last_progress
            if idle > timeout:
                seen = "no worker has initialised the model" if step is None else (
                    f"global_step stuck at {step}")
                raise TaskTimeout(
                    f"ps {config.index}: no progress for {idle:.0f} s ({seen}; workers done: "
                    f"{sorted(done) or 'none'} of {n})")
        counters = sync.Counters.read(sess, state, options=poll)
    result.global_step = counters.global_step
    result.contributions, result.pushed = counters.accepted, counters.pushed
    result.dropped = counters.unused
    result.train_s = time.monotonic() - started
    log.info("all %d workers done; global_step=%d contributions=%s; exiting", n,
             counters.global_step, counters.accepted)
    return result


def _read_global_step(sess, state: sync.SharedState) -> int | None:
    """global_step, or None while nobody has initialised it yet."""
    try:
        return int(sess.run(state.global_step,
                            options=tf1.RunOptions(timeout_in_ms=int(POLL_SECS * 1000))))
    except (tf.errors.FailedPreconditionError, tf.errors.DeadlineExceededError,
            tf.errors.UnavailableError):
        return None

