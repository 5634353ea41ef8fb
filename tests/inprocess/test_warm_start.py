"""--warm-start-from (core/warm_start.py): the model's variables start as the source's, from a
checkpoint or a SavedModel, cut over another number of ps than the source was; the regexes and
the name map choose and rename; the optimizer's slots (and Adam's powers) come along where the
source holds them, and are named where it does not; global_step stays this run's; every
mistake is one line. Then one in-process cluster: warm-started once, and a restarted chief
resumes its own checkpoint instead.

The graph-level tests build a small model as placement.build places it, on no device (a plain
session runs it), with its optimizer's slots and global_step beside it, as a chief's graph
has them.
"""

from __future__ import annotations

import logging
import shutil
import types

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.core import placement, warm_start
from sync_mnist.core.config import ConfigError, WarmStart
from sync_mnist.task import export

tf1 = tf.compat.v1

FEATURES = np.random.default_rng(0).normal(size=[8, 6]).astype(np.float32)
LABELS = np.arange(8, dtype=np.int64) % 3


def model_fn(features, labels, mode, params):
    """A kernel and a bias (trainable, cut over the ps) and a moving mean (the model's state)."""
    with tf1.variable_scope(params.get("scope", "dense")):
        kernel = tf1.get_variable("kernel", [6, params.get("classes", 3)],
                                  initializer=tf1.glorot_uniform_initializer())
        bias = tf1.get_variable("bias", [params.get("classes", 3)], params.get("dtype", tf.float32),
                                initializer=tf1.constant_initializer(0.5))
        mean = tf1.get_variable("moving_mean", [params.get("classes", 3)], trainable=False,
                                initializer=tf1.zeros_initializer())
    logits = tf.matmul(features, kernel) + tf.cast(bias, tf.float32) - mean
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"logits": logits})
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    return sm.ModelSpec(mode, loss=loss, optimizer=tf1.train.AdamOptimizer(0.1))


MODEL = sm.Model(model_fn, lambda params: (FEATURES, LABELS), lambda params: (FEATURES, LABELS))
NAMES = ["dense/kernel", "dense/bias", "dense/moving_mean"]


def _chief_graph(slices: int, params: dict | None = None, seed: int = 0):
    """The model in the current graph as a chief's has it: cut into `slices`, with
    global_step and Adam's slots. Returns a training step (given a session), {name: Whole}
    of every variable, and the names of the model function's own variables."""
    tf1.set_random_seed(seed)
    params = params or {}
    features, labels = placement.placeholders(FEATURES, LABELS)
    recorded = placement.record(model_fn, features, labels, sm.ModeKeys.TRAIN, params)
    spec = placement.build(model_fn, features, labels, sm.ModeKeys.TRAIN, params,
                           num_ps=slices, ps_job=None, recorded=recorded).spec
    step = tf1.train.get_or_create_global_step()
    train_op = spec.optimizer.minimize(spec.loss, global_step=step)
    feed = {features: FEATURES + np.arange(6, dtype=np.float32), labels: LABELS}
    return ((lambda sess: sess.run(train_op, feed)),
            placement.whole_variables(tf1.global_variables()), [r.name for r in recorded])


