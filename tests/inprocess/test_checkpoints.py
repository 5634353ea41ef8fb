"""The chief's --logdir and its checkpoints: what is checked before training (a writable
directory, a checkpoint of the same model, one TensorFlow can read, one not past the plan), and
when the chief saves (--save-secs or --save-steps, without the transient variables). Storage
faults: a damaged newest checkpoint falls back to the newest intact one, and a logdir with no
room for the first checkpoint is refused (a full disk later: tests/recovery/test_storage_faults).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import tensorflow as tf

from sync_mnist.task import preflight
from sync_mnist.core import checkpoints, sessions
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import ConfigError, TaskConfig

import mlp_graph

tf1 = tf.compat.v1


# ---------------------------------------------------------------------------- logdir

def test_check_logdir_names_an_unwritable_directory(tmp_path):
    preflight.check_logdir(tmp_path / "new" / "logdir")  # created
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=rf"^--logdir {blocker}/x is not writable: "
                                          "Not a directory$"):
        preflight.check_logdir(blocker / "x")


def test_check_checkpoint_names_the_variable_that_differs(tmp_path):
    with tf.Graph().as_default():
        tf1.get_variable("global_step", initializer=tf.constant(5, tf.int64))
        tf1.get_variable("counts", initializer=tf.zeros([2], tf.int64))
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            saver.save(sess, str(tmp_path / "model.ckpt"), global_step=5)
    with tf.Graph().as_default():
        same = [tf1.get_variable("global_step", [], tf.int64),
                tf1.get_variable("counts", [2], tf.int64)]
        checkpoints.check_checkpoint(tmp_path, same)
        checkpoints.check_checkpoint(tmp_path / "empty", same)  # no checkpoint: nothing to check
    with tf.Graph().as_default():
        other = [tf1.get_variable("global_step", [], tf.int64),
                 tf1.get_variable("extra", [4], tf.float32),
                 tf1.get_variable("counts", [3], tf.int64)]
        with pytest.raises(ConfigError) as raised:
            checkpoints.check_checkpoint(tmp_path, other)
        assert str(raised.value) == (f"--logdir {tmp_path} holds a checkpoint of a different "
                                     "model: counts has shape [2] there, [3] here")
        with pytest.raises(ConfigError, match="it has no variable extra \\(shape \\[4\\] here\\)"):
            checkpoints.check_checkpoint(tmp_path, other[:2])


def _save_step_5(logdir):
    with tf.Graph().as_default():
        tf1.get_variable("global_step", initializer=tf.constant(5, tf.int64))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            tf1.train.Saver().save(sess, str(logdir / "model.ckpt"), global_step=5)


@pytest.mark.parametrize("content", ["model_checkpoint_path: {{{", "", "\xff\xfe"],
                         ids=["unparsable", "empty", "not text"])
def test_check_checkpoint_refuses_a_checkpoint_file_tensorflow_would_ignore(tmp_path, content):
    # Before: TensorFlow logged "Checkpoint ignored" (hidden) and the chief silently started
    # over (unparsable), or a ValueError "Invalid checkpoint state" came through (empty).
    _save_step_5(tmp_path)
    (tmp_path / "checkpoint").write_bytes(content.encode("latin-1"))
    with tf.Graph().as_default():
        step = [tf1.get_variable("global_step", [], tf.int64)]
        with pytest.raises(ConfigError) as raised:
            checkpoints.check_checkpoint(tmp_path, step)
    assert str(raised.value) == (f"--logdir {tmp_path} has a checkpoint file that cannot be "
                                 f"read as one ({tmp_path / 'checkpoint'}): fix or remove it, "
                                 "or give a new --logdir")


def test_check_checkpoint_refuses_a_moved_logdir_whose_checkpoint_file_names_the_old_one(
        tmp_path):
    # A TF1 Saver writes absolute paths into the checkpoint file; after a move they point
    # nowhere, and before, TensorFlow then ignored the checkpoint: a silent fresh start.
    _save_step_5(tmp_path / "before")
    (tmp_path / "before").rename(tmp_path / "after")
    with tf.Graph().as_default():
        step = [tf1.get_variable("global_step", [], tf.int64)]
        with pytest.raises(ConfigError) as raised:
            checkpoints.check_checkpoint(tmp_path / "after", step)
    assert str(raised.value) == (
        f"--logdir {tmp_path / 'after'}: its checkpoint file ({tmp_path / 'after/checkpoint'}) "
        f"names {tmp_path / 'before/model.ckpt-5'}, which does not exist (was the directory "
        "moved?): fix or remove that file, or give a new --logdir")


def test_a_chief_refuses_a_checkpoint_already_past_its_planned_updates(tmp_path):
    # Before: the chief resumed at global_step 10, trained nothing, and the verdict said
    # "global_step 10 != 4 planned": exit 3 (not synchronous) for what is bad input.
    from mlp_graph import prepared_graph
    from procs import local_cluster
    from sync_mnist.core.config import TrainConfig

    servers, spec = local_cluster(1)
    layout = ClusterLayout(tuple(spec.as_dict()["ps"]), tuple(spec.as_dict()["worker"]))

    def chief(train_steps: int):
        return prepared_graph(TaskConfig(role="worker", index=0, cluster=layout, train=TrainConfig(
            train_steps=train_steps, params={"dataset": "synthetic"}, logdir=tmp_path,
            timeout=30.0)))

    # The chief's own model, at global_step 10, saved as a checkpoint in its --logdir.
    built = chief(10)
    with built.graph.as_default(), tf1.Session(servers[0].target) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.assign(tf1.train.get_global_step(), 10))
        tf1.train.Saver().save(sess, str(tmp_path / "model.ckpt"), global_step=10)
    chief(10)  # 10 planned: nothing past the plan
    with pytest.raises(ConfigError) as raised:
        chief(4)
    assert str(raised.value) == (f"--logdir {tmp_path} holds a checkpoint at global_step 10, "
                                 "past the 4 updates planned (--train-steps or --epochs): give "
                                 "a new --logdir, or plan at least 10")


def _save_model(path, slices: int, hidden=(256, 256)):
    with tf.Graph().as_default():
        mlp_graph.variables(hidden, slices=slices)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            tf1.train.Saver().save(sess, str(path / "model.ckpt"))


@pytest.mark.parametrize("saved_slices, slices", [(1, 3), (3, 1), (2, 3)])
def test_check_checkpoint_takes_a_sliced_variable_whole(tmp_path, saved_slices, slices):
    # A checkpoint holds a partitioned variable whole: written with one number of ps, it
    # passes with another (test_partition.py restores it).
    _save_model(tmp_path, saved_slices)
    with tf.Graph().as_default():
        mlp_graph.variables(slices=slices)
        checkpoints.check_checkpoint(tmp_path, tf1.global_variables())
    with tf.Graph().as_default():  # another model is still named, whole
        mlp_graph.variables((128, 256), slices=slices)
        with pytest.raises(ConfigError) as raised:
            checkpoints.check_checkpoint(tmp_path, tf1.global_variables())
    assert str(raised.value) == (f"--logdir {tmp_path} holds a checkpoint of a different model: "
                                 "layer0/weights has shape [784, 256] there, [784, 128] here")


# ---------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("save_steps, save_secs, every", [(10, None, (None, 10)),
                                                         (10, 2.5, (2.5, None))])
def test_chief_saves_every_save_secs_when_given_else_every_save_steps(tmp_path, save_steps,
                                                                      save_secs, every):
    server = tf.distribute.Server.create_local_server()
    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        transient = tf1.get_variable("transient", initializer=tf.constant(-1))
        sess = sessions.monitored_session(server.target, is_chief=True, hooks=[], config=None,
                                         timeout=10, checkpoint_dir=str(tmp_path),
                                         save_steps=save_steps, save_secs=save_secs,
                                         transient=[transient])
        with sess:
            (saver_hook,) = [h.hook for h in sess._hooks  # pylint: disable=protected-access
                             if isinstance(h.hook, tf1.train.CheckpointSaverHook)]
            timer = saver_hook._timer  # pylint: disable=protected-access
            assert (timer._every_secs, timer._every_steps) == every
    # The checkpoint leaves the transient variable out.
    names = [name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(tmp_path))]
    assert names == ["global_step"]


def test_the_chief_writes_its_graph_files_before_it_initialises_the_model(tmp_path):
    # Before: the stock hook wrote them after the initialisation, between the model being
    # ready (the other workers' session then was) and the chief's own session: the chief was
    # ready 1-2 s after the others in a run with --logdir, the files of a canned wide & deep
    # graph most of that. Seen from the model's initialiser, which runs in this process.
    graph_file = tmp_path / "graph.pbtxt"
    server = tf.distribute.Server.create_local_server()
    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        written = tf1.numpy_function(graph_file.exists, [], tf.bool)
        at_init = tf1.get_variable("graph_written_at_init", initializer=tf.reshape(written, []))
        try:
            with sessions.monitored_session(server.target, is_chief=True, hooks=[],
                                           config=None, timeout=10,
                                           checkpoint_dir=str(tmp_path), save_steps=10) as sess:
                assert sess.run(at_init), f"{graph_file} was not there when the model was " \
                                          "initialised"
        finally:
            tf1.summary.FileWriterCache.clear()
    # The rest as before: the graph and its meta graph in the events, and the first save.
    assert _listed(tmp_path) == [0]
    events = {e.WhichOneof("what") for path in tmp_path.glob("events.out.tfevents.*")
              for e in tf1.train.summary_iterator(str(path))}
    assert {"graph_def", "meta_graph_def"} <= events


# ---------------------------------------------------------------------------- storage faults

def _save_steps(logdir, steps):
    with tf.Graph().as_default():
        step = tf1.train.get_or_create_global_step()
        tf1.get_variable("weights", initializer=tf.ones([1000]))
        saver = tf1.train.Saver(sharded=True)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for s in steps:
                sess.run(tf1.assign(step, s))
                saver.save(sess, str(logdir / "model.ckpt"), global_step=s)


def _damage(prefix, how: str) -> None:
    """Damages the checkpoint files of `prefix` as a crash or a full disk leaves them."""
    index, data = Path(f"{prefix}.index"), Path(f"{prefix}.data-00000-of-00001")
    if how == "index cut short":  # tensorflow#13588, #6644: "too short to be an sstable"
        os.truncate(index, 0)
    elif how == "index missing":
        index.unlink()
    elif how == "shard missing":  # tensorflow#14608: the checkpoint file named a lost shard
        data.unlink()
    elif how == "data cut short":  # the state file renamed into place before the data reached disk
        os.truncate(data, 100)
    else:
        raise ValueError(how)


DAMAGES = ["index cut short", "index missing", "shard missing", "data cut short"]


def _variables():
    return [tf1.train.get_or_create_global_step(), tf1.get_variable("weights", [1000])]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, how, caplog):
    # Before: a checkpoint TensorFlow could not read was refused (exit 2), or, with its index
    # missing, latest_checkpoint found nothing and the chief said the directory had moved.
    _save_steps(tmp_path, [5, 10, 15])
    _damage(tmp_path / "model.ckpt-15", how)
    with tf.Graph().as_default(), caplog.at_level(logging.WARNING, "sync_mnist"):
        chosen = checkpoints.check_checkpoint(tmp_path, _variables())
    assert chosen.path == str(tmp_path / "model.ckpt-10")
    # The ones the Saver goes on keeping: the listed ones, less the damaged one.
    assert chosen.kept == (str(tmp_path / "model.ckpt-5"), str(tmp_path / "model.ckpt-10"))
    # Only the package's own: TensorFlow's "Object was never used" error, logged when another
    # test's graph is collected, can land in this test's capture (seen under `make test`).
    (warning,) = [r.getMessage() for r in caplog.records
                  if r.levelno >= logging.WARNING and r.name.startswith("sync_mnist")]
    assert warning.startswith(f"--logdir {tmp_path}: the newest checkpoint, model.ckpt-15, is "
                              "damaged (")
    assert warning.endswith("); restoring model.ckpt-10, the newest intact one"), warning


def test_no_intact_checkpoint_is_refused_naming_the_directory(tmp_path):
    _save_steps(tmp_path, [5, 10])
    _damage(tmp_path / "model.ckpt-10", "index cut short")
    _damage(tmp_path / "model.ckpt-5", "shard missing")
    with tf.Graph().as_default(), pytest.raises(ConfigError) as raised:
        checkpoints.check_checkpoint(tmp_path, _variables())
    assert str(raised.value).startswith(
        f"--logdir {tmp_path}: none of its 2 checkpoints is intact (model.ckpt-10: file is too "
        "short to be an sstable; model.ckpt-5: ")
    assert str(raised.value).endswith(": restore them, or give a new --logdir")


def test_a_resume_restores_the_newest_intact_checkpoint_and_keeps_the_older_ones(tmp_path):
    # Before: the chief refused the logdir (its newest checkpoint's index is missing, so
    # latest_checkpoint found none: "was the directory moved?"). With the fallback but the stock
    # restore, it restored the damaged one the `checkpoint` file names and failed.
    from inprocess_cluster import run_cluster

    logdir = tmp_path / "logdir"
    first = run_cluster(1, train_steps=20, save_steps=4, logdir=logdir)
    assert first.chief.synchronous is True, first.chief.verdict
    # More than one checkpoint is kept, so a damaged newest one has one to fall back to.
    assert checkpoints.KEEP_CHECKPOINTS >= 2
    assert _listed(logdir) == [4, 8, 12, 16, 20][-checkpoints.KEEP_CHECKPOINTS:]
    assert not list(logdir.glob("model.ckpt-0.*"))  # the oldest was deleted
    _damage(logdir / "model.ckpt-20", "index missing")

    resumed = run_cluster(1, train_steps=24, save_steps=4, logdir=logdir)
    assert resumed.chief.start_step == 16
    assert resumed.chief.synchronous is True, resumed.chief.verdict
    # The Saver went on from the checkpoints the resume found, not from an empty list.
    assert _listed(logdir) == [8, 12, 16, 20, 24][-checkpoints.KEEP_CHECKPOINTS:]


def _listed(logdir) -> list[int]:
    state = tf.train.get_checkpoint_state(str(logdir))
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_logdir_with_no_room_for_the_first_checkpoint_is_refused(tmp_path):
    # Before: ResourceExhaustedError "Graph execution error:" (exit 1), naming neither the
    # directory nor the full disk.
    from procs import small_tmpfs

    server = tf.distribute.Server.create_local_server()
    with small_tmpfs(tmp_path / "logdir", "256k") as logdir, tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        tf1.get_variable("weights", initializer=tf.zeros([100_000]))  # 400 kB: no room
        try:
            with pytest.raises(ConfigError) as raised:
                with sessions.monitored_session(server.target, is_chief=True, hooks=[],
                                               config=None, timeout=10,
                                               checkpoint_dir=str(logdir), save_steps=10):
                    pass
        finally:
            tf1.summary.FileWriterCache.clear()  # its events file is on the tmpfs
        assert str(raised.value) == (
            f"--logdir {logdir} has no room for a checkpoint: No space left on device (ENOSPC) "
            "while saving the checkpoint of global_step 0: free some space there, or give "
            "another --logdir")
        # Nothing a resume would trust: no checkpoint named, no half-written shard left.
        assert tf.train.get_checkpoint_state(str(logdir)) is None
        assert not list(logdir.glob("model.ckpt-0*"))


class _FreedAtTheFirstWait:
    """Stands in for checkpoints.py's `time`: its first sleep frees the disk, as another job's
    files removed while the chief waits for room."""

    def __init__(self, disk):
        self.disk, self.sleeps = disk, 0

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        self.sleeps += 1
        self.disk.free()
        time.sleep(seconds)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_first_checkpoint_that_finds_room_again_is_saved_and_the_run_goes_on(
        tmp_path, monkeypatch, caplog):
    # Found by make chaos (disk-full in the start-up): a --logdir full for a few seconds as the
    # chief made its first save ended the run, exit 2, though the disk had room again soon.
    from procs import small_tmpfs
    from lab.loopback_faults import DiskFull

    server = tf.distribute.Server.create_local_server()
    with small_tmpfs(tmp_path / "logdir", "2m") as logdir, tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        tf1.get_variable("weights", initializer=tf.zeros([100_000]))  # 400 kB
        disk = DiskFull(logdir)
        assert disk.fill() > 0
        clock = _FreedAtTheFirstWait(disk)
        monkeypatch.setattr(checkpoints, "time", clock)
        try:
            with sessions.monitored_session(server.target, is_chief=True, hooks=[],
                                           config=None, timeout=10,
                                           checkpoint_dir=str(logdir), save_steps=10) as sess:
                assert sess.run(tf1.train.get_global_step()) == 0
        finally:
            tf1.summary.FileWriterCache.clear()
        assert clock.sleeps == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                    and "no room" in r.getMessage()]
        assert warnings == [
            f"--logdir {logdir} has no room for a checkpoint: No space left on device (ENOSPC) "
            "while saving graph.pbtxt: free some space there, or give another --logdir; "
            "trying again every 1 s for up to 5 s (half of --timeout)"]
        assert _listed(logdir)[0] == 0  # the first checkpoint, complete
