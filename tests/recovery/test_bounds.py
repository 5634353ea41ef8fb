"""Waits that TensorFlow itself does not bound, bounded: against a ps that never answers.

A "silent ps" is a socket that accepts TCP connections and never says a word: every probe of
the port succeeds, but gRPC never gets an answer, so TensorFlow's session creation and first
run wait without end. Each case runs in a thread the test can abandon, so a wait without a
bound fails the test instead of hanging it; a case that abandons a call runs in a pytest process
of its own (own_process, tests/conftest.py), which ends with it.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest
import tensorflow as tf

from guard import GUARD, within_guard
from sync_mnist.core import protocol
from sync_mnist.core import sessions
from sync_mnist.task import finish, waits
from sync_mnist.task.finish import report_done
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import TaskTimeout

tf1 = tf.compat.v1
TIMEOUT = 2.0  # the bound under test, in seconds


@pytest.fixture
def silent_ps():
    """A listening socket that never answers, and a worker server whose cluster has it as ps 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        ps = f"127.0.0.1:{s.getsockname()[1]}"
        cluster = tf.train.ClusterSpec({"ps": [ps],
                                        "worker": [f"127.0.0.1:{free_ports(1)[0]}"]})
        server = tf.distribute.Server(cluster, job_name="worker", task_index=0, start=True)
        yield ps, server


@pytest.mark.own_process
def test_reporting_done_to_a_silent_ps_ends_within_the_timeout(silent_ps):
    ps, server = silent_ps
    graph = tf.Graph()
    with graph.as_default():
        op = protocol.done_queue(0, 1).enqueue(0)
    error, seconds = within_guard(lambda: report_done(
        server.target, graph, op, sessions.session_config(["/job:ps", "/job:worker/task:0"]),
        timeout=TIMEOUT, me="worker 0", ps_hosts=(ps,)))

    assert isinstance(error, TaskTimeout), repr(error)
    assert str(error) == (f"worker 0: waited {TIMEOUT:g} s to report done to the ps ({ps}); "
                          "it did not answer")
    assert seconds < TIMEOUT + 5


# A worker's polls for the chief's model each run an op on the ps; against a ps that does not
# answer (a stopped process) the first one waited without end. Its bound covers its wait for
# the chief (TIMEOUT) and a poll (TIMEOUT).
@pytest.mark.own_process
@pytest.mark.parametrize("is_chief, bound, awaited", [
    (True, TIMEOUT, "the chief: waited {bound:g} s for the ps ({ps}) to keep, restore or "
                    "initialise the model"),
    (False, 2 * TIMEOUT, "waited {bound:g} s for the ps ({ps}) to answer while waiting for the "
                         "chief's model"),
], ids=["chief", "worker"])
def test_a_session_against_a_silent_ps_ends_within_its_bound(silent_ps, is_chief, bound,
                                                             awaited):
    ps, server = silent_ps
    graph = tf.Graph()

    def create():
        with graph.as_default():
            with tf1.device("/job:ps/task:0"):
                tf1.get_variable("v", initializer=tf.zeros([2]))
            sessions.monitored_session(
                server.target, is_chief=is_chief, hooks=[],
                config=sessions.session_config(["/job:ps", "/job:worker/task:0"]),
                timeout=TIMEOUT, ps_hosts=(ps,))

    error, seconds = within_guard(create)

    assert isinstance(error, TaskTimeout), repr(error)
    assert str(error) == awaited.format(bound=bound, ps=ps) + "; it did not answer"
    assert seconds < bound + 5


class _WaitsOnThePs(tf1.train.SessionRunHook):
    """A hook whose after_create_session runs an op that the ps never completes (a dequeue from
    an empty queue), as a checkpoint save does against a stopped ps."""

    def begin(self):
        with tf1.device("/job:ps/task:0"):
            self.take = tf1.FIFOQueue(1, tf.int64, shapes=[()], name="never_filled").dequeue()

    def after_create_session(self, session, coord):
        session.run(self.take)


@pytest.mark.own_process
def test_a_hook_that_waits_on_the_ps_at_session_creation_ends_within_the_timeout():
    from procs import local_cluster

    timeout = 10.0  # the session is made against a live ps within this bound too (a loaded machine)
    workers, cluster = local_cluster(1)
    graph = tf.Graph()
    ps = cluster.job_tasks("ps")[0]

    def create():
        with graph.as_default():
            with tf1.device("/job:ps/task:0"):
                tf1.get_variable("v", initializer=tf.zeros([2]))
            with sessions.monitored_session(
                    workers[0].target, is_chief=True, hooks=[_WaitsOnThePs()],
                    config=sessions.session_config(["/job:ps", "/job:worker/task:0"]),
                    timeout=timeout, ps_hosts=(ps,)):
                pass

    error, seconds = within_guard(create)

    assert isinstance(error, TaskTimeout), repr(error)
    assert str(error) == (f"waited {timeout:g} s for the ps ({ps}) in "
                          "_WaitsOnThePs.after_create_session; it did not answer")
    assert seconds < timeout + 5


PS_SERVER = """
import sys, tensorflow as tf
cluster = tf.train.ClusterSpec({"ps": [sys.argv[1]], "worker": [sys.argv[2]]})
tf.distribute.Server(cluster, job_name="ps", task_index=0, start=True)
print("serving", flush=True)
__import__("threading").Event().wait()
"""


