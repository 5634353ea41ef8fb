"""A model of the user's own, in a file outside the repository, under the launcher with a
worker killed and restarted: verified, its own metric, and a SavedModel of its own signature.

The model file is the documented example (examples/your_model/my_model.py), copied to the
test's temporary directory as a user would keep it (tests/cluster/test_your_model.py).
"""

from __future__ import annotations

import os
import signal

from tensorflow.core.protobuf import saved_model_pb2

from procs import processes_mentioning, read_json, your_model_file
from sync_mnist.core.config import EXIT_OK

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine


def test_a_model_file_trains_verified_and_a_killed_worker_rejoins(processes, tmp_path):
    spec, steps = your_model_file(tmp_path), 150
    launcher = processes.launcher(
        "--model", spec, "--base-port", "0", "--isolate", "off", "--workers", "2",
        "--train-steps", str(steps), "--log-every", "10", "--timeout", "60",
        "--max-restarts", "1", "--logdir", str(tmp_path / "logdir"),
        "--summary-json", str(tmp_path / "cluster.json"))
    pid = int(launcher.wait_for_line(r"started worker 1 \(pid (\d+)\)", BOUND)[1])
    launcher.wait_for_line(r"\[worker 1\] step=20 ", BOUND)
    os.kill(pid, signal.SIGKILL)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"worker 1 exited with code -9; restarting it", 1)
    summary = read_json(tmp_path / "cluster.json")
    assert summary["synchronous"] is True, summary["verdict"]
    assert summary["contributions"] == [steps, steps]
    assert summary["model"] == spec
    # The model's own metric, on its own evaluation data (4 classes: chance is 0.25).
    assert summary["test_metrics"]["accuracy"] == summary["test_accuracy"] > 0.9
    # The SavedModel serves the model's own predictions, from its features as trained.
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((tmp_path / "logdir" / "saved_model" / "saved_model.pb").read_bytes())
    signature = saved.meta_graphs[0].signature_def["serving_default"]
    assert set(signature.inputs) == {"features"}
    assert set(signature.outputs) == {"classes", "probabilities"}
    assert processes_mentioning(str(tmp_path)) == []
