"""The ps's wait for done entries: it must count every one, however they fall against its polls."""

from __future__ import annotations

import threading

import tensorflow as tf

from sync_mnist import protocol, ps, session
from sync_mnist.cluster import free_ports
from sync_mnist.config import ClusterLayout, TaskConfig, TaskTimeout, TrainConfig

tf1 = tf.compat.v1
WORKERS = 300
GUARD = 60.0  # seconds; past this the ps is taken to be stuck


def _serve(config, server):
    """Runs the ps in a thread; its result or TaskTimeout lands in the dict returned."""
    outcome = {}

    def serve():
        try:
            outcome["result"] = ps.run_ps(config, server=server)
        except TaskTimeout as e:
            outcome["error"] = e

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, outcome


def test_the_ps_counts_every_done_entry_however_short_its_polls(monkeypatch):
    # A dequeue that RunOptions' timeout cuts short can take an entry and drop it with the
    # cancelled step: with 2 ms polls and entries arriving all the while, a ps that waited
    # inside the dequeue lost a few in every hundred, and then waited for them until its
    # timeout (CI saw one lost this way at the default 1 s poll).
    monkeypatch.setattr(ps, "POLL_SECS", 0.002)
    monkeypatch.setattr(ps, "START_SECS", 0.0)  # a lost entry: TaskTimeout after --timeout
    config, server = _ps_of_many_workers()
    thread, outcome = _serve(config, server)
    _report_every_worker_done(server)
    thread.join(GUARD)
    assert not thread.is_alive(), f"the ps still waits {GUARD:g} s after {WORKERS} done entries"
    assert "error" not in outcome, outcome["error"]
    assert outcome["result"].role == "ps"


def test_the_ps_takes_every_waiting_done_entry_in_one_run(monkeypatch):
    # A ps that took one entry a poll needed a size() and a dequeue per worker: 600 runs for
    # 300 workers, a minute on a loaded machine. All 300 are queued before it serves here.
    polls = []
    entries_waiting = ps._entries_waiting

    def counted(*args):
        polls.append(entries_waiting(*args))
        return polls[-1]

    monkeypatch.setattr(ps, "_entries_waiting", counted)
    config, server = _ps_of_many_workers()
    _report_every_worker_done(server)
    thread, outcome = _serve(config, server)
    thread.join(GUARD)
    assert not thread.is_alive(), f"the ps still waits {GUARD:g} s after {WORKERS} done entries"
    assert "error" not in outcome, outcome["error"]
    # The first read answers that ps 0 is up; the second finds all 300, taken in one run.
    assert polls == [WORKERS, WORKERS]


def _ps_of_many_workers():
    """(config, server) of the only ps of WORKERS workers, --timeout 5 s."""
    port, = free_ports(1)
    # The workers' addresses are never dialled: the ps's session sees only /job:ps.
    layout = ClusterLayout((f"127.0.0.1:{port}",),
                           tuple(f"127.0.0.1:{i + 1}" for i in range(WORKERS)))
    config = TaskConfig(role="ps", index=0, cluster=layout,
                        train=TrainConfig(train_steps=1, timeout=5.0))
    return config, ps.start_server(config)


def _report_every_worker_done(server) -> None:
    """Puts every worker's done entry in the ps's queue, as each worker's report_done does."""
    graph = tf.Graph()
    with graph.as_default():
        entry = tf1.placeholder(tf.int32, [])
        enqueue = protocol.done_queue(0, WORKERS).enqueue(entry)
    with tf1.Session(server.target, graph=graph,
                     config=session.session_config(["/job:ps"])) as sess:
        for worker in range(WORKERS):
            sess.run(enqueue, {entry: worker})


def test_a_ps_whose_sibling_never_comes_ends_within_its_bound(monkeypatch):
    # The ps's session spans every ps; its creation waited without end for a missing sibling,
    # before the no-progress watchdog had even started.
    monkeypatch.setattr(ps, "START_SECS", 1.0)
    mine, absent = free_ports(2)  # nobody will listen on the sibling's port
    layout = ClusterLayout((f"127.0.0.1:{mine}", f"127.0.0.1:{absent}"), ("127.0.0.1:1",))
    config = TaskConfig(role="ps", index=0, cluster=layout,
                        train=TrainConfig(train_steps=1, timeout=2.0))
    server = ps.start_server(config)
    thread, outcome = _serve(config, server)
    thread.join(GUARD)
    assert not thread.is_alive(), f"the ps still waits for its sibling after {GUARD:g} s"
    assert str(outcome.get("error")) == (
        f"ps 0: waited 3 s for the other ps (127.0.0.1:{absent}) to answer; it did not answer")
