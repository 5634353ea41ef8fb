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


def test_the_clicks_command_prints_its_own_lines_and_none_of_tensorflows(processes, tmp_path):
    import sys

    out = tmp_path / "clicks"
    run = processes.start([sys.executable, "-m", "sync_mnist.models.write_clicks", str(out),
                           "--model", "sync_mnist.models.ctr:SMALL", "--train-examples", "100",
                           "--eval-examples", "50", "--train-files", "1", "--format",
                           "tfrecord"], "sync-mnist-clicks")
    assert run.wait(120) == 0, run.output
    assert run.output.splitlines() == [  # no absl, oneDNN or CUDA start-up notes
        f"writing {out}/train-00000-of-00001.tfrecord",
        f"writing {out}/eval-00000-of-00001.tfrecord",
        f"wrote 100 training and 50 evaluation clicks into 1 + 1 files in {out} (0.0 MB); the "
        "evaluation's planted log-loss is 0.5691",
        f"train on them: sync-mnist-cluster --model sync_mnist.models.ctr:SMALL --data-dir {out}"]
