"""Preemption (issue 35): SIGTERM to one task, or to every task at once, at a random update.

The cluster stops on one update that every task agrees on, the chief saves it, every task
exits 143 within --preempt-grace, and the rerun with the same --logdir resumes at exactly that
update: over the preempted runs and the last one, every update is made once, with one
gradient of each worker (0 lost, 0 twice). The signals go to the task processes by pid, as
Kubernetes sends each pod its SIGTERM. The first run saves at every update, so its signal
lands during a save or next to one; the second sends every task two SIGTERMs in a row; the
last sends the chief one during its finish, which changes nothing: the run ends complete.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time

from hand_cluster import BOUND, COMMON, checkpoint_steps
from procs import processes_mentioning, read_json
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import EXIT_OK, EXIT_PREEMPTED

STEPS, WORKERS, GRACE = 300, 2, 25.0


def _launch(processes, tmp_path, run: int, *extra: str):
    marker = str(tmp_path / "data")
    summary = tmp_path / f"cluster-{run}.json"
    launcher = processes.launcher("--base-port", "0", "--workers", str(WORKERS), *COMMON,
                                  "--data-dir", marker, "--train-steps", str(STEPS),
                                  "--timeout", "60", "--logdir", str(tmp_path / "logdir"),
                                  "--preempt-grace", f"{GRACE:g}", "--summary-json", str(summary),
                                  *(extra or ("--save-steps", "1000")))
    pids = {}
    for task in ["ps 0", *(f"worker {i}" for i in range(WORKERS))]:
        pids[task] = int(launcher.wait_for_line(rf"started {task} \(pid (\d+)\)", BOUND)[1])
    return launcher, pids, summary, marker


def _preempt(processes, tmp_path, run: int, start: int, steps: int, victims, *extra) -> int:
    """Runs the cluster (from update `start`), signals `victims(pids)` once the chief has made
    `steps` steps; returns the update the cluster stopped on, checked."""
    launcher, pids, summary, marker = _launch(processes, tmp_path, run, *extra)
    launcher.wait_for_line(rf"\[worker 0\] step={steps} ", BOUND)
    signalled = time.monotonic()
    for pid in victims(pids):
        os.kill(pid, signal.SIGTERM)

    assert launcher.wait(BOUND) == EXIT_PREEMPTED, launcher.output
    assert time.monotonic() - signalled < GRACE, launcher.output
    record = read_json(summary)
    stop = record["preempted_at"]
    assert start + steps < stop < STEPS, launcher.output
    # Every task stopped on the same update, and exited 143 by itself.
    assert [t["exit_code"] for t in record["tasks"]] == [EXIT_PREEMPTED] * (WORKERS + 1)
    assert {t["last_token"] for t in record["tasks"] if t["role"] == "worker"} == {stop}
    assert record["contributions"] == [stop] * WORKERS and record["synchronous"] is True
    # The chief saved that update, and the launcher says how to go on.
    assert checkpoint_steps(tmp_path / "logdir")[-1] == stop
    assert f"preempted: every worker stopped on update {stop} of {STEPS} planned" in \
        launcher.output
    assert processes_mentioning(marker) == []
    return stop


def test_preempted_one_task_then_every_task_the_reruns_lose_no_update(processes, tmp_path):
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    victim = rng.choice(["ps 0", *(f"worker {i}" for i in range(WORKERS))])
    first = _preempt(processes, tmp_path, 1, 0, rng.randrange(20, 100, 10),
                     lambda pids: [pids[victim]], "--save-steps", "1")
    # The rerun resumes there; this time every task is sent SIGTERM twice, all at once.
    second = _preempt(processes, tmp_path, 2, first, rng.randrange(20, 100, 10),
                      lambda pids: [*pids.values(), *pids.values()])
    launcher, pids, summary, _ = _launch(processes, tmp_path, 3)
    launcher.wait_for_line(r"\[worker 1\] verdict: ", BOUND)  # the chief is finishing
    os.kill(pids["worker 0"], signal.SIGTERM)

    assert launcher.wait(BOUND) == EXIT_OK, (seed, victim, launcher.output)
    assert checkpoint_steps(tmp_path / "logdir")[-1] == STEPS
    record = read_json(summary)
    chief = next(t for t in record["tasks"] if (t["role"], t["index"]) == ("worker", 0))
    assert chief["start_step"] == second > first, (seed, victim)
    assert re.search(rf"\[worker 0\] .*ready after .*\(global_step {second}; restored from the "
                     "checkpoint", launcher.output), launcher.output
    # 0 lost, 0 twice: each update averaged one gradient of each worker, over the three runs.
    assert record["contributions"] == [STEPS] * WORKERS, (seed, victim)
    assert record["synchronous"] is True and record["global_step"] == STEPS
    assert [t["local_steps"] for t in record["tasks"] if t["role"] == "worker"] == \
        [STEPS - second] * WORKERS


def test_preempted_before_it_trains_a_task_exits_143_at_once(processes, tmp_path):
    # The chief, about to wait for a ps that is not there yet (start-up): there is no update
    # to agree on. Without --logdir it says at once what a preemption would cost.
    ps, *workers = free_ports(3)
    record = tmp_path / "chief.json"
    task = processes.task("worker", 0, "--ps-hosts", f"127.0.0.1:{ps}", "--worker-hosts",
                          ",".join(f"127.0.0.1:{p}" for p in workers), *COMMON,
                          "--train-steps", "5", "--summary-json", str(record))
    task.wait_for_line(r"\[worker 0\] no --logdir: nothing is saved, so a preemption "
                       r"\(SIGTERM\) or a lost ps loses the training done so far", BOUND)
    signalled = time.monotonic()
    os.kill(task.popen.pid, signal.SIGTERM)

    assert task.wait(BOUND) == EXIT_PREEMPTED, task.output
    assert time.monotonic() - signalled < 10, task.output
    assert task.lines[-1].endswith("[worker 0] error: interrupted"), task.output
    assert read_json(record)["exit_code"] == EXIT_PREEMPTED
