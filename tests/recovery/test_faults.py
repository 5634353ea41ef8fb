"""Faults (issue 4, scenarios 1-6): tasks killed mid-run with real signals, and what follows.

Every test runs the real command line in separate processes on synthetic data, and kills at a
step read from the logs (a `step=N ` progress line), never after a fixed sleep. Processes are
killed by process group when a test ends, pass or fail.

Here (`make test-recovery`, which CI runs after `make test`): the whole-cluster resume (1), a
lost backup worker (2), a lost worker without backup (3, not restarted), and the launcher's
--max-restarts (6), which restarts a worker killed with R = N and so covers the rejoin of
scenario 3 through the real command line (tests/inprocess/test_rejoin.py pins the rejoin down
exactly, in-process). The others are in tests/soak/test_restarts.py (`make soak`), to keep
this tier short: a worker restarted by hand (3), the chief restarted (4), the ps restarted (5),
not restarted, or restarted with no checkpoint to restore. A frozen worker the launcher
restarts, and only it (6, issue 56), is here.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import tensorflow as tf

from hand_cluster import BOUND, COMMON, Cluster, checkpoint_steps, wait_for_step
from procs import CLUSTER_LINE, Proc, processes_mentioning, read_json
from sync_mnist.core.config import EXIT_OK, EXIT_TIMEOUT


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


def test_a_sparse_models_checkpoint_resumes_on_another_number_of_ps(processes, tmp_path):
    """Issue 36: a table split over 2 ps is saved whole, and 1 ps resumes it where the run
    stopped, slots and counters too; the verdict counts the whole plan."""
    logdir, summary = tmp_path / "logdir", tmp_path / "cluster.json"

    def run(num_ps: int, steps: int):
        launcher = processes.launcher(
            "--base-port", "0", "--workers", "2", "--ps", str(num_ps), "--model",
            "sync_mnist.models.ctr:SMALL", "--log-every", "10", "--train-steps", str(steps),
            "--timeout", "60", "--logdir", str(logdir), "--summary-json", str(summary))
        assert launcher.wait(BOUND) == EXIT_OK, launcher.output
        return launcher, read_json(summary)

    _, first = run(2, 20)
    assert first["contributions"] == [20, 20] and first["synchronous"] is True
    reader = tf.train.load_checkpoint(str(logdir))
    assert reader.get_variable_to_shape_map()["embedding/table"] == [10_000, 16]  # whole

    launcher, second = run(1, 40)
    launcher.wait_for_line(r"\[worker 0\] ready after .*\(global_step 20; restored from the "
                           r"checkpoint", 1)
    chief = next(t for t in second["tasks"] if (t["role"], t["index"]) == ("worker", 0))
    assert (chief["start_step"], chief["local_steps"]) == (20, 20)
    assert second["contributions"] == [40, 40] and second["global_step"] == 40
    assert second["synchronous"] is True, second["verdict"]


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
    launcher.wait_for_line(r"worker 1 exited with code -9; restarting it \(fault 1 of 1\)", 1)
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


def test_a_frozen_worker_is_the_one_task_restarted_and_the_run_ends_verified(processes,
                                                                            tmp_path):
    """Worker 1 SIGSTOPped for good (issue 56): past --timeout, the others say their update
    waits for it and wait --restart-grace more; the launcher kills and restarts it, and only
    it. Before, they exited 200 naming it and were restarted too."""
    steps, timeout = 200, 10
    marker = str(tmp_path / "data")
    launcher = processes.launcher("--base-port", "0", "--workers", "3", *COMMON,
                                  "--data-dir", marker, "--train-steps", str(steps),
                                  "--timeout", str(timeout), "--max-restarts", "1",
                                  "--summary-json", str(tmp_path / "cluster.json"))
    pid = int(launcher.wait_for_line(r"started worker 1 \(pid (\d+)\)", BOUND)[1])
    launcher.wait_for_line(r"\[worker 1\] step=40 ", BOUND)
    os.kill(pid, signal.SIGSTOP)

    assert launcher.wait(BOUND + 4 * timeout) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"\[worker [02]\] warning: waited 10 s for an update after local "
                           r"step \d+; contributions so far \[\d+, \d+, \d+\]; missing: worker 1 "
                           r".*; waiting for the replacement of worker 1, for up to "
                           r"--restart-grace 120 s more", 1)
    launcher.wait_for_line(r"waits for worker 1; worker 1 is still running: killing it and "
                           r"restarting it \(fault 1 of 1\)", 1)
    summary = read_json(tmp_path / "cluster.json")
    assert summary["pids"]["worker 1"][0] == pid and summary["restarts"] == {"worker 1": 1}
    assert summary["contributions"] == [steps] * 3 and summary["synchronous"] is True
    assert "exited with code 200" not in launcher.output
    assert processes_mentioning(marker) == []


def _signal_the_ps(processes, tmp_path, signum, *, at_step, steps, timeout, save_steps,
                   num_ps=1):
    """A 2-worker launcher run with --max-restarts 1 and a --logdir, ps 0 sent `signum` once the
    chief logs `at_step`; returns the launcher."""
    launcher = processes.launcher("--base-port", "0", "--workers", "2", "--ps", str(num_ps),
                                  *COMMON,
                                  "--train-steps", str(steps), "--timeout", str(timeout),
                                  "--max-restarts", "1", "--logdir", str(tmp_path / "logdir"),
                                  "--save-steps", str(save_steps),
                                  "--summary-json", str(tmp_path / "cluster.json"))
    pid = int(launcher.wait_for_line(r"started ps 0 \(pid (\d+)\)", BOUND)[1])
    launcher.wait_for_line(rf"\[worker 0\] step={at_step} ", BOUND)
    os.kill(pid, signum)
    return launcher


def test_a_ps_killed_as_training_ends_costs_one_restart(processes, tmp_path):
    """Issue 35: the ps SIGKILLed as the chief logs its last step, as the workers enter the
    finish, whose barrier and counters read the ps outside any training step and fail on a lost
    ps (201). Before: each worker that failed so cost a restart of its own, and the launcher
    stopped the cluster with its one restart spent on the ps."""
    steps = 200
    launcher = _signal_the_ps(processes, tmp_path, signal.SIGKILL, at_step=steps, steps=steps,
                              timeout=30, save_steps=7)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"ps 0 exited with code -9; restarting it \(fault 1 of 1\)", 1)
    summary = read_json(tmp_path / "cluster.json")
    # Where the kill landed, before or after the chief's save of update 200, decides whether
    # the restarted cluster redid the updates since the last periodic save (196); the counters
    # were restored with the weights, so each update counts once either way.
    assert summary["synchronous"] is True and summary["contributions"] == [steps, steps]
    assert summary["restarts"]["ps 0"] == 1
    assert max(checkpoint_steps(tmp_path / "logdir")) == steps


def test_a_ps_of_two_killed_mid_run_is_the_one_task_restarted(processes, tmp_path):
    """Found by make chaos: 2 ps, ps 0 SIGKILLed and restarted, --max-restarts 1. ps 1's next
    read of ps 0 failed with AbortedError ("Session handle is not found ... just restarted")
    or CancelledError, and ps 1 ended 201; restarted at no charge, or, when the restarted ps 0
    lost it first and ended 201 too, the run failed on a second fault. ps 1 now re-creates its
    session and carries on."""
    steps = 200
    launcher = _signal_the_ps(processes, tmp_path, signal.SIGKILL, at_step=50, steps=steps,
                              timeout=30, save_steps=10, num_ps=2)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"\[ps 1\] warning: ps 0 was restarted \(.*(Session handle is not "
                           r"found|was probably restarted|is cancelled).*\); re-creating the "
                           r"session", 1)
    summary = read_json(tmp_path / "cluster.json")
    assert summary["synchronous"] is True and summary["contributions"] == [steps, steps]
    assert summary["restarts"] == {"ps 0": 1}, launcher.output


def test_a_ps_frozen_mid_run_is_named_restarted_and_the_run_ends_verified(processes, tmp_path):
    """Found by the chaos soak (issue 35): ps 0 SIGSTOPped mid-run, --max-restarts 1. The
    workers timed out saying "the ps is reachable but its counters cannot be read", naming no
    one; the launcher restarted the first of them instead of the ps, and the run ended 200."""
    steps = 200
    # The launcher kills it: a SIGKILL ends a stopped process.
    launcher = _signal_the_ps(processes, tmp_path, signal.SIGSTOP, at_step=50, steps=steps,
                              timeout=10, save_steps=10)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"missing: ps 0 \(it accepts connections but did not answer", 1)
    launcher.wait_for_line(r"naming ps 0 as missing; ps 0 is still running: killing it and "
                           r"restarting it \(fault 1 of 1\)", 1)
    summary = read_json(tmp_path / "cluster.json")
    assert summary["synchronous"] is True and summary["contributions"] == [steps, steps]
    assert summary["restarts"]["ps 0"] == 1


# ------------------------------------------------- a worker killed while it waits for its token

class PsReading:
    """What ps 0 holds, read from outside the cluster (a client of the ps's own gRPC server):
    global_step, every worker's last_push and the size of every worker's own token queue."""

    def __init__(self, ps_address: str, workers: int):
        import tensorflow as tf

        from sync_mnist.core import membership, sync, tfcompat

        tfcompat.graph_mode(verbose=False)
        tf1 = tf.compat.v1
        graph = tf.Graph()
        with graph.as_default():  # the same names as every task's graph: the same variables
            state = sync.build_shared_state(workers)
            members = membership.build_membership(workers, {})
            with tf1.device("/job:ps/task:0"):
                queues = [tf1.FIFOQueue(-1, tf.int64, shapes=[()], name=f"q{w}",
                                        shared_name=f"sync_token_q_worker_{w}").size()
                          for w in range(workers)]
        self._fetches = (state.global_step, members.last_push, queues)
        self._options = tf1.RunOptions(timeout_in_ms=10_000)
        port = ps_address.rsplit(":", 1)[1]
        self._sess = tf1.Session(f"grpc://127.0.0.1:{port}", graph=graph,
                                 config=tf1.ConfigProto(device_filters=["/job:ps/task:0"]))

    def close(self) -> None:
        from sync_mnist.core.bounded import close_bounded

        close_bounded(self._sess.close, self._sess)

    def read(self) -> tuple[int, list[int], list[int]]:
        from sync_mnist.core.bounded import bounded_call

        # The first run creates the session, which no RunOptions bound (a ps gone waits forever).
        step, last_push, waiting = bounded_call(
            lambda: self._sess.run(self._fetches, options=self._options), 30,
            "the test's reading of ps 0")
        return int(step), [int(p) for p in last_push], [int(n) for n in waiting]


def _kill_while_it_waits_for_its_token(reading: PsReading, victim: int, victim_pid: int,
                                       other: int, other_pid: int) -> int:
    """Stops `other` (SIGSTOP), waits until the ps shows that `victim` has pushed for the next
    update and has no token (the update needs the stopped worker's gradient), SIGKILLs the
    victim there, then lets `other` go on. Returns the update the victim's last gradient
    joined."""
    os.kill(other_pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + BOUND
        while True:
            step, last_push, waiting = reading.read()
            if last_push[victim] == step > last_push[other] and waiting[victim] == 0:
                break  # pushed for update step + 1, which cannot happen without `other`
            assert time.monotonic() < deadline, (step, last_push, waiting)
            time.sleep(0.05)  # a poll of the ps's state, not a wait for it
        os.kill(victim_pid, signal.SIGKILL)
        while _alive(victim_pid):  # dead (its sockets closed) before the update can happen
            assert time.monotonic() < deadline, f"pid {victim_pid} outlived SIGKILL"
            time.sleep(0.01)
    finally:
        os.kill(other_pid, signal.SIGCONT)
        reading.close()  # now, while the ps is there: a session's close waits for its peer
    return step + 1


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, or a pid that is gone, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _started(launcher: Proc, task: str) -> int:
    return int(launcher.wait_for_line(rf"started {task} \(pid (\d+)\)", BOUND)[1])


@pytest.mark.parametrize("victim", [1, 0], ids=["worker-1", "chief"])
def test_a_task_killed_while_it_waits_for_its_token_is_restarted_into_a_verified_run(
        processes, tmp_path, victim):
    """With one token queue for the cluster, the survivor took the dead worker's token and
    pushed twice into every later update (exit 3). Owned tokens keep it for the successor."""
    steps, other = 150, 1 - victim  # the victim dies near step 20; the rest shows the rejoin
    marker = str(tmp_path / "data")
    launcher = processes.launcher("--base-port", "0", "--isolate", "off", "--workers", "2",
                                  *COMMON, "--data-dir", marker, "--train-steps", str(steps),
                                  "--timeout", "60", "--max-restarts", "1",
                                  "--summary-json", str(tmp_path / "cluster.json"))
    reading = PsReading(launcher.wait_for_line(CLUSTER_LINE, BOUND)["ps"], 2)  # before the run
    pids = {w: _started(launcher, f"worker {w}") for w in (0, 1)}
    launcher.wait_for_line(rf"\[worker {victim}\] step=20 ", BOUND)
    update = _kill_while_it_waits_for_its_token(reading, victim, pids[victim], other,
                                                pids[other])

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(rf"worker {victim} exited with code -9; restarting it", 1)
    summary = read_json(tmp_path / "cluster.json")
    assert summary["synchronous"] is True, summary["verdict"]
    assert summary["contributions"] == [steps, steps]
    assert summary["repeat_updates"] == 0
    assert not [line for line in launcher.lines if "went back" in line]
    # The successor starts at the update its predecessor's last gradient joined, or later: it
    # took the token left in its own queue ("rejoined"), or the ps had handed it to the dead
    # worker's pending dequeue before cancelling it, and the successor pushes as a new worker.
    ready = [m for m in (re.search(rf"\[worker {victim}\] ready after .*\(global_step (\d+)",
                                   line) for line in launcher.lines) if m]
    assert len(ready) == 2 and int(ready[-1][1]) >= update, [m.string for m in ready]
    assert processes_mentioning(marker) == []


@pytest.mark.parametrize("victim", [1, 0], ids=["worker-1", "chief"])
def test_a_task_killed_while_it_waits_for_its_token_and_not_restarted_ends_the_others_in_time(
        processes, tmp_path, victim):
    timeout, other = 10, 1 - victim
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", "10000", "--timeout",
                      str(timeout))
    reading = PsReading(cluster.hosts[1], 2)
    cluster.start_all(2)
    wait_for_step(cluster.tasks["worker", victim], 20)
    update = _kill_while_it_waits_for_its_token(
        reading, victim, cluster.tasks["worker", victim].popen.pid, other,
        cluster.tasks["worker", other].popen.pid)
    killed_at = time.monotonic()

    survivor, ps_task = cluster.tasks["worker", other], cluster.tasks["ps", 0]
    assert survivor.wait(timeout + 60) == EXIT_TIMEOUT, survivor.output
    assert ps_task.wait(timeout + 60) == EXIT_TIMEOUT, ps_task.output
    assert time.monotonic() - killed_at < timeout + 30  # plus slack for a loaded machine
    # The survivor made update `update` with its push and then waited for the next one: it
    # never took the dead worker's token.
    error = survivor.wait_for_line(rf"worker {other}: waited {timeout} s for an update", 1).string
    # With the chief killed, update `update` may still be made: the ps runs the update the
    # chief's queue runner had already started, once the other gradient arrives.
    missing = (rf"missing: worker {victim} \(no gradient for update {update + 1};" if victim else
               rf"missing: worker 0 \(no gradient for update {update + 1};|"
               rf"missing: none: every worker pushed for update {update} but no update came; "
               r"the chief \(worker 0\) runs the update loop and is missing")
    assert re.search(missing, error), error
    assert cluster.record("worker", other)["exit_code"] == EXIT_TIMEOUT
    assert not [line for line in survivor.lines if "went back" in line]
    assert processes_mentioning(cluster.marker) == []