def _values(sess, wholes) -> dict[str, np.ndarray]:
    return {name: np.concatenate(sess.run(w.slices), axis=0) if w.shape else
            sess.run(w.slices[0]) for name, w in wholes.items()}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A checkpoint of the model cut over 3 ps, trained 2 steps (global_step 2, Adam's slots
    moved), the moving mean set; the same weights as a SavedModel; and all their values."""
    root = tmp_path_factory.mktemp("source")
    with tf.Graph().as_default():
        train, wholes, _ = _chief_graph(3, seed=1)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            train(sess), train(sess)
            sess.run(tf1.assign(wholes["dense/moving_mean"].slices[0], [1.0, 2.0, 3.0]))
            values = _values(sess, wholes)
            tf1.train.Saver().save(sess, str(root / "logdir" / "model.ckpt"), global_step=2)
    export.write_saved_model(MODEL, {}, (FEATURES, LABELS), {n: values[n] for n in NAMES},
                             root / "saved_model")
    return types.SimpleNamespace(root=root, values=values, checkpoint=root / "logdir/model.ckpt-2")


def _warm_started(settings: WarmStart, slices: int, params: dict | None = None):
    """(the plan, every variable's value once initialised) of a chief's graph of `slices`."""
    with tf.Graph().as_default():
        _, wholes, names = _chief_graph(slices, params, seed=2)
        plan = warm_start.warm_start(settings, names)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return plan, _values(sess, wholes)


def _fresh(slices: int, params: dict | None = None) -> dict[str, np.ndarray]:
    with tf.Graph().as_default():
        _, wholes, _ = _chief_graph(slices, params, seed=2)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return _values(sess, wholes)


@pytest.mark.parametrize("slices", [1, 2])
@pytest.mark.parametrize("kind", ["checkpoint", "logdir", "saved_model"])
def test_the_model_starts_as_the_source_whatever_the_number_of_ps(source, kind, slices):
    given = {"checkpoint": source.checkpoint, "logdir": source.root / "logdir",
             "saved_model": source.root / "saved_model"}[kind]
    plan, values = _warm_started(WarmStart(str(given)), slices)
    assert plan.names == {n: n for n in NAMES}  # the moving mean too: the model's state
    assert plan.source == str({"saved_model": given / "variables/variables",
                               "logdir": source.checkpoint}.get(kind, given))
    for name in NAMES:
        np.testing.assert_array_equal(values[name], source.values[name], err_msg=name)
    # This run's own: its step starts afresh, not as the source's.
    fresh = _fresh(slices)
    assert values["global_step"] == 0 and source.values["global_step"] == 2
    # The optimizer's state: the source's where it holds it (a checkpoint), else afresh and
    # named (a SavedModel holds the model's variables alone).
    state = ["dense/kernel/Adam", "dense/kernel/Adam_1", "dense/bias/Adam",
             "dense/bias/Adam_1"]
    if kind == "saved_model":
        assert plan.state == {} and sorted(plan.fresh) == sorted(state)
        assert warm_start.fresh_line(plan) == (
            f"--warm-start-from {given} holds no {plan.fresh[0]} nor 3 more of the "
            "optimizer's slots as this run has them: they start afresh")
    else:
        assert plan.state == {n: n for n in [*state, "beta1_power", "beta2_power"]}
        assert plan.fresh == []
    for name in (*state, "beta1_power", "beta2_power"):
        expected = fresh if kind == "saved_model" else source.values
        np.testing.assert_array_equal(values[name], expected[name], err_msg=name)
        assert not np.array_equal(fresh[name], source.values[name]), name


def test_the_regexes_choose_and_the_map_renames(source):
    fresh = _fresh(2, {"scope": "head"})
    plan, values = _warm_started(WarmStart(str(source.checkpoint), ("head/k", "head/moving"),
                                           (("head/kernel", "dense/kernel"),
                                            ("head/moving_mean", "dense/moving_mean"))),
                                 2, {"scope": "head"})
    assert plan.names == {"head/kernel": "dense/kernel", "head/moving_mean": "dense/moving_mean"}
    np.testing.assert_array_equal(values["head/kernel"], source.values["dense/kernel"])
    np.testing.assert_array_equal(values["head/moving_mean"], source.values["dense/moving_mean"])
    np.testing.assert_array_equal(values["head/bias"], fresh["head/bias"])  # not chosen: its own
    # Matched from the start of the name, as the Estimator's get_collection did.
    with pytest.raises(ConfigError, match="^--warm-start-vars kernel matches none of the "):
        _warm_started(WarmStart(str(source.checkpoint), ("kernel",)), 1)


@pytest.mark.parametrize("settings, params, expected", [
    ({"source": "{root}/nothing"}, {},
     "--warm-start-from {root}/nothing does not exist (nor does {root}/nothing.index)"),
    ({"source": "{root}"}, {},
     "--warm-start-from {root} is neither a checkpoint (no {root}.index), a directory of "
     "checkpoints (no checkpoint file in it) nor a SavedModel (no saved_model.pb in it)"),
    ({"variables": ("dense/kern",), "prev_names": (("dense/bias", "dense/bias"),)}, {},
     "--warm-start-map dense/bias=dense/bias: dense/bias is not among the variables "
     "--warm-start-vars chooses"),
    ({"prev_names": (("dense/nope", "dense/bias"),)}, {},
     "--warm-start-map dense/nope=dense/bias: dense/nope is not a variable of the model"),
    ({"prev_names": (("dense/bias", "old/bias"),)}, {},
     "--warm-start-map dense/bias=old/bias: --warm-start-from {ckpt} has no variable old/bias"),
    ({}, {"scope": "head"},
     "--warm-start-from {ckpt} has no variable head/kernel (shape [6, 3] here): leave it out "
     "with --warm-start-vars, or name it there with --warm-start-map head/kernel=PREV_NAME"),
    ({}, {"classes": 4},
     "--warm-start-from {ckpt}: dense/kernel has shape [6, 3] there, [6, 4] here"),
    ({"prev_names": (("dense/bias", "dense/moving_mean"),)}, {"dtype": tf.float64},
     "--warm-start-map dense/bias=dense/moving_mean: --warm-start-from {ckpt}: "
     "dense/moving_mean has dtype float32 there, float64 here"),
], ids=["absent", "neither", "map-not-chosen", "map-no-variable", "map-not-in-source",
        "not-in-source", "shape", "dtype"])
def test_a_mistake_is_one_line_naming_the_value_and_the_cause(source, settings, params,
                                                              expected):
    given = {"source": str(source.checkpoint), **settings}
    given["source"] = given["source"].format(root=source.root)
    with pytest.raises(ConfigError) as raised:
        _warm_started(WarmStart(**given), 2, params)
    assert str(raised.value) == expected.format(root=source.root, ckpt=source.checkpoint)


def test_a_source_a_ps_cannot_read_is_named(source, tmp_path):
    # The chief checked the source where it runs; a ps reads it where it runs.
    shutil.copytree(source.root / "logdir", tmp_path / "logdir")
    with tf.Graph().as_default():
        _chief_graph(2)
        plan = warm_start.warm_start(WarmStart(str(tmp_path / "logdir/model.ckpt-2")), NAMES)
        shutil.rmtree(tmp_path / "logdir")
        with tf1.Session() as sess, pytest.raises(tf.errors.OpError) as raised:
            sess.run(tf1.global_variables_initializer())
    error = warm_start.unreadable(plan, raised.value)
    copy = tmp_path / "logdir/model.ckpt-2"
    assert str(error).startswith(f"--warm-start-from {copy}: a ps could not read {copy} (")
    assert str(error).endswith("): each ps reads its own variables' values from it, so it "
                               "must be at that path on every ps's host")
    assert warm_start.unreadable(None, raised.value) is None


def test_a_source_whose_data_is_cut_short_is_named(source, tmp_path):
    """An index whose data file lost its second half: found as the model is initialised, named
    with TensorFlow's reason (it was OutOfRangeError naming neither the file nor why)."""
    torn = tmp_path / "torn"
    shutil.copytree(source.root / "logdir", torn)
    data = next(torn.glob("model.ckpt-2.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    given = str(torn / "model.ckpt-2")
    with pytest.raises(tf.errors.OutOfRangeError) as raised:
        _warm_started(WarmStart(given), 1)
    error = warm_start.unreadable(warm_start.Plan(given, given, {}), raised.value)
    assert str(error) == (f"--warm-start-from {given}: {given} is damaged: its index lists "
                          "values its data does not hold whole (Read less bytes than "
                          "requested); a checkpoint cut short as it was copied or written?")


def test_a_cluster_warm_starts_once_and_a_restarted_chief_resumes_its_own_checkpoint(
        source, tmp_path, caplog):
    from inprocess_cluster import run_cluster

    yesterday, logdir = source.root / "saved_model", tmp_path / "today"
    caplog.set_level(logging.INFO)
    kwargs = dict(model=MODEL, batch_size=4, logdir=logdir, warm_start=WarmStart(str(yesterday)))

    first = run_cluster(1, num_ps=2, train_steps=2, **kwargs)
    assert first.chief.synchronous is True, first.chief.verdict
    assert first.chief.warm_started == {"from": str(yesterday / "variables/variables"),
                                        "variables": 3, "optimizer_variables": 0}
    # The run's first checkpoint, saved as its session was made: the source's values.
    start = tf.train.load_checkpoint(str(logdir / "model.ckpt-0"))
    for name in NAMES:
        np.testing.assert_array_equal(start.get_tensor(name), source.values[name], err_msg=name)
    assert "warm-started 3 of the model's 3 variables from " in caplog.text
    # A SavedModel holds no slots: said before training.
    assert f"--warm-start-from {yesterday} holds no dense/kernel/Adam nor 3 more of the " \
           "optimizer's slots as this run has them: they start afresh" in caplog.text
    saved = tf.train.load_checkpoint(str(logdir / "model.ckpt-2")).get_tensor("dense/kernel")
    assert not np.array_equal(saved, source.values["dense/kernel"])  # it trained

    caplog.clear()
    resumed = run_cluster(1, num_ps=1, train_steps=4, **kwargs)
    assert resumed.chief.synchronous is True, resumed.chief.verdict
    assert (resumed.chief.start_step, resumed.chief.warm_started) == (2, None)
    assert (f"--logdir {logdir} holds a checkpoint of this run (model.ckpt-2): resuming it, "
            f"not warm-starting from {yesterday}") in caplog.text
    assert "warm-started" not in caplog.text
    # Its step 2 saved again as its session was made: the values it restored, not the source's.
    again = tf.train.load_checkpoint(str(logdir / "model.ckpt-2")).get_tensor("dense/kernel")
    np.testing.assert_array_equal(again, saved)
