"""The launcher's private network namespace, with whole clusters (issue 4, Security).

From outside the namespace while the cluster trains: its ports cannot be reached; with
`--isolate off` they can (that run is also the launcher's only async run); where no namespace
can be made (a locked-down host, reproduced for real: conftest.py's `locked_down`), the
launcher says so once and goes on. The namespace on its own, and the launcher's option, are
checked in tests/fast/test_netns.py.
"""

from __future__ import annotations

import re

import pytest

from procs import ROOT, cluster_ports, ns_inode, reachable_from_here, read_json, task_pids

STEPS = 60  # long enough that the cluster is still up while the test probes it
BOUND = 90  # seconds a whole small cluster run may take on a loaded 2-core machine
COMMON = ("--dataset", "synthetic", "--train-steps", str(STEPS), "--timeout", "60",
          "--log-every", "10")
CHIEF_READY = r"\[worker 0\] ready after"


def _assert_lockstep(summary: dict, workers: int) -> None:
    assert summary["global_step"] == STEPS
    assert summary["contributions"] == [STEPS] * workers
    assert summary["synchronous"] is True
    assert [t["exit_code"] for t in summary["tasks"]] == [0] * (workers + 1)


def test_isolated_cluster_is_unreachable_from_outside_and_trains_in_lockstep(fixed_run):
    # The shared run (conftest.py) is the launcher's default, in a private namespace where
    # one can be made, probed from outside while it trained.
    if not fixed_run.isolated:
        pytest.skip(f"no network namespace can be made here: {fixed_run.why_not_isolated}")
    assert fixed_run.ports == list(range(fixed_run.base, fixed_run.base + 4))  # as asked
    assert sorted(fixed_run.task_inodes) == ["ps 0", "worker 0", "worker 1", "worker 2"]
    inodes = set(fixed_run.task_inodes.values())
    assert len(inodes) == 1 and fixed_run.own_inode not in inodes  # one namespace, not ours
    assert fixed_run.interfaces == ["lo"]  # no way in from any other host
    assert set(fixed_run.ports) <= fixed_run.listening  # the servers really were up, inside
    assert all(r.keys() == {"127.0.0.1", "::1"} for r in fixed_run.refused.values()), \
        fixed_run.refused
    assert fixed_run.code == 0, fixed_run.output
    assert fixed_run.summary["synchronous"] is True
    assert "private network namespace with loopback only" in fixed_run.output
    assert fixed_run.leftovers == []


def test_isolate_off_leaves_the_ports_reachable_and_async_mode_shows_its_signature(
        processes, tmp_path):
    # Two behaviours from one run, to save a cluster's start-up: --isolate off, and the async
    # mode's counters (which no other launcher test runs).
    launcher = processes.launcher("--isolate", "off", "--base-port", "0", *COMMON,
                                  "--mode", "async", "--workers", "2",
                                  "--summary-json", str(tmp_path / "cluster.json"))
    ports = cluster_ports(launcher)
    launcher.wait_for_line(CHIEF_READY, BOUND)
    tasks = task_pids(launcher.popen.pid)
    assert {ns_inode(pid) for pid in tasks.values()} == {ns_inode("self")}
    assert [p for p in ports if not reachable_from_here(p)] == []

    assert launcher.wait(BOUND) == 0, launcher.output
    assert "network namespace" not in launcher.output
    summary = read_json(tmp_path / "cluster.json")
    # Every push is an update of its own: global_step is the total of the local steps.
    assert summary["local_steps"] == [STEPS] * 2
    assert summary["global_step"] == 2 * STEPS == sum(summary["pushed"])
    assert summary["synchronous"] is False
    assert "asynchronous (--mode async)" in summary["verdict"]
    assert [t["exit_code"] for t in summary["tasks"]] == [0, 0, 0]


def test_auto_where_impossible_says_so_once_and_goes_on(locked_down, processes, tmp_path):
    launcher = processes.start(
        [*locked_down, str(ROOT / "bin" / "sync-mnist-cluster"), "--base-port", "0", *COMMON,
         "--workers", "2", "--summary-json", str(tmp_path / "cluster.json")], "launcher")
    ports = cluster_ports(launcher)
    launcher.wait_for_line(CHIEF_READY, BOUND)
    assert [p for p in ports if not reachable_from_here(p)] == []  # exposed, as it says

    assert launcher.wait(BOUND) == 0, launcher.output
    _assert_lockstep(read_json(tmp_path / "cluster.json"), workers=2)
    said = [line for line in launcher.output.splitlines() if "namespace" in line]
    assert len(said) == 1, said
    assert re.search(r"\[cluster\] warning: no private network namespace \(unshare\(CLONE_NEWNET\): "
                     r"Operation not permitted .*\): the cluster's ports are open on every "
                     r"interface of this host; use it only on a trusted network$", said[0])
