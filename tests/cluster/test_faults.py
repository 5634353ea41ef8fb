"""Faults (issue 4, scenarios 1-6): tasks killed mid-run with real signals, and what follows.

Every test runs the real command line in separate processes on synthetic data, and kills at a
step read from the logs (a `step=N ` progress line), never after a fixed sleep. Processes are
killed by process group when a test ends, pass or fail.

In the default suite (`make test`): the whole-cluster resume (1), a lost backup worker (2), a
lost worker without backup (3, not restarted), and the launcher's --max-restarts (6), which
restarts a worker killed with R = N and so covers the rejoin of scenario 3 through the real
command line (tests/test_rejoin.py pins the rejoin down exactly, in-process). The others are
behind the `soak` marker (`make soak`), to keep the default suite short: a worker restarted by
hand (3), the chief restarted (4), the ps restarted (5), not restarted, or restarted with no
checkpoint to restore.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from procs import Proc, Processes, processes_mentioning, read_json
from sync_mnist.cluster import free_ports
from sync_mnist.config import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT

pytestmark = pytest.mark.cluster

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
COMMON = ("--dataset", "synthetic", "--log-every", "10")


class Cluster:
    """ps 0 and N workers started by hand, each a `python -m sync_mnist` process."""

    def __init__(self, processes: Processes, tmp: Path, workers: int, *args: str):
        ports = free_ports(workers + 1)
        self.hosts = ("--ps-hosts", f"127.0.0.1:{ports[0]}", "--worker-hosts",
                      ",".join(f"127.0.0.1:{p}" for p in ports[1:]))
        self.processes, self.tmp, self.args = processes, tmp, args
        self.marker = str(tmp / "data")  # in every command line, to find leftovers
        self.tasks: dict[tuple[str, int], Proc] = {}
        self.starts = 0

    def start(self, role: str, index: int, *extra: str) -> Proc:
        self.starts += 1
        proc = self.processes.task(role, index, *self.hosts, *COMMON, "--data-dir", self.marker,
                                   *self.args, *extra,
                                   "--summary-json", str(self.record_path(role, index)))
        self.tasks[role, index] = proc
        return proc

    def start_all(self, workers: int) -> None:
        self.start("ps", 0)
        for index in range(workers):
            self.start("worker", index)

    def record_path(self, role: str, index: int) -> Path:
        return self.tmp / f"{role}{index}-{self.starts}.json"

    def record(self, role: str, index: int) -> dict:
        proc = self.tasks[role, index]
        path = next(a for a in reversed(proc.popen.args) if a.endswith(".json"))
        return read_json(path)

    def kill_all(self) -> None:
        for proc in self.tasks.values():
            proc.kill()

    def wait_all(self, timeout: float = BOUND) -> dict[tuple[str, int], int]:
        return {key: proc.wait(timeout) for key, proc in self.tasks.items()}


def _wait_for_step(proc: Proc, step: int) -> None:
    proc.wait_for_line(rf"\] step={step} ", BOUND)


def _checkpoint_steps(logdir: Path) -> list[int]:
    text = (logdir / "checkpoint").read_text()
    return sorted({int(m) for m in re.findall(r'model\.ckpt-(\d+)"', text)})


# -------------------------------------------------------------------------- 1. resume

def test_whole_cluster_killed_and_restarted_resumes_from_the_last_checkpoint(processes,
                                                                           tmp_path):
    steps, logdir = 100, tmp_path / "logdir"
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "60",
                      "--logdir", str(logdir), "--save-steps", "10")
    cluster.start_all(2)
    _wait_for_step(cluster.tasks["worker", 0], 20)
    cluster.kill_all()  # SIGKILL: nothing is saved on the way out
    saved = _checkpoint_steps(logdir)
    assert saved and saved[-1] >= 10, saved

    cluster.start_all(2)
    codes = cluster.wait_all()
    assert set(codes.values()) == {0}, {k: p.output for k, p in cluster.tasks.items()}
    chief = cluster.record("worker", 0)
    # The chief restored the last checkpoint written before the kill, and said so.
    resumed_at = chief["start_step"]
    assert resumed_at == saved[-1] > 0
    cluster.tasks["worker", 0].wait_for_line(
        rf"ready after .*\(global_step {resumed_at}; restored from the checkpoint", 1)
    # Every worker planned only what was left, and the counters went on from the checkpoint:
    # each worker's contributions come to the whole run, not to the steps after the resume.
    for index in (0, 1):
        record = cluster.record("worker", index)
        assert record["local_steps"] == steps - resumed_at
        assert record["contributions"] == [steps, steps]
        assert record["global_step"] == steps
        assert record["synchronous"] is True, record["verdict"]
    assert cluster.record("ps", 0)["contributions"] == [steps, steps]
    assert processes_mentioning(cluster.marker) == []


# -------------------------------------------------------------------------- 2. backup worker lost

def test_lost_backup_worker_is_reported_and_the_rest_finish(processes, tmp_path):
    # Long enough that worker 2, a backup the others need not wait for, still trains when it
    # is killed after its 10th step, even if it started late on a loaded machine.
    steps = 400
    cluster = Cluster(processes, tmp_path, 3, "--train-steps", str(steps), "--timeout", "30",
                      "--replicas-to-aggregate", "2")
    cluster.start_all(3)
    _wait_for_step(cluster.tasks["worker", 2], 10)
    killed_at = time.monotonic()
    cluster.tasks["worker", 2].kill()

    for key in (("worker", 0), ("worker", 1), ("ps", 0)):
        assert cluster.tasks[key].wait(BOUND) == EXIT_OK, cluster.tasks[key].output
    assert time.monotonic() - killed_at < 60  # no wait for a --timeout: its server is gone
    chief = cluster.record("worker", 0)
    pushes = chief["pushed"][2]
    assert chief["lost"] == [2]
    assert chief["global_step"] == steps
    assert chief["synchronous"] is True
    assert chief["verdict"].startswith("synchronous with 1 backup worker")
    assert chief["verdict"].endswith(f"; worker 2 lost after {pushes} pushes")
    assert cluster.record("worker", 1)["verdict"] == chief["verdict"]
    assert cluster.record("ps", 0)["lost"] == [2]
    cluster.tasks["worker", 0].wait_for_line(r"worker 2 is lost \(nothing listens at", 1)
    assert processes_mentioning(cluster.marker) == []


# -------------------------------------------------------------------------- 3. no backup

# If worker 1 died after the update that handed out its token but before taking it, the chief
# could take that token too and train on alone; tokens are owned now (sync.build_train_op).
def test_lost_worker_without_backup_ends_every_task_within_the_timeout(processes, tmp_path):
    timeout = 10
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", "10000", "--timeout",
                      str(timeout))
    cluster.start_all(2)
    _wait_for_step(cluster.tasks["worker", 1], 20)
    killed_at = time.monotonic()
    cluster.tasks["worker", 1].kill()

    chief, ps = cluster.tasks["worker", 0], cluster.tasks["ps", 0]
    assert chief.wait(timeout + 60) == EXIT_TIMEOUT, chief.output
    assert ps.wait(timeout + 60) == EXIT_TIMEOUT, ps.output
    # Within --timeout (the ps a few seconds more), plus slack for a loaded machine.
    assert time.monotonic() - killed_at < timeout + 30
    worker1 = cluster.hosts[3].split(",")[1]
    chief_error = chief.wait_for_line(r"worker 0: waited 10 s for an update", 1).string
    assert re.search(r"contributions so far \[\d+, \d+\]; missing: worker 1 \(no gradient for "
                     rf"update \d+; nothing listens at {worker1}\)$", chief_error), chief_error
    ps_error = ps.wait_for_line(r"ps 0: no progress for", 1).string
    assert re.search(r"global_step stuck at \d+; missing: worker 1 \(no gradient for update "
                     r"\d+; nothing listens at", ps_error), ps_error
    assert cluster.record("worker", 0)["exit_code"] == EXIT_TIMEOUT
    assert processes_mentioning(cluster.marker) == []


@pytest.mark.soak
def test_killed_worker_restarted_by_hand_rejoins_in_lockstep(processes, tmp_path):
    steps = 200
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "120")
    cluster.start_all(2)
    _wait_for_step(cluster.tasks["worker", 1], 20)
    cluster.tasks["worker", 1].kill()
    cluster.start("worker", 1)  # the same flags

    codes = cluster.wait_all()
    assert set(codes.values()) == {0}, {k: p.output for k, p in cluster.tasks.items()}
    restarted = cluster.record("worker", 1)
    # Exact lockstep again: the restarted worker took up its predecessor's place.
    assert restarted["contributions"] == [steps, steps]
    assert restarted["local_steps"] == steps - restarted["start_step"]
    assert restarted["synchronous"] is True, restarted["verdict"]
    assert cluster.record("worker", 0)["verdict"] == restarted["verdict"]
    assert processes_mentioning(cluster.marker) == []


# -------------------------------------------------------------------------- 4. chief restart

@pytest.mark.soak
def test_killed_chief_restarted_continues_from_the_ps(processes, tmp_path):
    steps = 200
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "120")
    cluster.start_all(2)
    _wait_for_step(cluster.tasks["worker", 0], 20)
    cluster.tasks["worker", 0].kill()
    cluster.start("worker", 0)

    codes = cluster.wait_all()
    assert set(codes.values()) == {0}, {k: p.output for k, p in cluster.tasks.items()}
    chief = cluster.record("worker", 0)
    assert chief["start_step"] > 0  # it went on from where the ps was, not from 0
    cluster.tasks["worker", 0].wait_for_line(r"the model was already on the ps", 1)
    # One new queue runner and no extra tokens: still exactly one gradient per worker per
    # update (a doubled token would show as a repeated update and fail the verdict).
    assert chief["contributions"] == [steps, steps]
    assert chief["global_step"] == steps
    assert chief["synchronous"] is True, chief["verdict"]
    assert processes_mentioning(cluster.marker) == []


# -------------------------------------------------------------------------- 5. ps restart

@pytest.mark.soak
def test_killed_ps_restarted_is_restored_from_the_checkpoint(processes, tmp_path):
    steps, logdir = 200, tmp_path / "logdir"
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "120",
                      "--logdir", str(logdir), "--save-steps", "25")
    cluster.start_all(2)
    _wait_for_step(cluster.tasks["worker", 0], 30)  # past the checkpoint at 25
    cluster.tasks["ps", 0].kill()
    cluster.start("ps", 0)

    codes = cluster.wait_all()
    assert set(codes.values()) == {0}, {k: p.output for k, p in cluster.tasks.items()}
    chief = cluster.record("worker", 0)
    assert chief["sessions"] == 2  # one more session, on the restarted ps
    cluster.tasks["worker", 0].wait_for_line(r"global_step went back from \d+ to \d+", 1)
    assert chief["contributions"] == [steps, steps]
    assert chief["global_step"] == steps
    assert chief["synchronous"] is True, chief["verdict"]
    assert processes_mentioning(cluster.marker) == []


@pytest.mark.soak
def test_killed_ps_not_restarted_ends_every_worker_with_a_clear_error(processes, tmp_path):
    timeout = 10
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", "10000", "--timeout",
                      str(timeout))
    cluster.start_all(2)
    _wait_for_step(cluster.tasks["worker", 0], 20)
    killed_at = time.monotonic()
    cluster.tasks["ps", 0].kill()
    for index in (0, 1):
        worker = cluster.tasks["worker", index]
        assert worker.wait(timeout + 60) == EXIT_TIMEOUT, worker.output
        worker.wait_for_line(r"lost the ps mid-run and it did not come back: ps 0 at "
                             r"\S+ is unreachable", 1)
    assert time.monotonic() - killed_at < 2 * timeout + 30
    assert processes_mentioning(cluster.marker) == []


@pytest.mark.soak
def test_killed_ps_restarted_without_a_checkpoint_is_an_error_not_a_fresh_start(processes,
                                                                              tmp_path):
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", "10000", "--timeout", "60")
    cluster.start_all(2)
    _wait_for_step(cluster.tasks["worker", 0], 20)
    cluster.tasks["ps", 0].kill()
    cluster.start("ps", 0)
    chief = cluster.tasks["worker", 0]
    assert chief.wait(BOUND) == EXIT_FAILED, chief.output
    assert chief.lines[-1].endswith(
        "failed: ModelLost: the ps was restarted and has lost the model, and there is no "
        "checkpoint to restore it from (give the chief --logdir)")


# -------------------------------------------------------------------------- 6. launcher

def test_launcher_restarts_a_killed_worker_and_reports_it(processes, tmp_path):
    steps = 200
    marker = str(tmp_path / "data")
    launcher = processes.launcher("--base-port", "0", "--workers", "2", *COMMON,
                                  "--data-dir", marker, "--train-steps", str(steps),
                                  "--timeout", "120", "--max-restarts", "1",
                                  "--summary-json", str(tmp_path / "cluster.json"))
    pid = int(launcher.wait_for_line(r"started worker 1 \(pid (\d+)\)", BOUND)[1])
    launcher.wait_for_line(r"\[worker 1\] step=20 ", BOUND)
    os.kill(pid, signal.SIGKILL)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"worker 1 exited with code -9; restarting it \(restart 1 of 1\)", 1)
    new_pid = int(launcher.wait_for_line(rf"started worker 1 \(pid (?!{pid}\))(\d+)\)", 1)[1])
    assert new_pid != pid
    summary = read_json(tmp_path / "cluster.json")
    assert summary["restarts"] == {"worker 1": 1}
    assert [t["restarts"] for t in summary["tasks"]] == [0, 1, 0]  # ps 0, worker 1, worker 0
    assert summary["contributions"] == [steps, steps]
    assert summary["synchronous"] is True
    header = next(line for line in launcher.lines if line.startswith("task "))
    assert header.split()[:3] == ["task", "exit", "restarts"]
    row = next(line for line in launcher.lines if line.startswith("worker 1 "))
    assert row.split()[2:4] == ["0", "1"]  # exit 0, 1 restart
    assert processes_mentioning(marker) == []


@pytest.mark.soak
def test_launcher_kills_and_restarts_a_frozen_worker_and_the_run_ends_verified(processes,
                                                                              tmp_path):
    """Worker 1 SIGSTOPped for good: its peers time out naming it, the launcher kills it and
    restarts it and them. The ps waits out the restart: the launcher gives it --restart-grace
    120 (it gave up --timeout + 5 s after the last update, before the restarted tasks were up)."""
    steps, timeout = 200, 20
    marker = str(tmp_path / "data")
    launcher = processes.launcher("--base-port", "0", "--workers", "3", *COMMON,
                                  "--data-dir", marker, "--train-steps", str(steps),
                                  "--timeout", str(timeout), "--max-restarts", "3",
                                  "--summary-json", str(tmp_path / "cluster.json"))
    pid = int(launcher.wait_for_line(r"started worker 1 \(pid (\d+)\)", BOUND)[1])
    launcher.wait_for_line(r"\[worker 1\] step=40 ", BOUND)
    os.kill(pid, signal.SIGSTOP)

    assert launcher.wait(BOUND + 4 * timeout) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"naming worker 1 as missing; worker 1 is still running: killing it "
                           r"and restarting it", 1)
    summary = read_json(tmp_path / "cluster.json")
    assert summary["pids"]["worker 1"][0] == pid and summary["restarts"]["worker 1"] == 1
    assert summary["contributions"] == [steps] * 3 and summary["synchronous"] is True
    assert processes_mentioning(marker) == []
