"""The chaos soak stopped from outside: nothing of its current runs may outlive it."""

from __future__ import annotations

import os
import signal
import sys
import time

from procs import kill_groups_mentioning, processes_mentioning
from sync_mnist.core.config import EXIT_INTERRUPTED

from lab import chaos as chaos_lib

BOUND = 120  # seconds for a run's tasks to start, or the soak to end, on a loaded machine
GONE = 15  # seconds for processes sent SIGKILL to be gone
# Signals only: the network and disk kinds need root, nftables and iptables.
SIGNALS_ONLY = ("--skip", ",".join(chaos_lib.NETWORK_FAULTS + chaos_lib.DISK_FAULTS))


def _wait_until(condition, bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound} s: {what}"
        time.sleep(0.2)


def _stopped_mid_run(processes, tmp_path, args: list[str], running: list[str],
                     bound: float) -> None:
    """Starts the soak with `args`, waits until a task of each run in `running` ("run-2")
    has started, sends it SIGTERM: it must end 130 and leave no process of any run."""
    # Each run's tasks carry its marker, a path in the soak's temporary directory (TMPDIR).
    marker = f"{tmp_path}/sync-mnist-chaos-"
    chaos = processes.start(["env", f"TMPDIR={tmp_path}", sys.executable, "-m",
                             "lab.chaos", *args, "--json", str(tmp_path / "c.json")],
                            "chaos")
    try:
        for run in running:  # the launcher and at least one of its tasks
            _wait_until(lambda: sum(f"/{run}-marker" in p
                                    for p in processes_mentioning(marker)) >= 2, bound,
                        f"the tasks of {run} started")
        os.kill(chaos.popen.pid, signal.SIGTERM)
        assert chaos.wait(BOUND) == EXIT_INTERRUPTED, chaos.output
        assert "interrupted" in chaos.output
        _wait_until(lambda: processes_mentioning(marker) == [], GONE,
                    f"the run's processes gone: {processes_mentioning(marker)}")
    finally:
        kill_groups_mentioning(marker)


def test_chaos_sent_sigterm_mid_run_exits_130_and_leaves_no_task_of_its_run(processes,
                                                                           tmp_path):
    _stopped_mid_run(processes, tmp_path, ["--runs", "1", "--seed", "0", "--train-steps",
                                           "100000", *SIGNALS_ONLY], ["run-1"], BOUND)


def test_chaos_short_sent_sigterm_during_a_replay_leaves_no_task_of_it_or_its_load(
        processes, tmp_path):
    # Only kill: run 1 draws it, run 2 replays the ps killed at the finish, beside run 3, the
    # first fault-free run of its load.
    others = ",".join(kind for kind in chaos_lib.FAULTS if kind != "kill")
    _stopped_mid_run(processes, tmp_path, ["--short", "--skip", others],
                     ["run-2", "run-3"], 3 * BOUND)
