"""The chaos soak stopped from outside: nothing of its current run may outlive it."""

from __future__ import annotations

import os
import signal
import sys
import time

from procs import kill_groups_mentioning, processes_mentioning
from sync_mnist.core.config import EXIT_INTERRUPTED

BOUND = 120  # seconds for a run's tasks to start, or the soak to end, on a loaded machine
GONE = 15  # seconds for processes sent SIGKILL to be gone


def _wait_until(condition, bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound} s: {what}"
        time.sleep(0.2)


def test_chaos_sent_sigterm_mid_run_exits_130_and_leaves_no_task_of_its_run(processes,
                                                                           tmp_path):
    # Each run's tasks carry its marker, a path in the soak's temporary directory (TMPDIR).
    marker = f"{tmp_path}/sync-mnist-chaos-"
    chaos = processes.start(["env", f"TMPDIR={tmp_path}", sys.executable, "-m",
                             "lab.chaos", "--runs", "1", "--seed", "0",
                             "--train-steps", "100000", "--json", str(tmp_path / "c.json")],
                            "chaos")
    try:
        # The launcher and at least one of its tasks.
        _wait_until(lambda: len(processes_mentioning(marker)) >= 2, BOUND,
                    "the run's tasks started")
        os.kill(chaos.popen.pid, signal.SIGTERM)
        assert chaos.wait(BOUND) == EXIT_INTERRUPTED, chaos.output
        assert "interrupted" in chaos.output
        _wait_until(lambda: processes_mentioning(marker) == [], GONE,
                    f"the run's processes gone: {processes_mentioning(marker)}")
    finally:
        kill_groups_mentioning(marker)
