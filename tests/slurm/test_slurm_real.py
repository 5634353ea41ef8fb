"""Slurm for real (`make test-slurm`): the shipped sbatch script, unchanged, under running daemons.

tests/slurm_cluster.py starts munged, slurmctld and slurmd on a temporary directory (installing
slurm-wlm and munge first where they are missing and this is root; otherwise every test here
is skipped, saying why). Each job is `sbatch --wait deploy/slurm/sync-mnist.sbatch`, with
sbatch options and script arguments only on the command line, and its JobState and ExitCode
are read back from slurmctld.

  - one node (named as `hostname -s` says): 1 ps + 3 workers; 2 ps + 4 workers; a rank killed
    mid-run; a bad argument; a job `scontrol requeue`d mid-run, which resumes where it
    stopped and completes verified;
  - two nodes, n9 and n10, each slurmd in network, UTS and mount namespaces of its own on a
    veth network: the script with its own defaults (2 nodes, 4 tasks), Slurm's node order
    (n9 before n10) differing from the order of their names as text.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

import slurm_cluster
from hand_cluster import checkpoint_steps
from procs import ROOT, free_run, processes_mentioning

BOUND = 240  # seconds a small job may take, queueing and sbatch's 2 s polls included
STEPS = 30


def _first_job_id(tasks: int, jobs: int) -> int:
    """A first job id whose jobs' ports are free here: the script listens from
    20000 + job id mod 20000, one port per task on a node."""
    return free_run(tasks + jobs, within=(20000, 40000)) - 20000


@pytest.fixture(scope="module")
def cluster():
    why = slurm_cluster.unavailable()
    if why:
        pytest.skip(f"no real Slurm here: {why}")
    with slurm_cluster.one_node(first_job_id=_first_job_id(tasks=6, jobs=8)) as running:
        yield running


def _job(cluster, tmp_path, sbatch_options, *args, steps=STEPS, timeout=120,
         data=("--dataset", "synthetic")):
    """Submits the shipped script; returns the job and the marker in its tasks' argv.
    `data`: the data options (a model file of the user's refuses those it has no param of)."""
    marker = str(tmp_path / "logdir")  # in every task's command line, to find leftovers
    return cluster.submit(sbatch_options, [
        *data, "--train-steps", str(steps), "--timeout", str(timeout), "--log-every", "10",
        "--logdir", marker, *args]), marker


def _verdicts(output: str) -> dict[str, str]:
    return dict(re.findall(r"\[worker (\d+)\] verdict: (.*)", output))


def _assert_verified(cluster, job, workers: int) -> None:
    """The job completed, and every worker printed a synchronous verdict of STEPS updates."""
    cluster.wait(job, BOUND)
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.output
    verdicts = _verdicts(job.output)
    assert sorted(verdicts) == [str(w) for w in range(workers)], job.output
    for verdict in verdicts.values():
        assert verdict.startswith(f"synchronous: each of {STEPS} updates averaged exactly one "
                                  f"gradient from each of {workers} workers"), verdict


def test_one_node_four_tasks_complete_in_lockstep(cluster, tmp_path):
    job, marker = _job(cluster, tmp_path, ["--nodes=1", "--ntasks=4", "--cpus-per-task=1"])
    _assert_verified(cluster, job, workers=3)
    assert "[ps 0] all 3 workers done" in job.output
    assert (tmp_path / "logdir" / "saved_model" / "saved_model.pb").is_file()
    assert processes_mentioning(marker) == []


def test_a_model_file_of_the_users_trains_in_lockstep(cluster, tmp_path):
    # The documented example model, kept outside the repository as a user keeps theirs.
    path = tmp_path / "elsewhere" / "my_model.py"
    path.parent.mkdir()
    shutil.copy(ROOT / "examples" / "your_model" / "my_model.py", path)
    job, marker = _job(cluster, tmp_path, ["--nodes=1", "--ntasks=4", "--cpus-per-task=1"],
                       "--model", f"{path}:MODEL", data=())
    _assert_verified(cluster, job, workers=3)
    assert re.search(r"\[worker 0\] test_accuracy=\S+ test_loss=\S+ on 500 evaluation "
                     r"examples \(accuracy=", job.output), job.output
    assert (tmp_path / "logdir" / "saved_model" / "saved_model.pb").is_file()
    assert processes_mentioning(marker) == []


def test_two_ps_and_four_workers(cluster, tmp_path):
    job, marker = _job(cluster, tmp_path, ["--nodes=1", "--ntasks=6", "--cpus-per-task=1"],
                       "--ps", "2")
    _assert_verified(cluster, job, workers=4)
    for ps in (0, 1):
        assert f"[ps {ps}] all 4 workers done" in job.output
    assert processes_mentioning(marker) == []


def _task_pid(marker: str, rank: int) -> int:
    """The pid of the job's task of this rank (its argv holds marker, its environment the
    rank)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes()
            if marker.encode() not in argv or b"sync_mnist" not in argv:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_PROCID={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no task of rank {rank} runs")


def test_a_rank_killed_mid_run_fails_the_job_at_once(cluster, tmp_path):
    timeout = 300  # the bound the others would wait out without --kill-on-bad-exit
    job, marker = _job(cluster, tmp_path, ["--nodes=1", "--ntasks=4", "--cpus-per-task=1"],
                       steps=100_000, timeout=timeout)
    job.wait_for_line(r"\[worker 1\] step=10 ", BOUND)  # rank 2, training
    killed_at = os.times().elapsed
    os.kill(_task_pid(marker, rank=2), signal.SIGKILL)
    cluster.wait(job, BOUND)
    after_kill = os.times().elapsed - killed_at
    assert job.state == "FAILED", job.output
    assert job.exit_code == f"{128 + signal.SIGKILL}:0", job.output  # srun: the highest code
    assert after_kill < timeout / 5, f"{after_kill:.0f} s after the kill:\n{job.output}"
    assert re.search(r"srun: error: \S+: task 2: Killed", job.output), job.output
    assert "verdict" not in job.output
    assert processes_mentioning(marker) == []


def test_a_bad_argument_is_exit_2_in_every_rank_and_in_the_job(cluster, tmp_path):
    job, marker = _job(cluster, tmp_path, ["--nodes=1", "--ntasks=4", "--cpus-per-task=1"],
                       "--batch-size", "0")
    cluster.wait(job, BOUND)
    assert (job.state, job.exit_code) == ("FAILED", "2:0"), job.output
    errors = re.findall(r"^error: (.*)$", job.output, re.MULTILINE)
    assert errors == ["--batch-size must be a positive integer, got 0"] * 4, job.output
    # srun's summary of how the tasks ended: every one of them by itself, with 2.
    ended = re.findall(r"srun: error: \S+: tasks? ([\d,-]+): (.*)", job.output)
    assert {how for _, how in ended} == {"Exited with exit code 2"}, job.output
    assert sorted(r for ranks, _ in ended for r in _ranks(ranks)) == [0, 1, 2, 3], job.output
    assert processes_mentioning(marker) == []


def _exits(output: str) -> dict[int, str]:
    """How srun says each rank ended: {rank: "Exited with exit code 143"}."""
    return {rank: how for ranks, how in re.findall(r"srun: error: \S+: tasks? ([\d,-]+): (.*)",
                                                   output) for rank in _ranks(ranks)}


def test_a_requeued_job_resumes_at_the_saved_update_and_completes_verified(cluster, tmp_path):
    # `scontrol requeue`, as Slurm preempts with PreemptMode=REQUEUE: SIGTERM to every task,
    # and to srun (the batch shell), which SIGKILLs the tasks about a second later: the stop
    # and the chief's save must beat that, as this synthetic model's do (docs/slurm.md). The
    # job goes back to the queue with the same id, so the script's own --logdir
    # runs/slurm-JOBID is the same.
    steps, grace = 300, 25
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    at = rng.randrange(20, 110, 10)
    marker = str(tmp_path / "data")
    job = cluster.submit(["--nodes=1", "--ntasks=4", "--cpus-per-task=1"], [
        "--dataset", "synthetic", "--train-steps", str(steps), "--timeout", "60",
        "--log-every", "10", "--data-dir", marker, "--save-steps", "100000",
        "--preempt-grace", str(grace)])
    logdir = ROOT / "runs" / f"slurm-{job.id}"
    try:
        job.wait_for_line(rf"\[worker 0\] step={at} ", BOUND)
        requeued = time.monotonic()
        cluster.run(["scontrol", "requeue", str(job.id)])
        # Back in the queue once every task has ended: within the grace, each by itself.
        cluster.wait_for_state(job, "PENDING", grace + 10)
        took = time.monotonic() - requeued
        first = job.output
        assert took < grace, (seed, f"{took:.1f} s", first)
        assert _exits(first) == {r: "Exited with exit code 143" for r in range(4)}, (seed, first)
        stops = set(re.findall(r"\[worker \d\] warning: preempted: the cluster stopped on "
                               rf"update (\d+) of {steps};", first))
        assert len(stops) == 1, (seed, first)
        stop = int(stops.pop())
        assert at < stop < steps, (seed, first)
        assert checkpoint_steps(logdir)[-1] == stop, (seed, first)  # the chief saved it
        # No task left (sbatch --wait, whose argv has the marker too, waits on).
        assert [p for p in processes_mentioning(marker) if "sync_mnist" in p] == []
        # Slurm holds a requeued job back for about two minutes (its BeginTime): start it now.
        cluster.run(["scontrol", "update", f"JobId={job.id}", "StartTime=now"])
        cluster.wait(job, BOUND)
        second = job.output[len(first):]  # --open-mode=append: the first run's output stays
        assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), (seed, second)
        assert re.search(rf"\[worker 0\] ready after .*\(global_step {stop}; restored from "
                         r"the checkpoint in ", second), (seed, second)
        verdicts = _verdicts(second)
        assert sorted(verdicts) == ["0", "1", "2"], (seed, second)
        for verdict in verdicts.values():  # 0 updates lost, 0 made twice, over both runs
            assert verdict.startswith(f"synchronous: each of {steps} updates averaged exactly "
                                      "one gradient from each of 3 workers"), (seed, verdict)
            assert verdict.endswith(f"contributions [{steps}, {steps}, {steps}]"), (seed, verdict)
        assert processes_mentioning(marker) == []
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _ranks(text: str) -> list[int]:
    """srun's "0-1,3" as [0, 1, 3]."""
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


# Two hosts, each a network namespace on the testbed's veth network: the controller's and one per
# node. The testbed names its namespaces after tasks; here each is a host.
HOSTS = {"n9": ("worker", 0), "n10": ("worker", 1), "ctl": ("ps", 0)}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    from lab import testbed

    why = slurm_cluster.unavailable()
    if why:
        pytest.skip(f"no real Slurm here: {why}")
    try:
        testbed.check(cpu=False)
    except testbed.Unavailable as e:
        pytest.skip(f"no network namespaces for two Slurm nodes here: {e}")
    with testbed.Testbed(num_ps=1, num_workers=2) as bed:
        # /etc/hosts on each node (a bind mount in its own mount namespace): the tasks reach
        # each other by node name, as the resolver gives them.
        hosts_file = tmp_path_factory.mktemp("hosts") / "hosts"
        hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
            f"{bed.address[task]} {name}\n" for name, task in HOSTS.items()))
        # Each in a UTS namespace too: slurmd and slurmctld check their hostname.
        n9, n10, ctl = [slurm_cluster.Node(name, bed.address[task], slurm_cluster.namespaced_entry(
            bed.namespace[task], name, hosts_file)) for name, task in HOSTS.items()]
        with slurm_cluster.SlurmCluster([n9, n10], ctl, first_job_id=1) as running:
            yield running


def test_the_script_with_its_defaults_on_two_nodes_in_slurm_order(two_nodes, tmp_path):
    # The script's own --nodes=2 --ntasks=4 --cpus-per-task=2: ranks 0-1 on n9, 2-3 on n10.
    # As text "n10" sorts before "n9"; Slurm's order is n9, n10.
    job, marker = _job(two_nodes, tmp_path, [])
    two_nodes.wait(job, BOUND)
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.output
    base = 20000 + job.id % 20000
    assert f"[ps 0] serving n9:{base};" in job.output, job.output  # rank 0
    verdicts = _verdicts(job.output)
    assert sorted(verdicts) == ["0", "1", "2"], job.output
    for verdict in verdicts.values():
        assert verdict.startswith(f"synchronous: each of {STEPS} updates averaged exactly one "
                                  "gradient from each of 3 workers"), verdict
    assert (tmp_path / "logdir" / "saved_model" / "saved_model.pb").is_file()
    assert processes_mentioning(marker) == []
