"""The click model from files through the real command line: `sync-mnist-clicks` writes the
SMALL model's clicks (Criteo's TSV), and `sync-mnist-cluster --model
sync_mnist.models.ctr:SMALL --data-dir DIR` trains 3 workers on them, cut by file: verified
synchronous, its log-loss near the planted model's, which clicks.json lets the evaluation
report.

The files hold the 40,000 clicks SMALL draws in memory (clickwriter.py). One epoch, 133 updates:
in memory the same run ended 7.8% above the planted log-loss, from these clicks 8.9% (0.5887
against 0.5407, from TSV and from TFRecords alike; 5 December 2026); within 2% needs the full
ctr model and its 600,000 clicks, a run too long for a test: docs/sparse.md has it, from files
and from memory, with its command.
TFRecords are read in the same cluster (the same Stream, another parse) by
tests/cluster/test_your_data.py and tests/cluster/test_stream_runs.py; both formats' parsing,
line by line, in tests/inprocess/test_click_files_reading.py."""

from __future__ import annotations

import pytest

from procs import processes_mentioning, read_json
from sync_mnist.core.config import EXIT_OK
from sync_mnist.models import ctr, write_clicks

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
SMALL = "sync_mnist.models.ctr:SMALL"
# log-loss / planted after one epoch of SMALL (in memory: 1.078). Run by pytest it varies from
# run to run, on the code before issue 55's work as after: 0.5847, 0.5956, 0.5984 and 0.5914
# there, 0.5811 to 0.6327 here (7 December 2026), where the same command run by hand gives
# 0.5812 every time; 1.10 failed 2 runs in 4. Why it varies is not known (an issue). A
# model that says 0.5 for every click scores 0.693, 1.28 times the planted.
WITHIN = 1.20


def test_three_workers_train_on_click_files_verified(processes, tmp_path):
    data = tmp_path / "clicks"
    assert write_clicks.main([str(data), "--model", SMALL, "--format", "tsv",
                          "--train-files", "6"]) == 0
    summary = tmp_path / "cluster.json"
    launcher = processes.launcher(
        "--model", SMALL, "--data-dir", str(data), "--base-port", "0", "--isolate", "off",
        "--workers", "3", "--epochs", "1", "--log-every", "50", "--timeout", "60",
        "--summary-json", str(summary))
    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"\[worker 2\] dataset .*/clicks: streamed, sharded by file", 1)
    record = read_json(summary)
    updates = ctr.SMALL.params["train_examples"] // 300  # 2 files of 6,667 clicks a worker
    assert record["synchronous"] is True and record["contributions"] == [updates] * 3
    metrics = record["test_metrics"]
    planted = read_json(data / "clicks.json")["eval"]["planted_log_loss"]
    assert metrics["planted_log_loss"] == pytest.approx(planted, rel=1e-5)
    assert metrics["log_loss"] < WITHIN * planted, metrics
    assert processes_mentioning(str(tmp_path)) == []
