"""Your own TF1 training loop, synchronous: the package's machinery as a library.

For a program that keeps its loop, its graph and its tf.train.Supervisor, as the question's
does (examples/question_library.py is the question's program with 6 lines changed):

    import sync_mnist.library as sml

    if job == "ps":
        sml.serve(server, cluster)                      # was: server.join()
    ...
    opt = sml.SyncOptimizer(opt, cluster, task_index)   # was: SyncReplicasOptimizer(opt, ...)
    train_op = opt.minimize(loss, global_step=global_step)
    ...                                                 # the Supervisor as before
    sess = opt.prepare_or_wait_for_session(sv, server.target)  # was: sv.prepare_or_...(target)
    ...                                                 # the loop as before
    print(opt.finish(sess))                             # the verdict, before sv.stop()

What it adds: tokens of each worker's own and none preloaded (num_tokens=0), the counters on
ps 0 and the verdict computed from them, a readiness poll of 0.25 s, a bound on every run of
the session, the finish barrier, and done-queues that let each ps exit. Every worker must run
the same number of steps (the question's loop does): each update then holds exactly one
gradient of each, and the verdict says whether it did.
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf

from sync_mnist.core import membership, protocol, sync
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskTimeout

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

TIMEOUT_SECS = 300.0  # the bound on every wait, as sync-mnist's --timeout
READY_POLL_SECS = 0.25  # where the Supervisor waited 30 s between polls


def _layout(cluster: tf1.train.ClusterSpec) -> ClusterLayout:
    spec = cluster.as_dict()
    return ClusterLayout(tuple(spec["ps"]), tuple(spec["worker"]))


class SyncOptimizer:
    """SyncReplicasOptimizer(optimizer, N, N) for worker `task_index` of `cluster`, with owned
    tokens and the counters; minimize, the init ops and the chief's queue runner as its."""

    def __init__(self, optimizer: tf1.train.Optimizer, cluster: tf1.train.ClusterSpec,
                 task_index: int, timeout: float = TIMEOUT_SECS):
        self._optimizer, self._index, self._timeout = optimizer, task_index, timeout
        self._layout = _layout(cluster)
        self._bounded = tf1.RunOptions(timeout_in_ms=int(timeout * 1000))
        self._training = None

    def minimize(self, loss: tf.Tensor, global_step: tf.Variable) -> tf.Tensor:
        """The train op: pushes this worker's gradient, and returns the token it is handed
        (the global step after the update that gradient joined)."""
        n = self._layout.num_workers
        with tf1.device("/job:ps/task:0"):  # Sync: shared by name, as every task builds them
            self._state = sync.build_shared_state(n, global_step)
            self._members = membership.build_membership(n, {"workers": n, "setup": "library"})
            self._done = [tf.group(protocol.done_queue(p, n).enqueue(self._index))
                          for p in range(self._layout.num_ps)]
        self._training = sync.build_train_op(
            loss, self._state, self._optimizer, worker_index=self._index, num_workers=n,
            replicas_to_aggregate=n, is_chief=self._index == 0, num_tokens=0,
            last_push=self._members.last_push)
        return self._training.train_op

    # What SyncReplicasOptimizer offers the Supervisor, from the one inside.
    def get_init_tokens_op(self) -> tf.Operation:
        return tf.no_op(name="no_init_tokens")  # Sync: num_tokens=0, the fix: none preloaded

    def get_chief_queue_runner(self):
        return self._training.optimizer.get_chief_queue_runner()  # one that closes no queue

    @property
    def chief_init_op(self):
        return self._training.optimizer.chief_init_op

    @property
    def local_step_init_op(self):
        return self._training.optimizer.local_step_init_op

    @property
    def ready_for_local_init_op(self):
        return self._training.optimizer.ready_for_local_init_op

    def prepare_or_wait_for_session(self, sv: tf1.train.Supervisor, target: str):
        """The Supervisor's session, each run bounded by `timeout`. The chief initialises;
        the others poll every 0.25 s, for at most `timeout`."""
        if self._index == 0:
            sess = sv.prepare_or_wait_for_session(target, max_wait_secs=self._timeout)
        else:
            manager = tf1.train.SessionManager(
                local_init_op=self.local_step_init_op, ready_op=sv.ready_op,
                ready_for_local_init_op=self.ready_for_local_init_op,
                graph=tf1.get_default_graph(), recovery_wait_secs=READY_POLL_SECS)
            sess = manager.wait_for_session(target, max_wait_secs=self._timeout)
            if sess is None:
                raise TaskTimeout(f"worker {self._index}: waited {self._timeout:g} s for the "
                                  f"chief ({self._layout.address('worker', 0)}) to initialise "
                                  "the model")
        self._sess = _BoundedRuns(sess, self._bounded, self._index)
        return self._sess

    def finish(self, sess) -> str:
        """After this worker's last step: the finish barrier, the verdict from the counters,
        then this worker's entry in every ps's done-queue. Closes the session (the chief's
        queue runner then ends, so sv.stop() returns). Returns the verdict's line."""
        run = sess.run
        lost = membership.finish_barrier(run, self._members, index=self._index,
                                         cluster=self._layout, timeout=self._timeout, log=log)
        counters = verdict_lib.Counters.read(sess, self._state, options=self._bounded)
        verdict = verdict_lib.verify(counters, mode="sync", target_steps=counters.global_step,
                                     replicas_to_aggregate=self._layout.num_workers, lost=lost)
        for done in self._done:
            try:
                run(done)
            except (tf.errors.UnavailableError, tf.errors.AbortedError):
                pass  # Sync: that ps took the last entry and exited: nothing left to tell it
        sess.close()
        return f"verdict: {verdict.line}"


class _BoundedRuns:
    """A session whose every run is bounded (RunOptions' timeout), unless given options."""

    def __init__(self, sess, bounded: tf1.RunOptions, index: int):
        self._sess, self._bounded, self._index = sess, bounded, index

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        try:
            return self._sess.run(fetches, feed_dict, options=options or self._bounded,
                                  run_metadata=run_metadata)
        except tf.errors.DeadlineExceededError:
            raise TaskTimeout(f"worker {self._index}: a run waited "
                              f"{self._bounded.timeout_in_ms / 1000:g} s (a peer is missing, "
                              "dead or stopped)") from None

    def close(self) -> None:
        self._sess.close()

    def __getattr__(self, name):
        return getattr(self._sess, name)


def serve(server, cluster: tf1.train.ClusterSpec, task_index: int = 0,
          timeout: float = TIMEOUT_SECS) -> None:
    """In place of server.join(): serves until every worker has put its entry in this ps's
    done-queue (finish), then returns. Raises TaskTimeout past `timeout` without an entry."""
    layout = _layout(cluster)
    n = layout.num_workers
    graph = tf.Graph()
    with graph.as_default():
        queue = protocol.done_queue(task_index, n)
        size = queue.size()
        take = queue.dequeue_many(size)  # Sync: never wait inside a dequeue (ps.py says why)
    config = tf1.ConfigProto(device_filters=[f"/job:ps/task:{task_index}"])
    poll = tf1.RunOptions(timeout_in_ms=int(timeout * 1000))
    done, since = 0, time.monotonic()
    with tf1.Session(server.target, graph=graph, config=config) as sess:
        while done < n:
            taken = len(sess.run(take, options=poll))
            if taken:
                done, since = done + taken, time.monotonic()
            elif time.monotonic() - since > timeout:
                raise TaskTimeout(f"ps {task_index}: {done} of {n} workers reported done; "
                                  f"none more for {timeout:g} s")
            else:
                time.sleep(READY_POLL_SECS)
