"""The click model pointed at files through the real command line: a pattern that matches
nothing ends the launcher with exit 2 and one line, before any task starts. Training on click
files: tests/cluster/test_your_data.py and test_stream_runs.py (TFRecords), and the SMALL
model's epoch from Criteo's TSV to near its planted log-loss in tests/convergence."""

from __future__ import annotations

from sync_mnist.core.config import EXIT_USAGE


def test_a_pattern_that_matches_nothing_exits_2_before_any_task(processes, tmp_path):
    launcher = processes.launcher(
        "--model", "ctr", "--train-files", str(tmp_path / "day_*.gz"), "--eval-files",
        str(tmp_path / "day_23.gz"), "--base-port", "0", "--isolate", "off")
    assert launcher.wait(60) == EXIT_USAGE
    lines = [line for line in launcher.output.splitlines() if line.strip()]
    assert lines == [f"error: no training clicks: no file matches {tmp_path}/day_*.gz"], lines
