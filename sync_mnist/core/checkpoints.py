"""Checkpoints: the chief's saver hook (a sharded save that outlives a full disk), and the
choice of the checkpoint a resume restores, with its integrity checked.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

import tensorflow as tf

from sync_mnist.core import placement
from sync_mnist.core.bounded import bounded_call
from sync_mnist.core.config import ConfigError, first_line

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

GLOBAL_STEP = "global_step"  # the variable's name, as tf.train.get_or_create_global_step makes it

# Sync: a checkpoint can be damaged where it lies: a sharded save that lost a shard while the
# `checkpoint` file already named it (tensorflow#14608), an index cut short by a crash ("too
# short to be an sstable", #13588, #6644; neither the shards nor the `checkpoint` file are
# fsynced). A resume then falls back to the newest intact one, so the Saver keeps more than one.
KEEP_CHECKPOINTS = 5

ROOM_RETRY_SECS = 1.0  # between tries of a write that found no room (retry_for_room)


def retry_for_room(write: Callable, no_room: type[Exception], window: float,
                   stop: Callable[[], bool] = lambda: False, bound: str = "half of --timeout"):
    """(write(), tries): a write that found no room on its disk (raised `no_room`) is tried
    again every ROOM_RETRY_SECS for up to `window` s (`bound`, as its warning says: a disk
    freed meanwhile keeps it), with one warning; then, or once `stop()`, its error is raised."""
    deadline, tries = time.monotonic() + window, 0
    while True:
        tries += 1
        try:
            return write(), tries
        except no_room as e:
            if deadline - time.monotonic() < ROOM_RETRY_SECS or stop():
                raise
            if tries == 1:
                log.warning("%s; trying again every %g s for up to %g s (%s)",
                            e, ROOM_RETRY_SECS, window, bound)
        time.sleep(ROOM_RETRY_SECS)  # a disk's room: nothing to wait on but time


class _NoRoom(ConfigError):
    """The run's first checkpoint found no room under --logdir."""


