"""The TFJob's image, built here, and its pods as containers (podman_cluster.py says how).

The pods are the operator's: named `<job>-ps-0`, `<job>-worker-0`, ..., each reached at
`<job>-<type>-<i>.<namespace>.svc:2222` (a network alias) and given the TF_CONFIG the operator
writes; each runs the image's default command, with no arguments (the manifest's args are the
same: tests/fast/test_tfjob.py); one volume at /checkpoints, the --logdir, in every one, as
the manifest's ReadWriteMany claim. The default command trains the shipped MNIST for 5 epochs
(1000 synchronous updates of 3 workers), about 25 s here.
"""

from __future__ import annotations

import json
import re
import time

import pytest

import podman_cluster
from procs import operator_tf_config

NAMESPACE = "default"
PORT = 2222  # the operator's tfjob-port; each container has a network namespace of its own
STEPS = 1000  # the image's CMD: --epochs 5 of 20,000 digits per worker, batch 100
RUN_SECS = 300  # a whole run, start to every container's exit (about 30 s here)
READY_SECS = 120  # a container's start to its "ready after" line


@pytest.fixture(scope="module")
def podman():
    why = podman_cluster.unavailable()
    if why:
        pytest.skip(f"no podman here: {why}")
    runner = podman_cluster.Podman()
    try:
        runner.build_image()
        yield runner
    finally:
        runner.close()
    left = runner.leftovers()
    assert left == [], f"left on the host after the tier: {left}"


class TFJob:
    """1 ps + 3 workers of a TFJob named `name`, as the operator would lay them out: one
    network, one volume for /checkpoints; `close` removes every container it started, the
    network and the volume, and checks that none of them is left."""

    def __init__(self, podman: podman_cluster.Podman, name: str):
        self.podman, self.name = podman, name
        self.spec = {"ps": [self.host("ps", 0)],
                     "worker": [self.host("worker", i) for i in range(3)]}
        self.network = podman.network(f"{name}-net")
        self.volume = podman.volume(f"{name}-checkpoints")
        self.started: list[podman_cluster.Container] = []

    def host(self, task_type: str, index: int) -> str:
        return f"{self.name}-{task_type}-{index}.{NAMESPACE}.svc:{PORT}"

    def start(self, task_type: str, index: int) -> podman_cluster.Container:
        """The pod of task_type index: the image's default command, nothing more."""
        pod = f"{self.name}-{task_type}-{index}"
        container = self.podman.run(
            pod, "--network", self.network, "--network-alias", f"{pod}.{NAMESPACE}.svc",
            "--volume", f"{self.volume}:/checkpoints",
            "--env", f"TF_CONFIG={operator_tf_config(self.spec, task_type, index)}")
        self.started.append(container)
        return container

    def close(self) -> None:
        podman = self.podman
        podman.remove(*self.started)
        podman("network", "rm", "--force", self.network, check=False)
        podman("volume", "rm", "--force", self.volume, check=False)
        ids = set(podman("ps", "--all", "--quiet", "--no-trunc").stdout.split())
        assert not ids & {c.id for c in self.started}, "a container is left"
        assert self.network not in podman("network", "ls", "--format", "{{.Name}}").stdout.split()
        assert self.volume not in podman("volume", "ls", "--format", "{{.Name}}").stdout.split()


def _verdict(container: podman_cluster.Container) -> tuple[str, list[int]]:
    """The worker's verdict line and the contributions it names."""
    match, _ = container.wait_for_line(r"\] verdict: (\w[\w ]*):.*contributions \[([\d, ]+)\]",
                                       RUN_SECS)
    return match[1], [int(n) for n in match[2].split(",")]


def _global_step_at_least(n: int):
    return lambda match: int(match[1]) >= n


def test_the_image_runs_as_uid_1000_under_tini_with_the_mnist_and_the_tfjob_command(podman):
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}",
                               podman_cluster.IMAGE).stdout)
    assert config["User"] == "1000"
    assert config["Entrypoint"] == ["tini", "--"]
    assert config["Cmd"] == ["sync-mnist", "--epochs", "5", "--timeout", "300",
                             "--logdir", "/checkpoints"]
    out = podman("run", "--rm", "--network", "none", podman_cluster.IMAGE, "sh", "-c",
                 "id -u; stat -c %u /checkpoints; python -c 'from sync_mnist.models import data; "
                 "data.check_shipped(); print(len(list(data.SHIPPED_DIR.glob(\"*.gz\"))))'")
    assert out.stdout.split() == ["1000", "1000", "4"], out  # uid, /checkpoints' owner, files


