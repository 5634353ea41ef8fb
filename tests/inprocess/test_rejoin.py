"""In-process: a worker that dies after pushing, and its successor that rejoins the lockstep.

A kill lands where it lands; this test puts the dead worker exactly in the awkward state. Its
push for the next update is in the accumulators, but it never takes its token: a step with a
short timeout does just that, the timeout cancelling only the wait for the token. Once the
chief's push completes the update, the token is left in the queue. A successor that pushed
again would put two of its gradients into one update; `rejoin` takes the token
instead, and the counters end exactly as in an undisturbed run.
"""

from __future__ import annotations

import threading
import types

import pytest
import tensorflow as tf

from procs import local_cluster
from sync_mnist.core import membership, sessions, sync
from sync_mnist.task.join import rejoin
from sync_mnist.task.lockstep import StepCutShort, no_silent_end
from sync_mnist.core import verdict as verdict_lib

tf1 = tf.compat.v1
TIMEOUT_MS = 15_000
N = 2


def _worker_graph(cluster, index):
    graph = tf.Graph()
    with graph.as_default():
        setter = tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{index}",
                                                 cluster=cluster)
        with tf1.device(setter):
            state = sync.build_shared_state(N)
            x = tf1.get_variable("x", initializer=tf.zeros([2]))
            loss = tf.reduce_sum((index + 1.0) * x)
        members = membership.build_membership(N, {"workers": N, "ps": 1})
        with tf1.device(setter):
            training = sync.build_train_op(
                loss, state, tf1.train.GradientDescentOptimizer(1.0), worker_index=index,
                num_workers=N, replicas_to_aggregate=N, is_chief=index == 0,
                last_push=members.last_push)
    return types.SimpleNamespace(graph=graph, state=state, members=members, training=training)


def _session(server, g, index):
    with g.graph.as_default():
        return sessions.monitored_session(
            server.target, is_chief=index == 0, hooks=g.training.hooks,
            config=sessions.session_config(["/job:ps", f"/job:worker/task:{index}"]),
            timeout=30, transient=g.members.transient)


def _in_lockstep(steps, *runs):
    """Runs each worker's `run()` `steps` times, all workers at once (R = N needs them all)."""
    errors = []

    def loop(run):
        try:
            for _ in range(steps):
                run()
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=loop, args=(run,), daemon=True) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_MS / 1000 * 2)
        assert not t.is_alive(), "a worker is still blocked"
    assert not errors, errors


@pytest.mark.parametrize("update_came_first", [True, False],
                         ids=["token-left-in-the-queue", "gradient-waiting-for-the-update"])
def test_successor_of_a_worker_that_pushed_but_never_took_its_token_rejoins_exactly(
        update_came_first):
    servers, cluster = local_cluster(N)
    bounded = tf1.RunOptions(timeout_in_ms=TIMEOUT_MS)
    chief_g, first_g = _worker_graph(cluster, 0), _worker_graph(cluster, 1)
    chief, first = _session(servers[0], chief_g, 0), _session(servers[1], first_g, 1)

    def chief_step():
        return chief.run(chief_g.training.train_op, options=bounded)

    _in_lockstep(3, chief_step, lambda: first.run(first_g.training.train_op, options=bounded))
    # Worker 1 pushes for update 4 and dies waiting for its token.
    with pytest.raises(tf.errors.DeadlineExceededError):
        first.run(first_g.training.train_op, options=tf1.RunOptions(timeout_in_ms=500))
    first.close()
    if update_came_first:
        assert chief_step() == 4  # the chief's push completes update 4; the token is left
        expected = (4, [3, 3], 1)
    else:
        expected = (3, [2, 3], 0)  # worker 1's gradient waits for the chief's

    successor_g = _worker_graph(cluster, 1)
    successor = _session(servers[1], successor_g, 1)
    # join.rejoin: the step of a worker's join that these tests drive alone.
    with successor_g.graph.as_default(), tf1.Session(servers[1].target) as side:
        before = side.run([successor_g.state.global_step, successor_g.members.last_push,
                           successor_g.training.tokens_waiting])
        assert (int(before[0]), list(before[1]), int(before[2])) == expected
        if update_came_first:
            token = rejoin(side, successor_g, 1, bounded, TIMEOUT_MS / 1000)
        else:
            # The successor waits for update 4 without pushing; the chief's push makes it.
            taken = []
            rejoining = threading.Thread(target=lambda: taken.append(rejoin(
                side, successor_g, 1, bounded, TIMEOUT_MS / 1000)), daemon=True)
            rejoining.start()
            assert chief_step() == 4
            rejoining.join(TIMEOUT_MS / 1000)
            token = taken[0] if taken else None
    assert token == 4  # taken, not pushed for again

    _in_lockstep(2, chief_step,
                 lambda: successor.run(successor_g.training.train_op, options=bounded))
    with chief_g.graph.as_default(), tf1.Session(servers[0].target) as side:
        counters = verdict_lib.Counters.read(side, chief_g.state)
        waiting = int(side.run(chief_g.training.tokens_waiting))
    # Exactly as if nothing had happened: one gradient per worker per update, nothing dropped.
    assert counters.global_step == 6
    assert counters.accepted == counters.pushed == [6, 6]
    assert counters.repeat_updates == counters.over_aggregated == 0
    assert waiting == 0
    verdict = verdict_lib.verify(counters, mode="sync", target_steps=6, replicas_to_aggregate=N)
    assert verdict.synchronous, verdict.line
    for s in (chief, successor):
        s.close()


