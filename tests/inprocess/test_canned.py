"""The canned models (sync_mnist/canned.py) computing: the binary head's loss and metrics on
known logits in a plain session, against the same formulas in numpy; and wide & deep trained
synchronously on 2 workers and 2 ps, each part by its own optimizer, a program's hooks run on
every worker (and the chief's on the chief), the chief reporting the Estimator's metrics. Their
graphs: tests/fast/test_canned_graph.py."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
import sync_mnist.canned as canned
from sync_mnist.core.shard import DataError
from inprocess_cluster import run_cluster

tf1 = tf.compat.v1
fc = tf1.feature_column

BINARY = ["accuracy", "accuracy_baseline", "auc", "auc_precision_recall", "average_loss",
          "label/mean", "loss", "precision", "prediction/mean", "recall"]


def test_the_binary_heads_loss_is_the_weighted_batch_mean_and_its_metrics_the_estimators():
    """logits = x (weight 1, bias 0) on four examples, weighted 1, 2, 1, 1, labelled by name.
    The EVAL loss is the mean of the weighted losses over the batch (the chief's test_loss is
    per example); the `loss` metric is the trained loss, by default v1's sum over the batch
    (loss_reduction, below), averaged over batches (here one), as Estimator.evaluate reported
    it; average_loss and the other metrics are weighted means, as the Estimator's were."""
    x = np.array([-2.0, -1.0, 0.5, 3.0], np.float32)
    weights = np.array([1.0, 2.0, 1.0, 1.0], np.float32)
    labels = np.array(["no", "yes", "yes", "yes"])
    model = canned.LinearClassifier([fc.numeric_column("x")], weight_column="w",
                                    label_vocabulary=["no", "yes"], train_input_fn=None,
                                    eval_input_fn=None)
    features = {"x": x[:, None], "w": weights}
    metrics, loss = _with_logits_x(model, features, labels, sm.ModeKeys.EVAL, lambda spec: (
        {k: value for k, (value, _) in spec.eval_metric_ops.items()}, spec.loss))
    classes = _with_logits_x(model, features, None, sm.ModeKeys.PREDICT,
                             lambda spec: spec.predictions["classes"])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    losses = np.log1p(np.exp(-x)) * y + np.log1p(np.exp(x)) * (1 - y)
    p = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert loss == pytest.approx(np.sum(weights * losses) / 4, rel=1e-6)
    assert metrics["loss"] == pytest.approx(np.sum(weights * losses), rel=1e-6)
    assert sorted(metrics) == BINARY
    expected = {
        "average_loss": np.sum(weights * losses) / 5,
        "accuracy": 3 / 5,  # predicted no, no, yes, yes: the weight-2 example wrong
        "precision": 1.0, "recall": 2 / 4, "label/mean": 4 / 5, "accuracy_baseline": 4 / 5,
        "prediction/mean": np.sum(weights * p) / 5}
    assert {k: metrics[k] for k in expected} == pytest.approx(expected, rel=1e-5)
    # Every "yes" scored above the "no" (tf1.metrics.auc: 200 thresholds, so not exactly 1).
    assert metrics["auc"] == pytest.approx(1.0, abs=1e-2)
    assert classes[:, 0].tolist() == [b"no", b"no", b"yes", b"yes"]


@pytest.mark.parametrize("reduction, divisor", [
    (tf1.losses.Reduction.SUM, 1), ("sum", 1), (tf1.losses.Reduction.SUM_OVER_BATCH_SIZE, 4),
    ("sum_over_batch_size", 4), (tf1.losses.Reduction.MEAN, 5),
    (tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS, 4)])
def test_the_loss_trained_is_reduced_as_loss_reduction_says(reduction, divisor):
    """The weighted losses of the four examples above (weights summing to 5), reduced as
    tf.compat.v1.losses.Reduction says, or Keras's names for two of them."""
    x = np.array([-2.0, -1.0, 0.5, 3.0], np.float32)
    weights = np.array([1.0, 2.0, 1.0, 1.0], np.float32)
    model = canned.LinearClassifier([fc.numeric_column("x")], weight_column="w",
                                    loss_reduction=reduction, train_input_fn=None,
                                    eval_input_fn=None)
    loss = _with_logits_x(model, {"x": x[:, None], "w": weights}, np.array([0, 1, 1, 1]),
                          sm.ModeKeys.TRAIN, lambda spec: spec.loss)
    y = np.array([0.0, 1.0, 1.0, 1.0])
    losses = np.log1p(np.exp(-x)) * y + np.log1p(np.exp(x)) * (1 - y)
    assert loss == pytest.approx(np.sum(weights * losses) / divisor, rel=1e-6)


