"""A streamed input through the real command line (core/stream.py): TFRecord files cut by file
over the workers, of unequal length, and the cluster's agreed stop where the first worker's
input ends: verified, no timeout, every example used at most once (tests/stream_model.py
counts each example's uses in the model itself)."""

from __future__ import annotations

import tensorflow as tf

import stream_model
from procs import processes_mentioning, read_json
from sync_mnist.core.config import EXIT_OK

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine


def test_uneven_shards_stop_where_the_first_worker_s_input_ends(processes, tmp_path):
    # Worker 0 reads files 0 and 2 (ids 0-59, 100-159: 120 examples), worker 1 files 1 and 3
    # (ids 60-99, 160-203: 84 examples, 30% fewer): 21 batches of 4 for worker 1.
    spec = stream_model.place(tmp_path / "data", [60, 40, 60, 44])
    logdir, summary = tmp_path / "logdir", tmp_path / "cluster.json"
    launcher = processes.launcher(
        "--model", spec, "--base-port", "0", "--isolate", "off", "--workers", "2",
        "--epochs", "1", "--batch-size", "4", "--log-every", "5", "--timeout", "60",
        "--logdir", str(logdir), "--summary-json", str(summary))

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"\[worker 1\] my input ends with batch 20: asking the cluster to "
                           r"stop on the update its gradient joins \(21\)", 1)
    launcher.wait_for_line(r"\[worker 0\] dataset .*: streamed, sharded by file", 1)
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [21, 21]
    assert {t["stop_step"] for t in record["tasks"] if t["role"] == "worker"} == {21}
    assert all(t["exit_code"] == EXIT_OK for t in record["tasks"])
    uses = stream_model.uses(tf.train.latest_checkpoint(str(logdir)), 2)
    assert uses[60:100].tolist() == [1] * 40 and uses[160:204].tolist() == [1] * 44
    # Worker 0's stream: its first 84 examples, then the cluster stopped.
    assert uses[0:60].tolist() == [1] * 60 and uses[100:124].tolist() == [1] * 24
    assert uses[124:160].tolist() == [0] * 36 and uses[204:].sum() == 0
    assert processes_mentioning(str(tmp_path)) == []
