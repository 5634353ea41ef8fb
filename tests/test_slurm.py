"""Slurm: deploy/slurm/sync-mnist.sbatch run as written, with a stand-in for srun.

tests/fake_srun plays srun on one node (every task on "localhost", as with several tasks per
node on a real cluster): it starts the script's command once per rank with the variables srun
sets. Each task must find its own place through TensorFlow's SlurmClusterResolver, listen on
--base-port + its local id, and train in lockstep with the others.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from procs import free_run, processes_mentioning
from sync_mnist.config import EXIT_OK

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "deploy" / "slurm" / "sync-mnist.sbatch"
BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
STEPS = 20


def test_sbatch_script_runs_an_srun_step_in_lockstep(processes, tmp_path):
    ntasks = 3  # 1 ps + 2 workers, all on one node
    base = free_run(ntasks, within=(20000, 40000))  # the script's range
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").symlink_to(REPO / "tests" / "fake_srun")
    marker = str(tmp_path / "data")  # in every command line, to find leftovers
    logdir = tmp_path / "checkpoints"
    step = processes.start([
        "env", "-u", "TF_CONFIG", f"PATH={bindir}:/usr/bin:/bin", f"FAKE_SRUN_NTASKS={ntasks}",
        f"SLURM_JOB_ID={base - 20000}", f"SLURM_SUBMIT_DIR={REPO}",  # the script's base port
        "bash", str(SBATCH), "--dataset", "synthetic", "--train-steps", str(STEPS),
        "--timeout", "60", "--log-every", "10", "--data-dir", marker, "--logdir", str(logdir)],
        "sbatch")
    assert step.wait(BOUND) == EXIT_OK, step.output

    # Rank 0 became ps 0 and ranks 1-2 workers 0-1, each tagging its lines so.
    for tag in ("[ps 0]", "[worker 0]", "[worker 1]"):
        assert tag in step.output
    verdicts = re.findall(r"\[worker (\d)\] verdict: (.*)", step.output)
    assert sorted(w for w, _ in verdicts) == ["0", "1"]
    for _, verdict in verdicts:
        assert verdict.startswith(f"synchronous: each of {STEPS} updates averaged exactly one "
                                  "gradient from each of 2 workers"), verdict
    # The chief (rank 1) took --logdir from the arguments passed through the script.
    assert any(logdir.glob("model.ckpt-*.index")), list(logdir.iterdir())
    assert processes_mentioning(marker) == []
