"""In-process cluster tests: exact SyncReplicasOptimizer arithmetic and the counters.

Modelled on TensorFlow's sync_replicas_optimizer_test: an in-process cluster, one graph per
worker, constant gradients, and exact arithmetic on the averaged update. Workers run in
threads; every run has a timeout so a protocol bug fails the test instead of hanging it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from procs import local_cluster
from sync_mnist.core import sessions, sync
from sync_mnist.core import verdict as verdict_lib

tf1 = tf.compat.v1
TIMEOUT_MS = 15_000
LEARNING_RATE = 2.0
# Worker w's loss is sum(GRADS[w] * x), so its gradient is the constant GRADS[w].
GRADS = [np.float32(0.1), np.float32(0.3), np.float32(0.5), np.float32(0.7)]


class _Worker:
    def __init__(self, cluster, index, num_workers, replicas, mode="sync", wire_dtype="float32"):
        self.index = index
        self.graph = tf.Graph()
        with self.graph.as_default(), tf1.device(tf1.train.replica_device_setter(
                worker_device=f"/job:worker/task:{index}", cluster=cluster)):
            self.state = sync.build_shared_state(num_workers)
            self.x = tf1.get_variable("x", initializer=tf.zeros([2]))
            loss = tf.reduce_sum(GRADS[index] * self.x)
            self.training = sync.build_train_op(
                loss, self.state, tf1.train.GradientDescentOptimizer(LEARNING_RATE),
                worker_index=index, num_workers=num_workers, replicas_to_aggregate=replicas,
                is_chief=index == 0, mode=mode, wire_dtype=wire_dtype)
        # SyncReplicasOptimizer's per-worker local step: the step this worker's next push is for.
        self.local_step = next((v for v in self.graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)
                                if "sync_rep_local_step" in v.name), None)
        self.tokens: list[int] = []
        self.error: BaseException | None = None

    def run(self, target, steps, *, stop_on_token=False, before_push=None, hooks=()):
        self.target = target
        try:
            with self.graph.as_default(), sessions.monitored_session(
                    target, is_chief=self.index == 0, hooks=[*self.training.hooks, *hooks],
                    config=sessions.session_config(["/job:ps", f"/job:worker/task:{self.index}"]),
                    timeout=60) as sess:
                options = tf1.RunOptions(timeout_in_ms=TIMEOUT_MS)

                def run_step(local):
                    if before_push:
                        before_push(self)
                    self.tokens.append(int(sess.run(self.training.train_op, options=options)))
                    return self.tokens[-1]

                start = 0 if self.local_step is None else int(sess.run(self.local_step))
                # Stopping on the token, the planned count must not matter: make it wrong.
                planned = 10 * steps if stop_on_token else steps
                self.local_steps = sync.train_loop(run_step, start_step=start, planned=planned,
                                                   target=steps, stop_on_token=stop_on_token)
        except BaseException as e:  # reported by the test's main thread
            self.error = e

    def read(self, target):
        with self.graph.as_default(), tf1.Session(target) as sess:
            return verdict_lib.Counters.read(sess, self.state), sess.run(self.x)


def _train(num_workers, replicas, steps, mode="sync", before_push=None, chief_hooks=(),
           wire_dtype="float32"):
    servers, cluster = local_cluster(num_workers)
    workers = [_Worker(cluster, i, num_workers, replicas, mode, wire_dtype)
               for i in range(num_workers)]
    # The production stop rule (worker.run_worker): in sync mode, stop once the token reaches
    # the target; the local count matters only in async mode.
    threads = [threading.Thread(target=w.run, args=(servers[w.index].target, steps),
                                kwargs={"before_push": before_push,
                                        "stop_on_token": mode == "sync",
                                        "hooks": chief_hooks if w.index == 0 else ()},
                                daemon=True)
               for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT_MS / 1000 * 2)
        assert not t.is_alive(), "a worker thread is still blocked"
    for w in workers:
        assert w.error is None, f"worker {w.index} failed: {w.error!r}; tokens {[v.tokens for v in workers]}"
    counters, x = workers[0].read(servers[0].target)
    return workers, counters, x


def _as_sent(gradient: np.float32, wire_dtype: str) -> np.float32:
    """A gradient as the ps receives it: rounded to bfloat16 (to nearest) with --wire-dtype."""
    if wire_dtype == "float32":
        return gradient
    return np.float32(gradient.astype(tf.bfloat16.as_numpy_dtype))


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_lockstep_update_averages_one_gradient_per_worker(wire_dtype):
    steps = 3
    workers, counters, x = _train(num_workers=3, replicas=3, steps=steps, wire_dtype=wire_dtype)

    # global_step advances once per 3 replica steps: 9 pushes, 3 updates.
    assert counters.global_step == steps
    assert counters.pushed == [steps] * 3
    assert counters.accepted == [steps] * 3
    assert counters.repeat_updates == 0 and counters.solo_updates == 0
    assert counters.over_aggregated == 0
    # Each update is 0 - mean(0.1, 0.3, 0.5) * 2.0, applied `steps` times. In bfloat16 each
    # gradient crosses rounded (0.1 as 0.10009765625), and the ps averages and applies the
    # rounded values in float32: the mean differs from float32's by 1e-3, far above rtol.
    sent = [_as_sent(g, wire_dtype) for g in GRADS[:3]]
    per_update = (sent[0] + sent[1] + sent[2]) / 3 * LEARNING_RATE
    np.testing.assert_allclose(x, [-per_update * steps] * 2, rtol=1e-6)
    if wire_dtype == "bfloat16":
        exact = (GRADS[0] + GRADS[1] + GRADS[2]) / 3 * LEARNING_RATE
        assert abs(per_update - exact) > 1e-4 * exact
        accumulators = [op for op in workers[0].graph.get_operations()
                        if op.type.endswith("ConditionalAccumulator")]
        assert accumulators and all(op.get_attr("dtype") == tf.float32 for op in accumulators)
    # The token a worker gets back is the global step after the update its push joined; each
    # stopped on the token that reached the target, after exactly `steps` local steps.
    for w in workers:
        assert w.tokens == [1, 2, 3]
        assert w.local_steps == steps
    verdict = verdict_lib.verify(counters, mode="sync", target_steps=steps, replicas_to_aggregate=3)
    assert verdict.synchronous and verdict.as_promised, verdict.line


class _AbortOnce(tf1.train.SessionRunHook):
    """Raises AbortedError once, after the chief's `at`-th step: a transient gRPC failure, which
    MonitoredSession answers by closing the session and making a new one."""

    def __init__(self, at):
        self.at, self.runs = at, 0

    def after_run(self, run_context, run_values):
        self.runs += 1
        if self.runs == self.at:
            raise tf.errors.AbortedError(None, None, "injected: a transient failure")


def test_a_chief_session_recovered_mid_run_keeps_the_cluster_in_lockstep():
    # The chief's MonitoredSession recovers from AbortedError by closing its session, and the
    # stock queue runner then closes the cluster-wide token queue on the ps: every other
    # worker's next token wait ended in OutOfRangeError (which MonitoredSession swallows).
    steps = 8
    workers, counters, _ = _train(num_workers=3, replicas=3, steps=steps,
                                  chief_hooks=[_AbortOnce(at=3)])
    # The chief's third run (its second step, token 2) raised after it ran, so that token never
    # reached the test; MonitoredSession ran the step again in the new session: token 3.
    assert workers[0].tokens == [1, *range(3, steps + 1)]
    for w in workers[1:]:
        assert w.tokens == list(range(1, steps + 1)), (w.index, w.tokens)
    assert counters.global_step == steps and counters.accepted == [steps] * 3
    verdict = verdict_lib.verify(counters, mode="sync", target_steps=steps, replicas_to_aggregate=3)
    assert verdict.synchronous, verdict.line


def test_async_mode_shows_the_async_signature():
    steps = 4
    _, counters, x = _train(num_workers=3, replicas=3, steps=steps, mode="async")

    # Every push is an update of its own: global_step is the total of local steps.
    assert counters.global_step == 3 * steps
    assert counters.pushed == counters.accepted == [steps] * 3
    expected = -(GRADS[0] + GRADS[1] + GRADS[2]) * steps * LEARNING_RATE
    np.testing.assert_allclose(x, [expected] * 2, rtol=1e-5)
    verdict = verdict_lib.verify(counters, mode="async", target_steps=steps, replicas_to_aggregate=3)
    assert not verdict.synchronous and verdict.as_promised, verdict.line


def test_backup_worker_updates_average_r_fresh_gradients_and_drop_the_stale_one():
    target, replicas = 4, 2

    straggler_joined = threading.Event()

    def straggle(worker):
        # Workers 0 and 1 start once worker 2 has joined. Worker 2 pushes only once the update
        # its local step points at has been made by the other two, so each of its gradients is
        # stale on arrival: dropped, never averaged.
        if worker.index != 2:
            assert straggler_joined.wait(TIMEOUT_MS / 1000), "worker 2 never joined"
            return
        straggler_joined.set()
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        with worker.graph.as_default(), tf1.Session(worker.target) as s:
            while time.monotonic() < deadline:
                step, mine = s.run([worker.state.global_step, worker.local_step])
                if step > mine or step >= target:
                    return
                time.sleep(0.01)  # polling a condition, bounded by the deadline
        raise AssertionError("global_step never passed worker 2's local step")

    workers, counters, x = _train(num_workers=3, replicas=replicas, steps=target,
                                  before_push=straggle)

    assert counters.global_step == target
    # Every update averaged at least R = 2 fresh gradients, none of them worker 2's; those that
    # averaged more are counted.
    assert sum(counters.accepted) >= replicas * target
    assert (sum(counters.accepted) > replicas * target) == (counters.over_aggregated > 0)
    assert counters.accepted[2] == 0
    # Worker 2 pushed every step, and every one of its gradients is counted as unused.
    assert counters.pushed[2] == workers[2].local_steps >= 1
    assert counters.unused[2] == counters.pushed[2]
    verdict = verdict_lib.verify(counters, mode="sync", target_steps=target,
                          replicas_to_aggregate=replicas)
    assert verdict.synchronous, verdict.line
    assert "synchronous with 1 backup worker" in verdict.line
    assert f"w2 {counters.pushed[2]}" in verdict.line
