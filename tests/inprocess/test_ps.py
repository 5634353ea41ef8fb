"""The ps's wait for done entries: it must count every one, however they fall against its polls."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import types

import pytest
import tensorflow as tf

from sync_mnist.core import protocol, sessions
from sync_mnist.task import ps
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import ClusterLayout, TaskConfig, TaskTimeout, TrainConfig

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
    # Once ps 0 has answered (its own read), the first poll finds all 300, taken in one run.
    assert polls == [WORKERS]


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
                     config=sessions.session_config(["/job:ps"])) as sess:
        for worker in range(WORKERS):
            sess.run(enqueue, {entry: worker})


@pytest.mark.own_process
def test_a_ps_whose_sibling_never_comes_ends_within_its_bound(monkeypatch):
    # The ps's session spans every ps; its creation waited without end for a missing sibling,
    # before the no-progress watchdog had even started.
    monkeypatch.setattr(ps, "START_SECS", 1.0)
    (mine,) = free_ports(1)
    # The sibling's port is held, bound and not listening, so that no other test's server can
    # take it: it once answered there, and the ps waited for its workers instead.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        absent = held.getsockname()[1]
        layout = ClusterLayout((f"127.0.0.1:{mine}", f"127.0.0.1:{absent}"), ("127.0.0.1:1",))
        config = TaskConfig(role="ps", index=0, cluster=layout,
                            train=TrainConfig(train_steps=1, timeout=2.0))
        server = ps.start_server(config)
        thread, outcome = _serve(config, server)
        thread.join(GUARD)
    assert not thread.is_alive(), f"the ps still waits for its sibling after {GUARD:g} s"
    assert str(outcome.get("error")) == (
        f"ps 0: waited 3 s for the other ps (127.0.0.1:{absent}) to answer; it did not answer")


class _Cut:
    """A session whose first `cut` runs are cut short by their RunOptions' bound."""

    def __init__(self, cut: int):
        self.cut, self.runs = cut, 0

    def run(self, fetch, options=None):
        self.runs += 1
        if self.runs <= self.cut:
            raise tf.errors.DeadlineExceededError(None, None, "Timed out waiting for notification")
        return 0


def _watch(sess, timeout: float = 2.0):
    layout = ClusterLayout(("127.0.0.1:1", "127.0.0.1:2"), ("127.0.0.1:3",))
    config = TaskConfig(role="ps", index=0, cluster=layout,
                        train=TrainConfig(train_steps=1, timeout=timeout))
    return ps._Watch(config, lambda: sess, shared=None, waiting=None, take_done=None,
                     preempt=None)


def test_a_poll_cut_short_is_not_an_answer_from_the_other_ps(monkeypatch):
    # A poll cut short answered nothing: the ps took it for the other ps's answer, went on to
    # wait for its workers, and its watchdog then blamed them, not the missing ps.
    monkeypatch.setattr(ps, "START_SECS", 0.0)
    sess = _Cut(cut=3)
    _watch(sess).wait_for_the_other_ps()
    assert sess.runs == 4
    with pytest.raises(TaskTimeout, match=r"^ps 0: waited 0.2 s for the other ps "
                                          r"\(127.0.0.1:2\) to answer; it did not answer$"):
        _watch(_Cut(cut=10**9), timeout=0.2).wait_for_the_other_ps()


@contextlib.contextmanager
def _workers(listening: list[bool]):
    """Worker addresses on held ports: a server that answers where `listening`, else a port
    bound and not listening (refused), which no other test's server can take meanwhile."""
    with contextlib.ExitStack() as stack:
        addresses = []
        for answers in listening:
            held = stack.enter_context(socket.socket())
            held.bind(("127.0.0.1", 0))
            if answers:
                held.listen()
            addresses.append(f"127.0.0.1:{held.getsockname()[1]}")
        yield tuple(addresses)