class _SharedCheckpointSaverHook(tf1.train.CheckpointSaverHook):
    """CheckpointSaverHook that checks, at a session's first save, that the checkpoint is
    complete where the chief restores from, and that outlives a full disk.

    Sync: the saver is sharded. Each ps runs the save of its own variables and writes their
    shard to its own filesystem, and the last ps merges the shards' indexes there; the chief
    writes only the `checkpoint` file. On hosts that do not share --logdir, the chief would
    never find a checkpoint to restore: a lost ps would be a lost model, a resume a fresh start.

    A save that fails for want of room (ENOSPC, EDQUOT, EFBIG: TensorFlow's
    ResourceExhaustedError) is a warning, and training goes on: the model is on the ps, and the
    `checkpoint` file, written only after a save is complete, still names the last complete
    one. Stopping would lose the run for the sake of a checkpoint. The first save of the run is
    the exception: nothing is trained yet, and a --logdir with no room for one checkpoint is
    bad input (ConfigError, exit 2), once it has been tried again (retry_for_room) for half
    of --timeout (a disk freed meanwhile: the run goes on; the workers wait for the
    chief's first update for --timeout).

    `status`: the session's sessions.SessionStatus, whose failed_saves, save_error and
    final_save the hook keeps (not imported here: sessions.py imports this module).
    """

    def __init__(self, checkpoint_dir: str, *, timeout: float, ps_hosts: Sequence[str],
                 status, events=None, **kwargs):
        super().__init__(checkpoint_dir, **kwargs)
        self._logdir, self._timeout, self._ps_hosts = checkpoint_dir, timeout, tuple(ps_hosts)
        self._status, self._checked, self._events = status, False, events
        self._graph_written = False

    def begin(self):
        super().begin()
        if self._events is not None:  # the same events file, behind a guard against ENOSPC
            self._summary_writer = self._events

    def write_graph(self) -> None:
        """graph.pbtxt, and the graph and its meta graph in the events: what the stock hook
        writes in its first after_create_session, before its save, written here before the chief
        initialises the model (sessions.monitored_session calls it, the graph then final).

        Sync: in after_create_session it ran between the model's initialisation and the chief's
        session being ready, while the other workers, ready as soon as the model was, waited
        for the chief's first gradient: a canned wide & deep graph's files took 1.7 s of the
        chief's 2.1 s first save under load. No file needs the session; only the save does.
        A graph.pbtxt with no room is the first save's: retried for half of --timeout, then
        exit 2.
        """
        if self._graph_written:
            return
        retry_for_room(self._write_graph_once, _NoRoom, self._timeout / 2)

    def _write_graph_once(self) -> None:
        from tensorflow.python.framework import meta_graph  # the stock hook's own call

        graph = tf1.get_default_graph()
        if self._save_graph_def:
            try:
                tf1.train.write_graph(graph.as_graph_def(add_shapes=True), self._checkpoint_dir,
                                      "graph.pbtxt")
            except tf.errors.ResourceExhaustedError as e:
                self._no_room(e, "graph.pbtxt")  # raises: no save has been checked yet
        saver = self._get_saver()
        self._summary_writer.add_graph(graph)
        self._summary_writer.add_meta_graph(meta_graph.create_meta_graph_def(
            graph_def=graph.as_graph_def(add_shapes=True),
            saver_def=saver.saver_def if saver else None))
        self._graph_written = True

    def _save(self, session, step):
        # Sync: the ps write the shards; a save has no RunOptions, so a stopped ps would hold
        # the chief's step (this runs in after_run) without end.
        try:
            return bounded_call(
                lambda: super(_SharedCheckpointSaverHook, self)._save(session, step),
                self._timeout, f"the chief: waited {self._timeout:g} s for the ps "
                               f"({', '.join(self._ps_hosts)}) to save the checkpoint of "
                               f"global_step {step} in {self._logdir}")
        except tf.errors.ResourceExhaustedError as e:
            # A shard that was written (another ps's) would hold room the next save needs.
            shutil.rmtree(f"{self._save_path}-{step}_temp", ignore_errors=True)
            self._no_room(e, f"the checkpoint of global_step {step}")
            return False

    def _no_room(self, error: tf.errors.ResourceExhaustedError, what: str) -> None:
        reason = storage_error(error)
        if not self._checked:
            raise _NoRoom(f"--logdir {self._logdir} has no room for a checkpoint: {reason} "
                              f"while saving {what}: free some space there, or give another "
                              "--logdir") from None
        self._status.failed_saves += 1
        self._status.save_error = (f"could not save {what} in {self._logdir}: {reason}; "
                                   "training on: the model is on the ps")
        log.warning("%s", self._status.save_error)

    def after_create_session(self, session, coord):
        _, tries = retry_for_room(lambda: self._first_save(session, coord), _NoRoom,
                                  self._timeout / 2)
        if tries > 1:
            log.info("saved the first checkpoint in %s (try %d)", self._logdir, tries)
        self._check_first_save()

    def _first_save(self, session, coord) -> None:
        """Saves the model as it is now (its graph's files were written before it was
        initialised: write_graph)."""
        self.write_graph()  # where the chief's session manager did not (tests' sessions)
        step = session.run(self._global_step_tensor)
        try:
            self._save(session, step)
        except tf.errors.OpError as e:
            missing = re.search(r"NOT_FOUND: (\S+) not found", str(e))
            if "MergeV2Checkpoints" not in str(e) or not missing:
                raise
            raise ConfigError(_not_shared(self._logdir, f"the last ps cannot find "
                                          f"{missing.group(1)}, another ps's shard, to merge "
                                          "the checkpoint")) from None
        self._timer.update_last_triggered_step(step)

    def _check_first_save(self):
        # Not tf.train.latest_checkpoint, which logs an error of its own for a missing shard.
        state = tf.train.get_checkpoint_state(self._logdir)  # the chief's own file: present
        path = state.model_checkpoint_path
        damage = checkpoint_damage(path)
        if damage is not None:
            raise ConfigError(_not_shared(self._logdir, f"the chief cannot read "
                                          f"{Path(path).name}: {damage}"))
        self._checked = True


def storage_error(error: tf.errors.OpError) -> str:
    """What a failed file write says, with its errno's name: "No space left on device
    (ENOSPC)"; TensorFlow's message ends in "<file>; <strerror>"."""
    for line in error.message.splitlines():
        for number, name in errno.errorcode.items():
            if line.endswith(f"; {os.strerror(number)}"):
                return f"{os.strerror(number)} ({name})"
    return first_line(error)


def _not_shared(logdir: str, reason: str) -> str:
    return (f"--logdir {logdir}: the checkpoint just saved is not complete where the chief "
            f"restores from ({reason}): each ps writes its own variables to its own filesystem, "
            "so --logdir must be storage that every ps and the chief share, at the same path")



