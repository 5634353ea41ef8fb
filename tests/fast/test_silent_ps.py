"""The ps a worker's timeout names, so that the launcher restarts that ps (found by make chaos:
ps 0 of 2 frozen at the finish, then ps 0 of 2 cut off in training; the workers' timeouts named
no task, and the launcher spent its one restart on a worker); and none when the worker reaches
no task at all, its own network being the fault (membership.cut_off)."""

from __future__ import annotations

import contextlib
import socket

import pytest
import tensorflow as tf

from types import SimpleNamespace

from sync_mnist.task.chief import Chief
from sync_mnist.core import membership
from sync_mnist.core.cluster import ClusterLayout, free_ports
from sync_mnist.core.config import TaskConfig, TrainConfig
from sync_mnist.task import progress_log
from sync_mnist.task.waits import timeout_naming_silent_ps

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
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            server.bind(("127.0.0.1", port))
            server.listen()
        yield


def test_a_timeout_names_the_ps_that_do_not_answer_and_why():
    ports, layout, graph = _cluster(3)
    side = _Side(frozen={0})
    waited = ("worker 1: waited 20 s for the ps tasks (...) at the finish (the barrier and the "
              "final counters); no answer")
    with _listening(ports[:2]):  # ps 2's port: nothing listens
        timeout = timeout_naming_silent_ps(waited, side, graph, layout, 1)
    assert side.reads == [(0, 5000), (1, 5000)]  # one bounded read of each ps that listens
    assert str(timeout) == (f"{waited}; missing: ps 0 (it accepts connections but did not "
                            f"answer a read in 5 s), ps 2 (nothing listens at "
                            f"127.0.0.1:{ports[2]})")
    assert timeout.missing == ("ps 0", "ps 2")  # what the launcher reads (TaskResult.missing)


def test_a_final_save_that_timed_out_names_the_silent_ps(monkeypatch):
    from sync_mnist.core import sessions
    from sync_mnist.core.config import TaskTimeout

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


def test_a_checkpoint_save_that_timed_out_in_a_step_names_the_silent_ps(monkeypatch):
    """The chief's periodic save runs inside its training step (the saver hook's after_run),
    bounded by a bounded_call that names no ps (found by make chaos: ps 0 cut off as the chief
    saved; the launcher spent the run's one restart on the chief)."""
    from sync_mnist.core.config import TaskTimeout
    from sync_mnist.task import lockstep

    ports, layout, graph = _cluster(2)
    saving = ("the chief: waited 20 s for the ps (...) to save the checkpoint of global_step 31 "
              "in /tmp/logdir; it did not answer")

    class Session:  # the training session, whose run's saver hook timed out
        def run(self, fetches, options=None):
            raise TaskTimeout(saving)

    monkeypatch.setattr(lockstep.preemption, "arm", lambda: None)  # no handler in this process
    w = SimpleNamespace(
        graph=graph, aggregate=2, bounded=None,
        config=TaskConfig(role="worker", index=0, cluster=layout,
                          train=TrainConfig(train_steps=40)),
        g=SimpleNamespace(training=SimpleNamespace(train_op=None),
                          spec=SimpleNamespace(loss=None, train_metrics={}),
                          stop=SimpleNamespace(read=None)),
        shard=SimpleNamespace(position=lambda: None, ends_after=lambda step: False))
    joined = SimpleNamespace(side=_Side(frozen={1}), status=SimpleNamespace(sessions=1),
                             feed=SimpleNamespace(use=lambda step: None))
    step = lockstep._StepRunner(w, joined, Session(), None, progress=None)
    with _listening(ports), pytest.raises(TaskTimeout) as raised:
        step(30)
    assert str(raised.value) == (f"{saving}; missing: ps 1 (it accepts connections but did not "
                                 "answer a read in 5 s)")
    assert raised.value.missing == ("ps 1",)  # the launcher restarts ps 1, not the chief