@pytest.mark.parametrize("when", ["while it serves", "as it starts"])
def test_podman_stop_ends_a_task_at_once(podman, when):
    # SIGTERM, as the kubelet sends it, reaches the task through tini: a ps waiting for
    # workers that never came has no update to stop on, and ends with 143 (preempted, retried
    # under restartPolicy ExitCode) well within the 10 s grace after which SIGKILL would come
    # (137). Stopped as it starts (Python starting, TensorFlow loading), it ends as soon, 143
    # too (tini passes it on; a task that is PID 1 itself would ignore it).
    spec = {"ps": [f"alone-ps-0:{PORT}"], "worker": [f"absent-worker-0:{PORT}"]}
    container = podman.run(f"stop-{when.split()[0]}", "--network", "none",
                           "--env", f"TF_CONFIG={operator_tf_config(spec, 'ps', 0)}")
    try:
        if when == "while it serves":
            container.wait_for_line(r"\[ps 0\] serving", READY_SECS)
        started = time.monotonic()
        container.stop(grace=10)
        took = time.monotonic() - started
        code = container.wait(podman_cluster.COMMAND_SECS)
    finally:
        podman.remove(container)
    podman_cluster.FIGURES[f"podman stop {when}"] = f"exit {code} after {took:.1f} s"
    assert code == 143, container
    assert took < 5, f"stopped after {took:.1f} s: the SIGTERM did not end the task"


def test_a_tfjob_in_containers_trains_in_lockstep(podman):
    job = TFJob(podman, "sync-mnist")
    try:
        started = time.monotonic()
        ps = job.start("ps", 0)
        workers = [job.start("worker", i) for i in range(3)]
        _, chief_ready = workers[0].wait_for_line(r"\[worker 0\] ready after", READY_SECS)
        codes = {c.name: c.wait(RUN_SECS) for c in (*workers, ps)}
        took = time.monotonic() - started
        verdicts = [_verdict(w) for w in workers]
        saved = podman("run", "--rm", "--network", "none", "--volume",
                       f"{job.volume}:/checkpoints", podman_cluster.IMAGE,
                       "ls", "/checkpoints/saved_model").stdout.split()
    finally:
        job.close()
    podman_cluster.FIGURES["cluster start to the chief ready"] = f"{chief_ready:.1f} s"
    podman_cluster.FIGURES["a TFJob's run, start to every exit"] = f"{took:.0f} s"
    assert codes == {c.name: 0 for c in (*workers, ps)}, codes
    assert verdicts == [("synchronous", [STEPS] * 3)] * 3, verdicts
    assert "saved_model.pb" in saved, saved


def test_a_worker_container_killed_mid_run_is_started_again_and_rejoins(podman):
    # A pod that dies is made again by the operator under restartPolicy ExitCode when its code
    # is 128-255: here SIGKILL (137), as a lost node or an OOM kill. The new container has the
    # same name, alias and TF_CONFIG, and a new address; the others wait for it (bounded by
    # --timeout 300) and the run ends verified, every container 0.
    job = TFJob(podman, "sync-mnist-restart")
    try:
        ps = job.start("ps", 0)
        workers = [job.start("worker", i) for i in range(3)]
        workers[1].wait_for_line(r"\[worker 1\] step=\d+ global_step=(\d+)/", READY_SECS + 60,
                                 accept=_global_step_at_least(200))
        workers[1].kill()
        killed_code = workers[1].wait(podman_cluster.COMMAND_SECS)
        podman.remove(workers[1])
        again = job.start("worker", 1)
        _, ready = again.wait_for_line(r"\[worker 1\] ready after", READY_SECS)
        workers[1] = again
        codes = {c.name: c.wait(RUN_SECS) for c in (*workers, ps)}
        verdicts = [_verdict(w) for w in workers]
        rejoined = again.logs()
    finally:
        job.close()
    podman_cluster.FIGURES["a killed worker's new container, start to ready"] = f"{ready:.1f} s"
    assert killed_code == 137
    assert codes == {c.name: 0 for c in (*workers, ps)}, codes
    assert verdicts == [("synchronous", [STEPS] * 3)] * 3, verdicts
    # It joined a run under way: its first progress line is past the step it was killed at.
    first = re.search(r"\[worker 1\] step=\d+ global_step=(\d+)/", rejoined)
    assert first and int(first[1]) > 200, rejoined