def test_a_dead_workers_token_waits_in_its_own_queue_for_its_successor():
    # Worker 1 dies waiting for its token, and the chief's push completes the update, as above.
    # With one queue for the cluster, the chief's next step took worker 1's token at once
    # ("global_step went back") and pushed twice into every update after. Tokens are owned now:
    # the chief waits, and worker 1's successor finds its predecessor's token in its queue.
    servers, cluster = local_cluster(N)
    bounded = tf1.RunOptions(timeout_in_ms=TIMEOUT_MS)
    chief_g, first_g = _worker_graph(cluster, 0), _worker_graph(cluster, 1)
    chief, first = _session(servers[0], chief_g, 0), _session(servers[1], first_g, 1)
    _in_lockstep(3, lambda: chief.run(chief_g.training.train_op, options=bounded),
                 lambda: first.run(first_g.training.train_op, options=bounded))
    with pytest.raises(tf.errors.DeadlineExceededError):
        first.run(first_g.training.train_op, options=tf1.RunOptions(timeout_in_ms=500))
    first.close()
    assert chief.run(chief_g.training.train_op, options=bounded) == 4

    # The chief pushes for update 5, and no token comes: update 5 needs worker 1.
    with pytest.raises(tf.errors.DeadlineExceededError):
        chief.run(chief_g.training.train_op, options=tf1.RunOptions(timeout_in_ms=1000))

    successor_g = _worker_graph(cluster, 1)
    successor = _session(servers[1], successor_g, 1)
    # join.rejoin: the step of a worker's join that these tests drive alone.
    with successor_g.graph.as_default(), tf1.Session(servers[1].target) as side:
        reading = side.run(successor_g.training.rejoin_reading)
        assert (int(reading[0]), list(reading[1]), int(reading[2])) == (4, [4, 3], 1)
        assert rejoin(side, successor_g, 1, bounded, TIMEOUT_MS / 1000) == 4
    # The successor's push for update 5 joins the chief's, which waited.
    assert successor.run(successor_g.training.train_op, options=bounded) == 5
    with chief_g.graph.as_default(), tf1.Session(servers[0].target) as side:
        counters = verdict_lib.Counters.read(side, chief_g.state)
    assert counters.global_step == 5 and counters.accepted == [5, 5]
    assert counters.repeat_updates == counters.solo_updates == 0
    verdict = verdict_lib.verify(counters, mode="sync", target_steps=5, replicas_to_aggregate=N)
    assert verdict.synchronous, verdict.line
    for s in (chief, successor):
        s.close()


def test_a_step_that_meets_a_closed_queue_is_an_error_not_the_end_of_training():
    # MonitoredSession swallows OutOfRangeError at its exit; inside no_silent_end it is an error
    # with its own message, so no worker reports done for a run it did not finish.
    with tf.Graph().as_default():
        queue = tf1.FIFOQueue(1, tf.int64, shapes=[()])
        close, take = queue.close(), queue.dequeue()
        with pytest.raises(StepCutShort, match=r"^worker 1: a step ended in "
                                                      r"OutOfRangeError \(a queue on the ps"):
            with tf1.train.MonitoredSession() as sess, no_silent_end("worker 1"):
                sess.run(close)
                sess.run(take)
        with tf1.train.MonitoredSession() as sess:  # what it did before: nothing at all
            sess.run(close)
            sess.run(take)
