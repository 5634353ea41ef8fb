"""The launcher's network namespace, where it is not made: `--isolate off` (that run is also the
launcher's only async run), and `--isolate auto` on a locked-down host where none can be made
(reproduced for real: conftest.py's `locked_down`), which says so once and goes on. The
namespace the launcher makes, probed from outside, is checked in
tests/cluster/test_isolated_cluster.py.
"""

from __future__ import annotations

import re

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