@pytest.mark.own_process
def test_a_checkpoint_save_against_a_stopped_ps_ends_within_the_timeout(processes, tmp_path):
    import signal
    import sys

    # The session is made against a live ps within the same bound: longer than TIMEOUT, so a
    # loaded machine makes it in time.
    timeout = 10.0
    ps, me = (f"127.0.0.1:{p}" for p in free_ports(2))
    ps_proc = processes.start([sys.executable, "-c", PS_SERVER, ps, me], "ps")
    ps_proc.wait_for_line("^serving$", GUARD)
    cluster = tf.train.ClusterSpec({"ps": [ps], "worker": [me]})
    server = tf.distribute.Server(cluster, job_name="worker", task_index=0, start=True)
    graph = tf.Graph()
    with graph.as_default():
        with tf1.device("/job:ps/task:0"):
            tf1.get_variable("v", initializer=tf.zeros([2]))
        with tf1.device("/job:worker/task:0"):  # the step itself never touches the ps
            step = tf1.train.get_or_create_global_step()
            tick = tf1.assign_add(step, 1)
        sess = sessions.monitored_session(
            server.target, is_chief=True, hooks=[],
            config=sessions.session_config(["/job:ps", "/job:worker/task:0"]),
            timeout=timeout, checkpoint_dir=str(tmp_path), save_steps=1, ps_hosts=(ps,))
    try:
        os.kill(ps_proc.popen.pid, signal.SIGSTOP)  # its port still accepts connections
        error, seconds = within_guard(lambda: sess.run(tick))  # the hook saves after it
    finally:
        ps_proc.kill()

    assert isinstance(error, TaskTimeout), repr(error)
    assert str(error) == (f"the chief: waited {timeout:g} s for the ps ({ps}) to save the "
                          f"checkpoint of global_step 1 in {tmp_path}; it did not answer")
    assert seconds < timeout + 5


@pytest.mark.own_process
def test_a_done_report_the_ps_never_takes_after_a_verified_run_leaves_the_result_as_it_is(
        silent_ps, monkeypatch):
    # Seen in the chaos soak: the ps stopped (SIGSTOP) through the end of a run whose counters
    # the chief had already read and verified; its done report timed out and a verified run
    # ended 200. The ps ends by its own bound; the worker's result stays the run's.
    from types import SimpleNamespace

    from sync_mnist.core import config as config_lib
    from sync_mnist.task import report
    from sync_mnist.core.verdict import Verdict

    ps, server = silent_ps
    last_resorts = []
    monkeypatch.setattr(config_lib.TaskTimeout, "UNWIND_GRACE_SECS", 0.05)
    monkeypatch.setattr(config_lib.TaskTimeout, "last_resort",
                        lambda message, missing: last_resorts.append(message))
    graph = tf.Graph()
    with graph.as_default():
        op = protocol.done_queue(0, 1).enqueue(0)
    result = report.TaskResult(role="worker", index=0, mode="sync", synchronous=True)
    w = SimpleNamespace(  # the fields finish.say_done reads of a prepared worker
        server=server, graph=graph, g=SimpleNamespace(report_done=op),
        tf_config=sessions.session_config(["/job:ps", "/job:worker/task:0"]),
        config=SimpleNamespace(name="worker 0", cluster=SimpleNamespace(ps_hosts=(ps,)),
                               train=SimpleNamespace(timeout=TIMEOUT)))
    verdict = Verdict(True, True, "synchronous: 10 updates")

    said = []
    error, seconds = within_guard(lambda: said.append(finish.say_done(w, verdict)))
    for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
        timer.join(GUARD)  # an armed last resort would have fired by now

    assert error is None, repr(error)
    assert said == [False]  # the ps never took the report
    result.done_reported = said[0]
    assert report.exit_code_for(result) == config_lib.EXIT_OK
    assert last_resorts == []  # disarmed: it would have ended the process with 200
    assert seconds < TIMEOUT + 5


def test_a_read_at_the_finish_that_expires_says_what_it_waited_for():
    # Seen in the chaos soak: a ps stopped at the end cut a worker's final reading short, and
    # it ended 200 with "DeadlineExceededError: Graph execution error:", which names nothing.
    from sync_mnist.core.cluster import ClusterLayout, free_ports
    from sync_mnist.core.config import TaskTimeout

    ps = [f"127.0.0.1:{port}" for port in free_ports(2)]  # nothing listens: both are named
    layout = ClusterLayout(tuple(ps), ("localhost:2224",))
    # The guard every read of the finish runs under, on its own.
    with pytest.raises(TaskTimeout) as raised:
        with waits.awaiting("to evaluate the model", worker=1, timeout=20.0, side=None,
                            graph=tf.Graph(), cluster=layout):
            raise tf.errors.DeadlineExceededError(None, None, "Graph execution error:")
    assert str(raised.value) == (
        f"worker 1: waited 20 s for the ps tasks (ps 0 at {ps[0]}, ps 1 at {ps[1]}) to "
        f"evaluate the model; no answer; missing: ps 0 (nothing listens at {ps[0]}), ps 1 "
        f"(nothing listens at {ps[1]})")
    with pytest.raises(tf.errors.UnavailableError):  # only an expired bound is a timeout
        with waits.awaiting("to evaluate the model", worker=1, timeout=20.0, side=None,
                            graph=tf.Graph(), cluster=layout):
            raise tf.errors.UnavailableError(None, None, "Socket closed")
