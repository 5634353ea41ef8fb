"""Faults (issue 4, scenarios 1-6): tasks killed mid-run with real signals, and what follows.

Every test runs the real command line in separate processes on synthetic data, and kills at a
step read from the logs (a `step=N ` progress line), never after a fixed sleep. Processes are
killed by process group when a test ends, pass or fail.

In the default suite (`make test`): the whole-cluster resume (1), a lost backup worker (2), a
lost worker without backup (3, not restarted), and the launcher's --max-restarts (6), which
restarts a worker killed with R = N and so covers the rejoin of scenario 3 through the real
command line (tests/inprocess/test_rejoin.py pins the rejoin down exactly, in-process). The
others are in tests/soak/test_restarts.py (`make soak`), to keep the default suite short: a
worker restarted by hand (3), the chief restarted (4), the ps restarted (5), not restarted, or
restarted with no checkpoint to restore, and a frozen worker the launcher restarts (6).
"""

from __future__ import annotations

import os
import re
import signal
import time

from hand_cluster import BOUND, COMMON, Cluster, checkpoint_steps, wait_for_step
from procs import processes_mentioning, read_json
from sync_mnist.config import EXIT_OK, EXIT_TIMEOUT


# -------------------------------------------------------------------------- 1. resume

def test_whole_cluster_killed_and_restarted_resumes_from_the_last_checkpoint(processes,
                                                                           tmp_path):
    steps, logdir = 100, tmp_path / "logdir"
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "60",
                      "--logdir", str(logdir), "--save-steps", "10")
    cluster.start_all(2)
    wait_for_step(cluster.tasks["worker", 0], 20)
    cluster.kill_all()  # SIGKILL: nothing is saved on the way out
    saved = checkpoint_steps(logdir)
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
    wait_for_step(cluster.tasks["worker", 2], 10)
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
    wait_for_step(cluster.tasks["worker", 1], 20)
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


