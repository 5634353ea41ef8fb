"""SideSession's bounded runs hold even where TensorFlow ignores the timeout (issue 35).

The first run of a fetch registers its graph on the ps, an RPC with no timeout: against a
silent ps it waited for minutes. A stand-in session that never returns shows the bound.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import tensorflow as tf

from sync_mnist.core import sessions as sessions_lib
from sync_mnist.core.config import PeerLost

tf1 = tf.compat.v1


class _Silent:
    """A session whose run never returns (until the test releases it)."""

    def __init__(self):
        self.release = threading.Event()

    def run(self, fetches, feed_dict=None, options=None):
        self.release.wait(30)
        return "late"


def _side(sess) -> sessions_lib.SideSession:
    side = sessions_lib.SideSession.__new__(sessions_lib.SideSession)
    side._sess, side._ps_hosts = sess, ()
    return side


def test_a_bounded_run_that_does_not_return_ends_as_deadline_exceeded(monkeypatch):
    monkeypatch.setattr(sessions_lib, "RUN_GRACE_SECS", 0.2, raising=False)
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


class _Scripted:
    """A session whose runs raise the next of `errors` (or return "ok" when they run out)."""

    def __init__(self, errors):
        self.errors = errors

    def run(self, fetches, feed_dict=None, options=None):
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    def close(self):
        pass


def test_a_ps_that_came_back_empty_is_still_a_lost_ps(monkeypatch):
    # The ps killed and restarted: the first run loses it (Aborted); the session re-created
    # against the restarted ps finds the model's variables gone until the chief restores them.
    lost = tf.errors.AbortedError(None, None, "Graph handle is not found")
    sessions = [_Scripted([tf.errors.NotFoundError(None, None, "Resource does not exist")]),
                _Scripted([tf.errors.FailedPreconditionError(None, None, "uninitialized")]),
                _Scripted([])]
    monkeypatch.setattr(sessions_lib.tf1, "Session", lambda *args: sessions.pop(0))
    side = _side(_Scripted([lost]))
    side._args, side._ps_hosts = (), ("127.0.0.1:1",)
    monkeypatch.setattr(sessions_lib.membership, "probe", lambda address: None)  # it answers again
    with pytest.raises(tf.errors.AbortedError) as raised:
        side.run("x")
    assert raised.value is lost  # exit 201 (a lost peer), not 1
    side._sess = _Scripted([lost])
    with pytest.raises(tf.errors.AbortedError):
        side.run("x")
    side._sess = _Scripted([lost])
    assert side.run("x") == "ok"  # restored by then: the retry reads it


class _Emptied:
    """A side session against a ps restarted empty: the run's variables are gone."""

    def __init__(self, error):
        self.error, self.calls = error, 0

    def run(self, fetches, feed_dict=None, options=None):
        self.calls += 1
        raise self.error


def _finishing_worker():
    from sync_mnist.core.cluster import ClusterLayout

    cluster = ClusterLayout(("localhost:1",), ("localhost:2", "localhost:3"))
    config = SimpleNamespace(name="worker 1", index=1, cluster=cluster,
                             train=SimpleNamespace(timeout=5.0, mode="sync", proof=True))
    return SimpleNamespace(config=config, g=SimpleNamespace(members=SimpleNamespace(
        mark="mark", mark_worker="mark_worker", mark_value="mark_value",
        write_plan="write_plan", plan="plan")),
        graph=tf.Graph(), bounded=None, target=200, plan="{}")


@pytest.mark.parametrize("error", [
    tf.errors.NotFoundError(None, None, "Resource localhost/members/finished/N10tensorflow3VarE "
                                        "does not exist."),
    tf.errors.FailedPreconditionError(None, None, "Could not find variable members/finished. "
                                                  "This could mean that the variable has been "
                                                  "deleted.")])
def test_a_ps_restarted_empty_before_the_finish_is_a_lost_peer_not_a_failure(error):
    """.ci/run: the ps killed at the last step and restarted before a worker's first read at
    the finish; the worker ended with NotFoundError as its own failure (exit 1), and the
    launcher stopped the cluster rather than restart it for the ps's fault (201)."""
    from sync_mnist.task import cli, finish

    side = _Emptied(error)
    with pytest.raises(PeerLost) as raised:
        finish.finish(_finishing_worker(), side)
    assert side.calls == 1
    assert str(raised.value).startswith("worker 1: a ps lost the run's variables")
    assert type(error).__name__ in str(raised.value) and error.message in str(raised.value)
    assert cli._peer_lost(raised.value)


def test_another_error_at_the_finish_stays_the_tasks_own():
    from sync_mnist.task import cli, finish

    error = tf.errors.InvalidArgumentError(None, None, "a bug")
    with pytest.raises(tf.errors.InvalidArgumentError):
        finish.finish(_finishing_worker(), _Emptied(error))
    assert not cli._peer_lost(error)
