"""waits.silent_ps: the ps a timeout at a read of every ps names, so that the launcher restarts
that ps (found by make chaos: ps 0 of 2 frozen at the finish; the workers' timeouts named no
task, and the launcher spent its one restart on a worker)."""

from __future__ import annotations

import contextlib
import socket

import pytest
import tensorflow as tf

from types import SimpleNamespace

from sync_mnist.task.chief import Chief
from sync_mnist.task.waits import silent_ps, timeout_naming_silent_ps
from sync_mnist.core.cluster import ClusterLayout, free_ports

tf1 = tf.compat.v1


class _Side:
    """Stands in for the worker's SideSession: a read of a frozen ps's variable times out."""

    def __init__(self, frozen: set[int]):
        self.frozen, self.reads = frozen, []

    def run(self, fetches, feed=None, options=None):
        task = tf.DeviceSpec.from_string(fetches.device).task
        self.reads.append((task, options.timeout_in_ms))
        if task in self.frozen:
            raise tf.errors.DeadlineExceededError(None, None, "Timed out waiting for notification")
        return 0.0


def _cluster(num_ps: int):
    """(ports, layout, graph): `num_ps` ps at free ports, a graph with a variable on each."""
    ports = free_ports(num_ps)
    layout = ClusterLayout(tuple(f"127.0.0.1:{p}" for p in ports), ("127.0.0.1:1",))
    graph = tf.Graph()
    with graph.as_default():
        for p in range(num_ps):
            with tf1.device(f"/job:ps/task:{p}"):
                tf1.get_variable(f"layer{p}/weights", [2])
    return ports, layout, graph


@contextlib.contextmanager
def _listening(ports):
    """Something accepts connections at each of `ports` (a ps that is up, answering or not)."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            server = stack.enter_context(socket.socket())
            server.bind(("127.0.0.1", port))
            server.listen()
        yield


def test_a_timeout_names_the_ps_that_do_not_answer_and_why():
    ports, layout, graph = _cluster(3)
    side = _Side(frozen={0})
    waited = ("worker 1: waited 20 s for the ps tasks (...) at the finish (the barrier and the "
              "final counters); no answer")
    with _listening(ports[:2]):  # ps 2's port: nothing listens
        silent = silent_ps(side, graph, layout)
        timeout = timeout_naming_silent_ps(waited, _Side(frozen={0}), graph, layout)
    assert silent == ["ps 0 (it accepts connections but did not answer a read in 5 s)",
                      f"ps 2 (nothing listens at 127.0.0.1:{ports[2]})"]
    assert side.reads == [(0, 5000), (1, 5000)]  # one bounded read of each ps that listens
    assert str(timeout) == f"{waited}; missing: {', '.join(silent)}"
    assert timeout.missing == ("ps 0", "ps 2")  # what the launcher reads (TaskResult.missing)


def test_a_final_save_that_timed_out_names_the_silent_ps(monkeypatch):
    from sync_mnist.core import sessions
    from sync_mnist.core.config import TaskConfig, TaskTimeout, TrainConfig

    ports, layout, graph = _cluster(2)

    def save_final(sess, status):  # as _BoundedHook.end words it: no ps named
        raise TaskTimeout("waited 20 s for the ps (...) in _SharedCheckpointSaverHook.end; it "
                          "did not answer")

    monkeypatch.setattr(sessions, "save_final", save_final)
    chief = Chief(SimpleNamespace(graph=graph, config=TaskConfig(
        role="worker", index=0, cluster=layout, train=TrainConfig(train_steps=1))))
    chief.side = _Side(frozen={0})
    with _listening(ports):
        with pytest.raises(TaskTimeout) as raised:
            chief.save_final(sess=None, status=None)
    message = str(raised.value)
    assert message.startswith("waited 20 s for the ps (...) in _SharedCheckpointSaverHook.end")
    assert message.endswith("; missing: ps 0 (it accepts connections but did not answer a read "
                            "in 5 s)")
    assert raised.value.missing == ("ps 0",)
