"""What a process checks before it imports TensorFlow, whose start-up takes seconds.

Each failure here is the user's to fix (a taken port, a directory that cannot be written, a
model directory that holds no model), so it is a one-line error naming the value, at once: exit
2 for a task, and for `sync-mnist evaluate|predict`. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core.config import ConfigError, TaskConfig

SAVED_MODEL_FILE = "saved_model.pb"  # the file that makes a directory a SavedModel
LOCK_FILE = ".sync-mnist.lock"  # in --logdir: held by the chief of the cluster that uses it
_held: list = []  # the chief's lock file, open (so locked) until the process ends


def check_task(config: TaskConfig) -> None:
    """A task's own port; the chief's --logdir and --export-dir. Raises ValueError."""
    cluster_lib.check_port_free(config.cluster.address(config.role, config.index), config.name)
    if config.role == "worker" and config.is_chief:
        if config.train.logdir:
            check_logdir(config.train.logdir)
        if config.train.export_dir and config.train.setup == "fixed":
            check_export_dir(config.train.export_dir)


def check_output_file(path: Path, flag: str) -> None:
    """Raises ConfigError unless a file can be written at `path` (its directory is created if
    need be): checked before the work, so that a run does not end in a failed write."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory, not a file")
    _check_writable(path.parent, path, f"{flag} {path}")


def check_logdir(logdir: Path) -> None:
    """Raises ConfigError unless the chief can write checkpoints and summaries to logdir, and
    no other cluster's chief uses it; then holds its lock for as long as this process lives."""
    _check_writable(logdir, logdir, f"--logdir {logdir}")
    lock(logdir)


def lock(logdir: Path) -> None:
    """Takes logdir's lock, which the kernel releases when this process ends (even by a kill).

    Two clusters on one --logdir would overwrite each other's checkpoints, and a restore could
    load the other's model and counters. A POSIX record lock (fcntl), which NFS carries across
    hosts. Raises ConfigError naming the holder if it is taken.
    """
    path = logdir / LOCK_FILE
    held = open(path, "a+")  # pylint: disable=consider-using-with: kept open on purpose
    try:
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        held.seek(0)
        holder = held.read().strip() or "a chief"
        held.close()
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise ConfigError(f"--logdir {logdir}: cannot lock {path}: {e.strerror}") from None
        raise ConfigError(f"--logdir {logdir} is in use by a running cluster ({holder} holds "
                          f"{path}); give each cluster a --logdir of its own") from None
    held.truncate(0)
    held.write(f"the chief, pid {os.getpid()} on {socket.gethostname()},")
    held.flush()
    _held.append(held)


def check_export_dir(export_dir: Path) -> None:
    """Raises ConfigError unless the model can be written to export_dir at the end.

    Checked before training, so that a run does not train for an hour and then fail. An
    existing SavedModel there (an earlier run's) is replaced; anything else is left alone.
    """
    if export_dir.exists():
        if not export_dir.is_dir():
            raise ConfigError(f"--export-dir {export_dir} is a file, not a directory")
        if any(export_dir.iterdir()) and not (export_dir / SAVED_MODEL_FILE).exists():
            raise ConfigError(f"--export-dir {export_dir} holds other files than a SavedModel; "
                              "give a new or empty directory")
    _check_writable(export_dir.parent, export_dir, f"--export-dir {export_dir}")


def _check_writable(directory: Path, named: Path, flag: str) -> None:
    """Creates `directory` if need be and writes a probe file in it; ConfigError if it cannot."""
    try:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # it exists, and is not a directory
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)) from None
        probe = directory / f".{named.name}.write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        reason = e.strerror or errno.errorcode.get(e.errno, str(e))
        raise ConfigError(f"{flag} is not writable: {reason}") from None


def check_model_dir(model_dir: Path) -> None:
    """Raises ConfigError unless model_dir holds a SavedModel (whose interface the loader
    checks)."""
    if not model_dir.is_dir():
        raise ConfigError(f"model directory {model_dir} does not exist")
    if not (model_dir / SAVED_MODEL_FILE).is_file():
        raise ConfigError(f"{model_dir} is not a SavedModel: it has no {SAVED_MODEL_FILE} "
                          "(train with --export-dir DIR or --logdir DIR to write one)")
