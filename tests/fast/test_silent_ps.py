"""worker.silent_ps: the ps a timeout at a read of every ps names, so that the launcher restarts
that ps (found by make chaos: ps 0 of 2 frozen at the finish; the workers' timeouts named no
task, and the launcher spent its one restart on a worker)."""

from __future__ import annotations

import socket

import tensorflow as tf

from sync_mnist import report, worker
from sync_mnist.cluster import ClusterLayout, free_ports

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


def test_a_timeout_names_the_ps_that_do_not_answer_and_why():
    ports = free_ports(3)
    layout = ClusterLayout(tuple(f"127.0.0.1:{p}" for p in ports), ("127.0.0.1:1",))
    graph = tf.Graph()
    with graph.as_default():
        for p in range(3):
            with tf1.device(f"/job:ps/task:{p}"):
                tf1.get_variable(f"layer{p}/weights", [2])
    side = _Side(frozen={0})
    with socket.socket() as ps0, socket.socket() as ps1:  # ps 2's port: nothing listens
        for server, port in ((ps0, ports[0]), (ps1, ports[1])):
            server.bind(("127.0.0.1", port))
            server.listen()
        silent = worker.silent_ps(side, graph, layout)
    assert silent == ["ps 0 (it accepts connections but did not answer a read in 5 s)",
                      f"ps 2 (nothing listens at 127.0.0.1:{ports[2]})"]
    assert side.reads == [(0, 5000), (1, 5000)]  # one bounded read of each ps that listens
    timeout = ("worker 1: waited 20 s for the ps tasks (...) at the finish (the barrier and the "
               f"final counters); no answer; missing: {', '.join(silent)}")
    assert report.missing_tasks(timeout) == ["ps 0", "ps 2"]
