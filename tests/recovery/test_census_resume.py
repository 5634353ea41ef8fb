"""TensorFlow's census wide & deep program, migrated (examples/census/census.py), killed
whole mid-run (the launcher and every task, SIGKILL) and run again with the same --logdir:
the chief restores the last checkpoint, each worker starts its CSV input at the update it
resumes on, and the run ends verified synchronous with the Estimator's metrics."""

from __future__ import annotations

import subprocess
import sys

from procs import ROOT, kill_groups_mentioning, processes_mentioning, read_json
from sync_mnist.core.config import EXIT_OK

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
EXAMPLE = ROOT / "examples" / "census"
STEPS, SAVE = 200, 50


def _launch(processes, tmp_path, run: int):
    summary = tmp_path / f"cluster-{run}.json"
    launcher = processes.launcher(
        "--model", f"{EXAMPLE / 'census.py'}:MODEL", "--data-dir",
        str(tmp_path / "census_data"), "--base-port", "0", "--isolate", "off", "--workers", "2",
        "--train-steps", str(STEPS), "--batch-size", "40",
        "--save-steps", str(SAVE), "--log-every", "10", "--timeout", "60",
        "--logdir", str(tmp_path / "model"), "--summary-json", str(summary))
    return launcher, summary


def test_the_census_program_killed_whole_resumes_from_its_checkpoint(processes, tmp_path):
    data = tmp_path / "census_data"
    subprocess.run([sys.executable, str(EXAMPLE / "write_census.py"), str(data),
                    "--train-rows", "4000", "--eval-rows", "1000"], check=True,
                   capture_output=True, timeout=60)

    launcher, _ = _launch(processes, tmp_path, 1)
    launcher.wait_for_line(r"\[worker 0\] step=120 ", BOUND)  # past the checkpoint of 100
    kill_groups_mentioning(str(tmp_path))
    assert launcher.wait(BOUND) != EXIT_OK
    assert processes_mentioning(str(tmp_path)) == []
    checkpoints = {p.name for p in (tmp_path / "model").glob("model.ckpt-*.index")}
    saved = max(int(name.split("-")[1].split(".")[0]) for name in checkpoints)
    assert 100 <= saved < STEPS, checkpoints

    launcher, summary = _launch(processes, tmp_path, 2)
    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(rf"\[worker 0\] ready after .*global_step {saved}; restored from "
                           r"the checkpoint", 1)
    launcher.wait_for_line(rf"\[worker 1\] starting my input at batch {saved} \(reading past",
                           1)
    record = read_json(summary)
    assert record["synchronous"] is True, record["verdict"]
    assert record["contributions"] == [STEPS, STEPS]
    assert {"accuracy", "auc", "label/mean"} <= set(record["test_metrics"])
    assert processes_mentioning(str(tmp_path)) == []