@dataclasses.dataclass(frozen=True)
class Restorable:
    """The checkpoint a resume restores (check_checkpoint's choice), and the ones the chief's
    Saver goes on keeping: those listed in the `checkpoint` file up to it, oldest first, less
    any found damaged."""

    path: str
    kept: tuple[str, ...]


def check_checkpoint(logdir: Path, variables: Sequence[tf.Variable],
                     planned: int | None = None) -> Restorable | None:
    """The checkpoint in logdir that a resume restores: the newest intact one that logdir's
    `checkpoint` file lists; None if there is none to restore.

    A damaged newer one is passed over with one warning line. Raises ConfigError if none is
    intact, if the one found cannot be restored into `variables`, or if it is already past
    `planned` updates (global steps). Restoring it would fail mid-start with a long
    TensorFlow error; this names the variable.
    A `checkpoint` file that TensorFlow cannot use (unparsable, or naming files that are not
    there, as after the directory moved: a TF1 Saver writes absolute paths) is refused too:
    TensorFlow would ignore it and silently train from scratch.
    A variable cut into slices (one per ps: placement.py) is checked whole, under the
    name and shape the checkpoint holds it by, so a checkpoint of a cluster with another
    number of ps passes: it restores.
    """
    index = Path(logdir) / "checkpoint"
    if not index.exists():
        return None
    try:
        state = tf.train.get_checkpoint_state(str(logdir))
    except ValueError:  # empty, no model_checkpoint_path, or not UTF-8
        state = None
    if state is None:
        raise ConfigError(f"--logdir {logdir} has a checkpoint file that cannot be read as one "
                          f"({index}): fix or remove it, or give a new --logdir")
    chosen = _newest_intact(Path(logdir), state)
    path = chosen.path
    shapes = dict(tf.train.list_variables(path))
    wholes = placement.whole_variables(variables)
    for name, whole in wholes.items():  # a shape that differs says more than a missing name
        if name in shapes and list(shapes[name]) != whole.shape:
            raise ConfigError(f"--logdir {logdir} holds a checkpoint of a different model: "
                              f"{name} has shape {list(shapes[name])} there, {whole.shape} here")
    for name, whole in wholes.items():
        if name not in shapes:
            raise ConfigError(f"--logdir {logdir} holds a checkpoint of a different model: it "
                              f"has no variable {name} (shape {whole.shape} here)")
    step = int(tf.train.load_variable(path, GLOBAL_STEP)) if GLOBAL_STEP in shapes else None
    if planned is not None and step is not None and step > planned:
        # Resumed, it would train nothing and then fail the verdict (global_step != planned).
        raise ConfigError(f"--logdir {logdir} holds a checkpoint at global_step {step}, past "
                          f"the {planned} updates planned (--train-steps or --epochs): give a "
                          f"new --logdir, or plan at least {step}")
    return chosen


def _newest_intact(logdir: Path, state) -> Restorable:
    """The newest checkpoint `state` lists whose every tensor reads back intact."""
    listed = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path not in listed:
        listed.append(state.model_checkpoint_path)
    if not any(tf.io.gfile.glob(f"{p}.*") for p in listed):
        raise ConfigError(f"--logdir {logdir}: its checkpoint file ({logdir / 'checkpoint'}) "
                          f"names {state.model_checkpoint_path}, which does not exist (was the "
                          "directory moved?): fix or remove that file, or give a new --logdir")
    damaged = []
    for n in range(len(listed) - 1, -1, -1):
        reason = checkpoint_damage(listed[n])
        if reason is None:
            if damaged:
                log.warning("--logdir %s: the newest checkpoint, %s, is damaged (%s); restoring "
                            "%s, the newest intact one", logdir, Path(damaged[0][0]).name,
                            damaged[0][1], Path(listed[n]).name)
            return Restorable(listed[n], tuple(listed[:n + 1]))
        damaged.append((listed[n], reason))
    raise ConfigError(f"--logdir {logdir}: none of its {len(listed)} checkpoints is intact (" +
                      "; ".join(f"{Path(p).name}: {reason}" for p, reason in damaged) +
                      "): restore them, or give a new --logdir")


def checkpoint_damage(path: str) -> str | None:
    """Why the checkpoint `path` cannot be restored, or None if it is intact.

    Every tensor is read: that checks each one's checksum against the index, so a data file
    cut short or overwritten is found, not only a missing or truncated index (which costs a
    read of the checkpoint, as the restore does once more).
    """
    if not tf.io.gfile.glob(f"{path}.index"):
        return "its index file is missing"  # load_checkpoint's error would not say which
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a data file cut short
        return first_line(e)
    return None
