"""membership.py, what faults rely on: the settings the chief publishes and every task compares,
the timeout message that names the missing workers, and the finish barrier."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from sync_mnist.core import membership
from sync_mnist.task.cli import cluster_layout, task_parser
from sync_mnist.task.options import train_config
from sync_mnist.core.cluster import ClusterLayout, free_ports
from sync_mnist.core.config import ConfigError, TaskConfig


# ---------------------------------------------------------------------------- settings

def _config(*argv: str) -> TaskConfig:
    args = task_parser().parse_args(["--train-steps", "50", *argv])
    return TaskConfig(role=args.role, index=args.index, cluster=cluster_layout(args),
                      train=train_config(args))


HOSTS3 = ("--ps-hosts", "h:1", "--worker-hosts", "a:1,b:1,c:1")


def test_settings_leave_hosts_out_and_compare_equal_across_tasks():
    chief = membership.settings(_config("--role", "worker", "--index", "0", *HOSTS3))
    # Worker 1 calls its own host localhost: the same cluster.
    worker = membership.settings(_config("--role", "worker", "--index", "1", "--ps-hosts", "h:1",
                                         "--worker-hosts", "a:1,localhost:1,c:1"))
    assert worker == chief
    membership.check_agreement(worker, json.dumps(chief), me="worker 1", restarted_chief=False)
    ps = membership.settings(_config("--role", "ps", "--index", "0", *HOSTS3))
    # A ps compares what shapes its variables and decides its life: the cluster and the setup.
    assert ps == {"workers": 3, "ps": 1, "setup": "fixed"}
    membership.check_agreement(ps, json.dumps(chief), me="ps 0", restarted_chief=False)
    question_ps = membership.settings(_config("--role", "ps", "--index", "0", *HOSTS3,
                                              "--setup", "question"))
    with pytest.raises(ConfigError, match=r"^ps 0 has --setup question but the chief has "
                                          r"fixed$"):
        membership.check_agreement(question_ps, json.dumps(chief), me="ps 0",
                                   restarted_chief=False)


@pytest.mark.parametrize("argv, restarted, expected", [
    (("--batch-size", "50"), False, "worker 1 has --batch-size 50 but the chief has 100"),
    (("--learning-rate", "0.5", "--seed", "3"), False,
     "worker 1 has --learning-rate 0.5 but the chief has 0.001; "
     "worker 1 has --seed 3 but the chief has 0"),
    (("--wire-dtype", "bfloat16"), False,
     "worker 1 has --wire-dtype bfloat16 but the chief has float32"),
    (("--warm-start-from", "yesterday"), False,
     "worker 1 has --warm-start-from yesterday but the chief has none (the default)"),
    (("--replicas-to-aggregate", "2"), True,
     "worker 1 has --replicas-to-aggregate 2 but the running cluster (published by its chief) "
     "has none (the default)"),
])
def test_a_difference_is_one_line_naming_both_values(argv, restarted, expected):
    chief = membership.settings(_config("--role", "worker", "--index", "0", *HOSTS3))
    mine = membership.settings(_config("--role", "worker", "--index", "1", *HOSTS3, *argv))
    with pytest.raises(ConfigError) as raised:
        membership.check_agreement(mine, json.dumps(chief), me="worker 1",
                                   restarted_chief=restarted)
    assert str(raised.value) == expected


def test_one_model_file_at_two_paths_is_one_model_and_another_version_is_named(tmp_path):
    # Issue 45: each host keeps the file where it likes; its contents are the model.
    paths = [tmp_path / "a" / "my_model.py", tmp_path / "b" / "copy.py", tmp_path / "v2.py"]
    for path, text in zip(paths, ["MODEL = 1\n", "MODEL = 1\n", "MODEL = 2\n"]):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    chief, copy, other = (membership.settings(_config(
        "--role", "worker", "--index", str(k), *HOSTS3, "--model", f"{path}:MODEL"))
        for k, path in enumerate(paths))
    membership.check_agreement(copy, json.dumps(chief), me="worker 1", restarted_chief=False)
    with pytest.raises(ConfigError, match=r"^worker 2 has --model MODEL from a file of sha256 "
                       r"[0-9a-f]{16} but the chief has MODEL from a file of sha256 "
                       r"[0-9a-f]{16}$"):
        membership.check_agreement(other, json.dumps(chief), me="worker 2",
                                   restarted_chief=False)
    # A module, or a built-in name, is compared as it is given.
    assert membership.model_identity("pkg.models:WIDE") == "pkg.models:WIDE"
    assert membership.model_identity("mlp") == "mlp"


# ---------------------------------------------------------------------------- timeout messages

def test_missing_names_the_workers_the_next_update_waits_for_and_why():
    ports = free_ports(3)
    layout = ClusterLayout(("127.0.0.1:1",), tuple(f"127.0.0.1:{p}" for p in ports))
    with socket.socket() as alive:  # worker 1's server is up; worker 2's port is closed
        alive.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        alive.bind(("127.0.0.1", ports[1]))
        alive.listen()
        text = membership.missing([23, 22, 22], 23, layout)
    assert text == (f"worker 1 (no gradient for update 24), worker 2 (no gradient for update "
                    f"24; nothing listens at 127.0.0.1:{ports[2]})")
    assert membership.missing([23, 23, 23], 23, layout, probe_servers=False) == (
        "none: every worker pushed for update 24 but no update came; the chief (worker 0) "
        "runs the update loop and is missing")


# ---------------------------------------------------------------------------- finish barrier

def test_the_chief_finishes_without_a_backup_silent_for_the_timeout(monkeypatch):
    """A frozen backup worker (SIGSTOP: its server still accepts connections) is declared lost
    when it has not pushed for --timeout, which is also the chief's own bound at the barrier:
    the barrier must open on the mark, not time out."""
    n = 3
    m = membership.Membership(*(object() for _ in range(10)))
    finished = [membership.RUNNING, membership.FINISHED, membership.RUNNING]
    last_push = [40, 40, 38]

    def run(fetches, feed=None):
        if fetches is m.mark:
            w, value = feed[m.mark_worker][0], feed[m.mark_value][0]
            finished[w] = max(finished[w], value)
            return None
        assert fetches == [m.finished, m.last_push]
        return [list(finished), list(last_push)]

    monkeypatch.setattr(membership, "probe", lambda address: None)  # stopped, yet listening
    monkeypatch.setattr(membership, "POLL_SECS", 0.05)
    layout = ClusterLayout(("127.0.0.1:1",), tuple(f"127.0.0.1:{p}" for p in (2, 3, 4)))
    lost = membership.finish_barrier(run, m, index=0, cluster=layout, timeout=0.5,
                                     log=logging.getLogger("test"))
    assert lost == [2]
    assert finished == [membership.FINISHED, membership.FINISHED, membership.LOST]


@pytest.mark.parametrize("why, lost_expected", [
    ("does not answer", []),  # a slow link (500 ms each way): the worker finishes after all
    ("nothing listens at 127.0.0.1:4", [2]),  # its server is gone: lost after LOST_PROBES
])
def test_a_probe_that_only_times_out_does_not_declare_a_finishing_worker_lost(
        monkeypatch, why, lost_expected):
    m = membership.Membership(*(object() for _ in range(10)))
    finished = [membership.RUNNING, membership.FINISHED, membership.RUNNING]
    reads = []

    def run(fetches, feed=None):
        if fetches is m.mark:
            w, value = feed[m.mark_worker][0], feed[m.mark_value][0]
            finished[w] = max(finished[w], value)
            return None
        reads.append(1)
        if len(reads) == 2 * membership.LOST_PROBES + 2:  # worker 2's FINISHED comes in
            finished[2] = max(finished[2], membership.FINISHED)
        return [list(finished), [40, 40, 40]]

    monkeypatch.setattr(membership, "probe", lambda address: (
        f"{address} {why}" if why == membership.NO_ANSWER else why) if address.endswith(":4")
        else None)
    monkeypatch.setattr(membership, "POLL_SECS", 0.01)
    layout = ClusterLayout(("127.0.0.1:1",), tuple(f"127.0.0.1:{p}" for p in (2, 3, 4)))
    lost = membership.finish_barrier(run, m, index=0, cluster=layout, timeout=30,
                                     log=logging.getLogger("test"))
    assert lost == lost_expected
    assert finished[2] == (membership.LOST if lost_expected else membership.FINISHED)


def test_a_worker_whose_input_is_cut_otherwise_than_the_chief_s_is_refused_naming_both():
    """Cut by file beside cut by record (its files differ), or cut by its own .shard() beside
    cut by the package, some examples would be read twice and others never (issue 55)."""
    def cut(how: str, index: int) -> dict:
        config = _config("--role", "worker", "--index", str(index), *HOSTS3)
        return membership.settings(config, membership.model_settings({}, [], how))

    chief = cut("by file, by the package", 0)
    membership.check_agreement(cut("by file, by the package", 1), json.dumps(chief),
                               me="worker 1", restarted_chief=False)
    with pytest.raises(ConfigError) as raised:
        membership.check_agreement(cut("by file, by the input function's .shard()", 2),
                                   json.dumps(chief), me="worker 2", restarted_chief=False)
    assert str(raised.value) == ("worker 2 has its input cut by file, by the input function's "
                                 ".shard() but the chief has by file, by the package")