def _watch_past_the_start_up_bound(monkeypatch, workers: tuple[str, ...]):
    monkeypatch.setattr(ps, "START_SECS", 3.0)
    config = TaskConfig(role="ps", index=0, cluster=ClusterLayout(("127.0.0.1:1",), workers),
                        train=TrainConfig(train_steps=1, timeout=2.0))
    watch = ps._Watch(config, new_session=lambda: None, shared=None, waiting=None,
                      take_done=None, preempt=None)
    watch.last_progress = time.monotonic() - 5.5  # 3 s + --timeout 2 s, and a little more
    return watch


def test_a_ps_that_no_worker_joined_says_so_at_the_start_up_bound(monkeypatch):
    # Every worker exited at start (its model failed to import, say): the ps said only "no
    # progress (no worker has initialised the model)", naming no one.
    with _workers([False, False]) as workers:
        watch = _watch_past_the_start_up_bound(monkeypatch, workers)
        watch.last_progress += 3.0  # within the bound: no word yet
        watch._watchdog(None)
        watch.last_progress -= 3.0
        with pytest.raises(TaskTimeout) as raised:
            watch._watchdog(None)
    assert str(raised.value) == (
        "ps 0: no worker joined within the start-up bound, 5 s (3 s + --timeout 2 s): the "
        "model was never initialised, and no worker's server answers (worker 0: nothing "
        f"listens at {workers[0]}; worker 1: nothing listens at {workers[1]}); each exited "
        "at start or never started")


def test_a_ps_names_the_workers_that_answer_when_the_chief_never_initialised(monkeypatch):
    with _workers([False, True]) as workers:
        watch = _watch_past_the_start_up_bound(monkeypatch, workers)
        with pytest.raises(TaskTimeout) as raised:
            watch._watchdog(None)
    assert str(raised.value) == (
        "ps 0: the model was not initialised within the start-up bound, 5 s (3 s + --timeout "
        f"2 s); the servers of worker 1 answer; silent: worker 0: nothing listens at "
        f"{workers[0]}")


def test_a_ps_that_saw_the_model_once_does_not_say_no_worker_joined(monkeypatch):
    with _workers([False, False]) as workers:
        watch = _watch_past_the_start_up_bound(monkeypatch, workers)
        watch.initialised = True  # ps 0 answered a read once; now it does not
        with pytest.raises(TaskTimeout, match=r"^ps 0: no progress for \d+ s \(global_step "
                                              r"unread: ps 0 did not answer; workers done: "
                                              r"none of 2\)$"):
            watch._watchdog(None)


def test_a_ps_waits_for_the_chief_s_done_report_while_it_may_still_be_writing_the_model():
    # The chief reports done last, after its SavedModel, which a full disk holds up for as
    # long as --timeout (chief.write_model): the ps gives it that much more, and no more.
    config = TaskConfig(role="ps", index=0, cluster=ClusterLayout(
        ("127.0.0.1:1",), ("127.0.0.1:2", "127.0.0.1:3")), train=TrainConfig(
            train_steps=30, timeout=2.0, restart_grace=1.0))
    watch = ps._Watch(config, new_session=lambda: None, shared=None, waiting=None,
                      take_done=None, preempt=None)
    reading = types.SimpleNamespace(global_step=30)
    watch.last_step, watch.done, watch.initialised = 30, {1}, True
    usual = config.train.timeout + config.train.restart_grace + ps.SPEAK_FIRST_SECS
    watch.last_progress = time.monotonic() - usual - 1.0
    watch._watchdog(reading)  # past the usual bound: the chief may still be writing
    watch.last_progress -= config.train.timeout
    with pytest.raises(TaskTimeout, match=r"^ps 0: no progress for 16 s \(global_step stuck "
                                          r"at 30; workers done: \[1\] of 2\)$"):
        watch._watchdog(reading)
    watch.done, watch.lost = set(), [1]  # no done report yet (worker 1 lost): the usual bound
    watch.last_progress = time.monotonic() - usual - 1.0
    with pytest.raises(TaskTimeout):
        watch._watchdog(reading)