# 2 ps and 3 workers, as worker 1 sees them; a probe's answer per address is set by each test.
PS = ("10.0.0.1:2222", "10.0.0.2:2222")
WORKERS = ("10.0.0.3:2222", "10.0.0.4:2222", "10.0.0.5:2222")
SILENT = {address: f"{address} {membership.NO_ANSWER}" for address in PS + WORKERS}


def _probes(monkeypatch, answers: dict[str, str | None]) -> list[str]:
    """membership.probe answering from `answers` (an address not in it accepts); returns the
    addresses probed, in order."""
    probed = []

    def probe(address):
        probed.append(address)
        return answers.get(address)

    monkeypatch.setattr(membership, "probe", probe)
    return probed


def _stalled(num_ps: int = 2, num_workers: int = 3) -> tuple[str, list[str]]:
    """progress_log.stalled for worker 1, waiting for an update; it probes the ps first (a
    down ps ends it before any read of the counters)."""
    config = TaskConfig(role="worker", index=1, train=TrainConfig(train_steps=1),
                        cluster=ClusterLayout(PS[:num_ps], WORKERS[:num_workers]))
    return progress_log.stalled(None, None, None, config)


def test_a_worker_that_times_out_on_a_ps_cut_off_names_that_ps(monkeypatch):
    probed = _probes(monkeypatch, {PS[0]: SILENT[PS[0]]})
    text, missing = _stalled()
    assert missing == ["ps 0"]  # the launcher restarts ps 0, then this worker at no charge
    assert text == f"the ps is unreachable: ps 0 ({PS[0]} does not answer)"
    assert probed == [PS[0], PS[1]]  # ps 1 answered: no need to try the workers


def test_a_worker_cut_off_itself_names_no_ps(monkeypatch):
    probed = _probes(monkeypatch, SILENT)
    text, missing = _stalled()
    assert missing == []  # the launcher restarts this worker, not a ps
    assert text == (f"the ps is unreachable: ps 0 ({PS[0]} does not answer), ps 1 ({PS[1]} "
                    f"does not answer); {membership.CUT_OFF}")
    assert probed == [PS[0], PS[1], WORKERS[0], WORKERS[2]]  # never itself


@pytest.mark.parametrize("answers, blamed", [
    # Another worker answers: the network of this one works, the ps are silent.
    ({**SILENT, WORKERS[2]: None}, True),
    # A refusal is an answer: something reached that host (a ps that died).
    ({**SILENT, PS[1]: f"nothing listens at {PS[1]}"}, True),
    ({**SILENT, WORKERS[0]: f"nothing listens at {WORKERS[0]}"}, True),
    ({**SILENT, PS[0]: f"{PS[0]} is unreachable (No route to host)"}, False),
])
def test_a_ps_is_blamed_unless_nothing_answers(monkeypatch, answers, blamed):
    _probes(monkeypatch, answers)
    assert (_stalled()[1] != []) == blamed


def test_with_no_other_task_to_try_the_ps_is_blamed(monkeypatch):
    _probes(monkeypatch, SILENT)
    assert _stalled(num_ps=1, num_workers=2)[1] == []  # worker 0 is there to try
    _probes(monkeypatch, SILENT)
    config = TaskConfig(role="worker", index=0, train=TrainConfig(train_steps=1),
                        cluster=ClusterLayout(PS[:1], WORKERS[:1]))
    assert progress_log.stalled(None, None, None, config)[1] == ["ps 0"]


def test_a_timeout_at_the_finish_of_a_worker_cut_off_names_no_ps(monkeypatch):
    _probes(monkeypatch, SILENT)
    layout = ClusterLayout(PS, WORKERS)
    timeout = timeout_naming_silent_ps("worker 1: waited 20 s ...", None, tf.Graph(), layout, 1)
    assert timeout.missing == ()
    assert str(timeout) == (f"worker 1: waited 20 s ...; silent: ps 0 ({PS[0]} does not answer), "
                            f"ps 1 ({PS[1]} does not answer); {membership.CUT_OFF}")
