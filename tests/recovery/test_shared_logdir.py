"""Where checkpoints live across hosts: --logdir is storage every ps and the chief share.

The chief's saver is sharded: each ps writes its own variables' shard to its own filesystem.
Here a ps runs in a mount namespace of its own with a private tmpfs at the --logdir path, so
that, as on two hosts without a shared filesystem, the ps and the chief each see a directory
of their own at that path (root only: `unshare --mount`). The chief must refuse to train on at
its first save (exit 2, saying what --logdir must be), not run on with checkpoints it could
never restore. And one --logdir serves one running cluster: a second chief on it is refused.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from procs import free_run
from sync_mnist.core.config import EXIT_USAGE

BOUND = 180  # seconds for a task to start TensorFlow and get as far as its first save
NOT_SHARED = ("so --logdir must be storage that every ps and the chief share, at the same path")


def _hosts(num_ps: int, num_workers: int) -> list[str]:
    base = free_run(num_ps + num_workers)
    ports = [f"localhost:{p}" for p in range(base, base + num_ps + num_workers)]
    return ["--ps-hosts", ",".join(ports[:num_ps]), "--worker-hosts", ",".join(ports[num_ps:])]


def _task_argv(role: str, index: int, hosts: list[str], logdir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sync_mnist", "--role", role, "--index", str(index), *hosts,
            "--dataset", "synthetic", "--train-steps", "20", "--timeout", "60",
            "--logdir", str(logdir), *extra]


def _in_own_mount_namespace(argv: list[str], logdir) -> list[str]:
    """argv run with a private tmpfs mounted at logdir, seen by it alone."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs sync-mnist-test "$0" && exec "$@"', str(logdir), *argv]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare(1) for a ps with a mount namespace of its own")
@pytest.mark.parametrize("num_ps, reason", [
    # The ps wrote the whole checkpoint, on its own filesystem; the chief has only its own file.
    (1, "(the chief cannot read model.ckpt-0: "),
    # The last ps merges every ps's shard, and finds none of the first ps's on its filesystem.
    (2, "(the last ps cannot find {logdir}/model.ckpt-0_temp/part-00000-of-00002, another "
        "ps's shard, to merge the checkpoint)"),
], ids=["the only ps", "the last of two ps"])
def test_a_logdir_the_ps_does_not_share_is_exit_2_at_the_first_save(num_ps, reason, processes,
                                                                    tmp_path):
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    hosts = _hosts(num_ps, 1)
    for p in range(num_ps):
        argv = _task_argv("ps", p, hosts, logdir)
        processes.start(_in_own_mount_namespace(argv, logdir) if p == num_ps - 1 else argv,
                        f"ps {p}")
    chief = processes.start(_task_argv("worker", 0, hosts, logdir), "worker 0")
    assert chief.wait(BOUND) == EXIT_USAGE, chief.output
    errors = [line for line in chief.output.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].endswith(NOT_SHARED), chief.output
    assert f"--logdir {logdir}: the checkpoint just saved is not complete where the chief " \
           f"restores from {reason.format(logdir=logdir)}" in errors[0], errors[0]
    assert "verdict" not in chief.output  # it trained on no further


def test_a_logdir_in_use_by_a_running_cluster_is_refused(processes, tmp_path):
    logdir = tmp_path / "logdir"
    # The first cluster's chief, waiting for its ps (never started), holds the logdir.
    first = processes.start(_task_argv("worker", 0, _hosts(1, 1), logdir), "first chief")
    first.wait_for_line(r"\[worker 0\] dataset synthetic", BOUND)
    second = processes.start(_task_argv("worker", 0, _hosts(1, 1), logdir), "second chief")
    assert second.wait(BOUND) == EXIT_USAGE, second.output
    pid = first.popen.pid
    assert second.output.splitlines() == [
        f"error: --logdir {logdir} is in use by a running cluster (the chief, pid {pid} on "
        f"{os.uname().nodename}, holds {logdir / '.sync-mnist.lock'}); give each cluster a "
        "--logdir of its own"], second.output
    # Once the first cluster is gone, the logdir is free again: the kernel drops the lock.
    first.kill()
    third = processes.start(_task_argv("worker", 0, _hosts(1, 1), logdir, "--timeout", "1"),
                            "third chief")
    third.wait_for_line(r"\[worker 0\] dataset synthetic", BOUND)
