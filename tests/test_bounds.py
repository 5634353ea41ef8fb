"""Waits that TensorFlow itself does not bound, bounded: against a ps that never answers.

A "silent ps" is a socket that accepts TCP connections and never says a word: every probe of
the port succeeds, but gRPC never gets an answer, so TensorFlow's session creation and first
run wait without end. Each case runs in a thread the test can abandon, so a wait without a
bound fails the test instead of hanging it.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import tensorflow as tf

from sync_mnist import protocol
from sync_mnist import session, worker
from sync_mnist.cluster import free_ports
from sync_mnist.config import TaskTimeout

tf1 = tf.compat.v1
pytestmark = pytest.mark.cluster

TIMEOUT = 2.0  # the bound under test, in seconds
GUARD = 30.0  # past this, the wait is taken to be without a bound


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


def _within_guard(call):
    """Runs call() in a thread; returns (its exception, seconds), or fails after GUARD s."""
    outcome = {}

    def run():
        started = time.monotonic()
        try:
            call()
        except BaseException as e:  # reported below
            outcome["error"] = e
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), f"still waiting after {GUARD:g} s: the wait has no bound"
    return outcome.get("error"), outcome["seconds"]


def test_reporting_done_to_a_silent_ps_ends_within_the_timeout(silent_ps):
    ps, server = silent_ps
    graph = tf.Graph()
    with graph.as_default():
        op = protocol.done_queue(0, 1).enqueue(0)
    error, seconds = _within_guard(lambda: worker.report_done(
        server.target, graph, op, session.session_config(["/job:ps", "/job:worker/task:0"]),
        timeout=TIMEOUT, me="worker 0", ps_hosts=(ps,)))

    assert isinstance(error, TaskTimeout), repr(error)
    assert str(error) == (f"worker 0: waited {TIMEOUT:g} s to report done to the ps ({ps}); "
                          "it did not answer")
    assert seconds < TIMEOUT + 5


def test_the_chiefs_session_against_a_silent_ps_ends_within_the_timeout(silent_ps):
    ps, server = silent_ps
    graph = tf.Graph()

    def create():
        with graph.as_default():
            with tf1.device("/job:ps/task:0"):
                tf1.get_variable("v", initializer=tf.zeros([2]))
            session.monitored_session(
                server.target, is_chief=True, hooks=[],
                config=session.session_config(["/job:ps", "/job:worker/task:0"]),
                timeout=TIMEOUT, ps_hosts=(ps,))

    error, seconds = _within_guard(create)

    assert isinstance(error, TaskTimeout), repr(error)
    assert str(error) == (f"the chief: waited {TIMEOUT:g} s for the ps ({ps}) to keep, restore "
                          "or initialise the model; it did not answer")
    assert seconds < TIMEOUT + 5