def _with_logits_x(model, features, labels, mode, fetches):
    """fetches(spec) of the linear model in `mode`, its weight set to 1: the logits are x.
    EVAL: after its metrics' updates over the batch."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        spec = model.model_fn({k: tf.constant(v) for k, v in features.items()},
                              None if labels is None else tf.constant(labels), mode, {})
        sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
        sess.run(tf1.assign(tf1.global_variables("linear/linear_model/x/weights")[0], [[1.0]]))
        sess.run([update for _, update in (spec.eval_metric_ops or {}).values()])
        return sess.run(fetches(spec))


ROWS, EVAL_ROWS, STEPS, BATCH = 64, 40, 4, 8
WARM_STEPS = 40  # a source trained this long, its FTRL accumulators grown


def _data(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    features = {"x": rng.normal(size=(rows, 2)).astype(np.float32),
                "color": rng.choice(["red", "green", "blue"], (rows, 1))}
    labels = (features["x"].sum(axis=1) + (features["color"][:, 0] == "red") > 0.5)
    return features, labels.astype(np.int64)


class _Steps(tf1.train.SessionRunHook):
    """Counts its after_run calls by graph: each worker of the in-process cluster has one."""

    def __init__(self):
        self.by_graph = collections.Counter()

    def after_run(self, run_context, run_values):
        self.by_graph[id(run_context.session.graph)] += 1


def _wide_and_deep(hooks=(), chief_hooks=()) -> sm.Model:
    x = fc.numeric_column("x", shape=[2])
    color = fc.categorical_column_with_vocabulary_list("color", ["red", "green", "blue"])
    return canned.DNNLinearCombinedClassifier(
        linear_feature_columns=[x, color],
        dnn_feature_columns=[x, fc.embedding_column(color, 3)], dnn_hidden_units=[8, 4],
        train_input_fn=lambda params: _data(ROWS, 1),
        eval_input_fn=lambda params: _data(EVAL_ROWS, 2), hooks=hooks,
        chief_hooks=chief_hooks)


def test_wide_and_deep_trains_synchronously_with_two_optimizers_and_the_estimators_metrics(
        tmp_path):
    logdir = tmp_path / "logdir"
    every, chief_only = _Steps(), _Steps()
    run = run_cluster(2, _wide_and_deep([every], [chief_only]), num_ps=2, train_steps=STEPS,
                      batch_size=BATCH, logdir=logdir, export_dir=tmp_path / "export")
    chief = run.chief
    assert chief.verdict.startswith(f"synchronous: each of {STEPS} updates averaged exactly "
                                    "one gradient from each of 2 workers"), chief.verdict
    assert chief.contributions == [STEPS, STEPS]
    # The program's hooks: `hooks` on each worker once a step, `chief_hooks` on one of them.
    assert sorted(every.by_graph.values()) == [STEPS, STEPS]
    assert list(chief_only.by_graph.values()) == [STEPS]
    assert set(chief_only.by_graph) < set(every.by_graph)
    # The chief's record (--summary-json's test_metrics, its log line): the Estimator's names,
    # over the whole evaluation set.
    metrics = chief.test_metrics
    assert sorted(metrics) == BINARY
    label_mean = _data(EVAL_ROWS, 2)[1].mean()
    assert metrics["label/mean"] == pytest.approx(label_mean, rel=1e-6)
    assert metrics["accuracy_baseline"] == pytest.approx(max(label_mean, 1 - label_mean))
    # `loss` is the trained loss, v1's batch sum, over one evaluation batch of all EVAL_ROWS;
    # test_loss is per example.
    assert metrics["loss"] == pytest.approx(chief.test_loss * EVAL_ROWS, rel=1e-5)
    assert chief.test_accuracy == metrics["accuracy"]
    # Each part moved by its own optimizer: FTRL's accumulator of the linear weights, and
    # Adagrad's of the deep kernels, both from their start of 0.1.
    reader = tf.train.load_checkpoint(str(logdir))
    assert reader.get_tensor("global_step") == STEPS
    for slot in ["linear/linear_model/x/weights/Ftrl", "dnn/hiddenlayer_0/kernel/Adagrad"]:
        assert (np.abs(reader.get_tensor(slot) - 0.1) > 1e-6).any(), slot
    names = {name for name, _ in tf.train.list_variables(str(logdir))}
    assert not {n for n in names if n.startswith("linear/") and "Adagrad" in n}
    assert not {n for n in names if n.startswith("dnn/") and "Ftrl" in n}
    # The SavedModel answers with the Estimator's predictions, from serialized tf.Examples
    # (its signatures: tests/inprocess/test_serving.py).
    features, _ = _data(3, 3)
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
        "color": tf.train.Feature(bytes_list=tf.train.BytesList(value=[c[0].encode()]))}))
        .SerializeToString() for x, c in zip(features["x"], features["color"])]
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.loader.load(sess, [tf1.saved_model.SERVING],
                                           str(tmp_path / "export"))
        signature = meta.signature_def["predict"]
        tensor = tf1.saved_model.utils.get_tensor_from_tensor_info
        answer = sess.run({k: tensor(info) for k, info in signature.outputs.items()},
                          {tensor(signature.inputs["examples"]): examples})
    assert sorted(answer) == ["all_class_ids", "all_classes", "class_ids", "classes", "logistic",
                              "logits", "probabilities"]
    assert answer["classes"][:, 0].tolist() == [str(c).encode() for c in answer["class_ids"][:, 0]]
    np.testing.assert_allclose(answer["probabilities"][:, 1], answer["logistic"][:, 0], rtol=1e-6)


def test_a_warm_started_wide_part_moves_in_its_first_update_as_in_an_ordinary_one(tmp_path):
    """FTRL computes the wide part's weights from its slots: warm-started without them, its
    first update all but erased the weights (the Estimator's warm start did so). With them
    (core/warm_start.py), the first update moves each weight about as the next ones do. And
    --eval-at-start shows the warm start: the model scores as its source."""
    from sync_mnist.core.config import WarmStart

    source, warm = tmp_path / "source", tmp_path / "warm"
    kwargs = dict(batch_size=BATCH, save_steps=1)
    trained = run_cluster(2, _wide_and_deep(), train_steps=WARM_STEPS, logdir=source,
                          **kwargs)
    started = run_cluster(2, _wide_and_deep(), train_steps=3, logdir=warm,
                          warm_start=WarmStart(str(source)), eval_at_start=True, **kwargs)
    assert started.chief.warm_started["optimizer_variables"] > 0, started.chief.warm_started
    # --eval-at-start: before its first update, the warm-started model scores as its source
    # did after its last.
    assert started.chief.evaluation_at_start == {
        "global_step": 0, "loss": trained.chief.test_loss, **trained.chief.test_metrics}
    last = tf.train.load_checkpoint(str(source / f"model.ckpt-{WARM_STEPS}"))
    steps = [tf.train.load_checkpoint(str(warm / f"model.ckpt-{k}")) for k in range(4)]
    for name in ("linear/linear_model/x/weights", "linear/linear_model/color/weights",
                 "linear/linear_model/bias_weights"):
        np.testing.assert_array_equal(steps[0].get_tensor(name), last.get_tensor(name))
        moved = [np.abs(b.get_tensor(name) - a.get_tensor(name)).max()
                 for a, b in zip(steps, steps[1:])]
        # Without the slots: 0.038 then 0.0049 and 0.0033 (x's weights, at most 0.052).
        assert moved[0] < 2 * max(moved[1:]), (name, moved)


def test_a_label_out_of_range_is_bad_input_naming_the_batch_and_the_label():
    """Labels 1 and 4 for a binary classifier: the head's check, run in the step, is exit 2
    (lockstep.refused_input), naming the batch, the check and the labels."""
    from sync_mnist.task import lockstep

    model = canned.LinearClassifier([fc.numeric_column("x")], train_input_fn=None,
                                    eval_input_fn=None)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        _with_logits_x(model, {"x": np.array([[0.5], [1.0]], np.float32)}, np.array([1, 4]),
                       sm.ModeKeys.TRAIN, lambda spec: spec.loss)
    refused = lockstep.refused_input(raised.value, 7, 1)
    assert isinstance(refused, DataError)
    assert str(refused) == (
        "batch 7 of worker 1's input failed the model's check: [labels must be <= 1] "
        "[Condition x <= y did not hold element-wise:] [x (head/strided_slice_4:0) = ] "
        "[[1][4]] [y (head/Cast:0) = ] [1]")
    other = tf.errors.InvalidArgumentError(None, None, "Received a label value of 4")
    assert lockstep.refused_input(other, 7, 1) is other  # not a check: the error itself
