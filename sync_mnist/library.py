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
ps 0 and the verdict computed from them, a readiness poll of 0.25 s, a bound on every wait
(session creation too: a ps that does not accept connections within `timeout` is an
Unreachable error naming it, "ps 0 at host:2222 is unreachable: ...", as under the trainer),
the finish barrier, and done-queues that let each ps exit. Every worker must run the same
number of steps (the question's loop does): each update then holds exactly one gradient of
each, and the verdict says whether it did.

A worker killed mid-run is restarted with the same command, and that is all: it rejoins as
under the trainer. At session creation it takes the token its predecessor left (its last
gradient already pushed) instead of pushing twice, and its loop starts again at its first step
(the same batches in the same order): the session passes over the train steps its predecessor
ran (the global step then, counted from 0), running the rest of each such fetch without the
train op, and pushes from the step the cluster waits for. A restarted chief keeps the model it
finds on the ps. So the loop must fetch the train op that minimize returned, and count its
steps from a global step of 0 (no Supervisor checkpoint restored). The others wait for the
restarted worker for at most `timeout`.
"""

from __future__ import annotations

import logging
import time
import types

import tensorflow as tf

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import membership, protocol, sessions, sync
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.bounded import bounded_call, closed_bounded, close_bounded
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskTimeout
from sync_mnist.task import join

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

TIMEOUT_SECS = 300.0  # the bound on every wait, as sync-mnist's --timeout
READY_POLL_SECS = sessions.READY_POLL_SECS  # where the Supervisor waited 30 s between polls


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
        """The Supervisor's session, each run bounded by `timeout`, and this worker's place.

        Each ps must accept connections within `timeout` (else Unreachable names it, as the
        trainer's does); the chief then keeps a model already on the ps (it was restarted into
        a running cluster) or initialises it, the others poll every 0.25 s; each part bounded.
        A worker restarted into a running cluster rejoins: see the module's docstring.
        """
        # Sync: TensorFlow's CreateSession waits without end for an absent ps; wait for each
        # (bounded) as the trainer's join does, so the error names the ps that is missing.
        for p, address in enumerate(self._layout.ps_hosts):
            cluster_lib.wait_reachable(address, f"ps {p}", self._timeout)
        # Sync: only the ps and this worker: no session waits for the other workers (a dead
        # or restarting one would stall it).
        config = sessions.session_config(self._layout.device_filters("worker", self._index))
        ps = ", ".join(self._layout.ps_hosts)
        if self._index == 0:
            sess = bounded_call(lambda: self._chief_session(sv, target, config), self._timeout,
                                f"the chief: waited {self._timeout:g} s for the ps ({ps}) to "
                                "keep or initialise the model")
        else:
            sess = self._worker_session(sv, target, config, ps)
        self._sess = _BoundedRuns(sess, self._bounded, self._index, self._training.train_op)
        self._sess.pass_over(self._position(sess))
        return self._sess

    def _chief_session(self, sv: tf1.train.Supervisor, target: str, config):
        # Sync: a chief restarted into a running cluster finds the model on the ps; the
        # Supervisor would initialise it again under the other workers' feet. It keeps it, as
        # the trainer's chief does (sessions._ChiefSessionManager). A chief initialises every
        # variable at once, `published` on ps 0 among them: that one tells.
        with closed_bounded(tf1.Session(target, config=config)) as probe:
            kept = probe.run(self._members.published_ready, options=self._bounded)
        if not kept:
            return sv.prepare_or_wait_for_session(target, config=config,
                                                  max_wait_secs=self._timeout)
        log.warning("worker 0: the model is already on the ps (a chief restarted into a "
                    "running cluster): keeping it")
        return self._manager(sv, self.chief_init_op).wait_for_session(
            target, config=config, max_wait_secs=self._timeout)

    def _worker_session(self, sv: tf1.train.Supervisor, target: str, config, ps: str):
        manager = self._manager(sv, self.local_step_init_op)
        # Each of its polls runs an op on the ps: bounded whole, as the trainer's
        # (sessions._PromptWorkerSessionCreator).
        bound = 2 * self._timeout
        sess = bounded_call(
            lambda: manager.wait_for_session(target, config=config,
                                             max_wait_secs=self._timeout),
            bound, f"waited {bound:g} s for the ps ({ps}) to answer while waiting for the "
                   "chief's model")
        if sess is None:
            raise TaskTimeout(f"worker {self._index}: waited {self._timeout:g} s for the "
                              f"chief ({self._layout.address('worker', 0)}) to initialise "
                              "the model")
        return sess

    def _manager(self, sv: tf1.train.Supervisor, local_init_op) -> tf1.train.SessionManager:
        return tf1.train.SessionManager(
            local_init_op=local_init_op, ready_op=sv.ready_op,
            ready_for_local_init_op=self.ready_for_local_init_op,
            graph=tf1.get_default_graph(), recovery_wait_secs=READY_POLL_SECS)

    def _position(self, sess) -> int:
        """The train steps of the loop this worker's predecessor ran: 0 for a worker that has
        none; in a cluster it was restarted into, the global step, or the token it takes
        when its predecessor left one (join.rejoin, as the trainer's worker)."""
        # Sync: without a predecessor the global step is 0 here, as no update can come
        # before this worker's first gradient (every worker's loop counts from 0).
        step = int(sess.run(self._state.global_step, options=self._bounded))
        token = join.rejoin(sess, types.SimpleNamespace(training=self._training),
                            self._index, self._bounded, self._timeout)
        position = step if token is None else token
        if position:
            log.warning("worker %d: rejoined a running cluster at global_step %d%s; passing "
                        "over the first %d train steps of the loop (my predecessor ran them)",
                        self._index, step, "" if token is None else
                        f", taking my predecessor's token {token} without pushing again",
                        position)
        return position

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
    """A session whose every run is bounded (RunOptions' timeout), unless given options, and
    that passes over the train steps a restarted worker's predecessor ran."""

    def __init__(self, sess, bounded: tf1.RunOptions, index: int, train_op: tf.Tensor):
        self._sess, self._bounded, self._index = sess, bounded, index
        self._train_op, self._passed, self._position = train_op, 0, 0

    def pass_over(self, position: int) -> None:
        """The loop's first `position` runs that fetch the train op run without it."""
        self._position = position

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        if self._passed < self._position and any(
                f is self._train_op for f in tf.nest.flatten(fetches)):
            # Sync: a restarted worker's loop starts at its first step, but its predecessor
            # pushed for the first `position` updates. Fed, the train op is not run (no push)
            # and gives the token that step was handed; the other fetches run as asked.
            self._passed += 1
            feed_dict = {**(feed_dict or {}), self._train_op: self._passed}
        try:
            return self._sess.run(fetches, feed_dict, options=options or self._bounded,
                                  run_metadata=run_metadata)
        except tf.errors.DeadlineExceededError:
            raise TaskTimeout(f"worker {self._index}: a run waited "
                              f"{self._bounded.timeout_in_ms / 1000:g} s (a peer is missing, "
                              "dead or stopped)") from None

    def close(self) -> None:
        close_bounded(self._sess.close, self._sess)

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
