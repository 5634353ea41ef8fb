"""Bounded calls: a TensorFlow call that no RunOptions can bound, given up past its bound.

Creating a session, a session's first run and closing it wait without end for a peer that
accepts connections but does not answer, or that has gone. Each such call runs in a thread of
its own; past its bound it is left there, and the caller goes on (or raises TaskTimeout).
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from sync_mnist.core.config import TaskTimeout

tf1 = tf.compat.v1

# Closing a session whose ps is gone blocks without end (TensorFlow keeps retrying to release
# the graphs it registered there), and MonitoredSession closes the old session before it makes
# a new one. A close gets this long; then it is left to finish, or not, in the background.
CLOSE_SECS = 2.0
_abandoned: list = []  # sessions whose close did not return; kept so no destructor re-closes


def bounded_call(call, timeout: float, what: str):
    """Returns call(), or raises TaskTimeout naming `what` if it has not returned in `timeout` s.

    For TensorFlow calls that no RunOptions can bound: creating a session, and the first run in
    it, wait without end for a task that accepts connections but does not answer. The call
    runs in a thread of its own; past the bound it is left to finish, or not, in the
    background (TaskTimeout then sees that the process ends). Its exceptions are the caller's.
    """
    outcome: dict = {}
    graph = tf1.get_default_graph()  # thread-local: the call's thread starts with the global one

    def run():
        try:
            with graph.as_default():
                outcome["value"] = call()
        except BaseException as e:  # re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TaskTimeout(f"{what}; it did not answer")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@contextlib.contextmanager
def closed_bounded(sess):
    """`with closed_bounded(tf1.Session(...)) as sess:` closes it with close_bounded: closing
    blocks while a peer it ran ops on is gone (say, another ps that has already exited)."""
    try:
        yield sess
    finally:
        close_bounded(sess.close, sess)


def close_bounded(close, sess) -> None:
    """Calls close() for at most CLOSE_SECS; past that, leaves it running in the background.

    A close that fails because the ps is gone is no news: the caller is replacing the session.
    """
    def quietly():
        try:
            close()
        except tf.errors.OpError:
            pass

    closing = threading.Thread(target=quietly, daemon=True)
    closing.start()
    closing.join(CLOSE_SECS)
    if closing.is_alive():
        _abandoned.append(sess)
