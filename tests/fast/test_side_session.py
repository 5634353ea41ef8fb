"""SideSession's bounded runs hold even where TensorFlow ignores the timeout (issue 35).

The first run of a fetch registers its graph on the ps, an RPC with no timeout: against a
silent ps it waited for minutes. A stand-in session that never returns shows the bound.
"""

from __future__ import annotations

import threading

import pytest
import tensorflow as tf

from sync_mnist import session

tf1 = tf.compat.v1


class _Silent:
    """A session whose run never returns (until the test releases it)."""

    def __init__(self):
        self.release = threading.Event()

    def run(self, fetches, feed_dict=None, options=None):
        self.release.wait(30)
        return "late"


def _side(sess) -> session.SideSession:
    side = session.SideSession.__new__(session.SideSession)
    side._sess, side._ps_hosts = sess, ()
    return side


def test_a_bounded_run_that_does_not_return_ends_as_deadline_exceeded(monkeypatch):
    monkeypatch.setattr(session, "RUN_GRACE_SECS", 0.2, raising=False)
    silent = _Silent()
    outcome = []

    def call():
        try:
            outcome.append(_side(silent).run("x", options=tf1.RunOptions(timeout_in_ms=100)))
        except tf.errors.DeadlineExceededError as e:
            outcome.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(5)
    silent.release.set()
    assert outcome, "a run with a 0.1 s timeout had not returned 5 s later"
    assert isinstance(outcome[0], tf.errors.DeadlineExceededError), outcome
    assert "no answer within 0.3 s" in outcome[0].message


def test_an_unbounded_run_is_not_given_a_bound():
    silent = _Silent()
    silent.release.set()
    assert _side(silent).run("x") == "late"
