"""The canned models (sync_mnist/canned.py) as graphs, without a session: the Estimator's
variable names under its scopes, its default optimizers and learning rates, the heads'
predictions and metrics under its keys, a wide & deep worker graph on 2 ps giving each part
its own optimizer's slots, and the arguments refused with the reason. Their arithmetic and a
synchronous run: tests/inprocess/test_canned.py."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
import sync_mnist.canned as canned
from mlp_graph import prepared_graph
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskConfig, TrainConfig

tf1 = tf.compat.v1
fc = tf1.feature_column
ROWS = 16


def _data(params=None):
    rng = np.random.default_rng(0)
    features = {"x": rng.normal(size=(ROWS, 2)).astype(np.float32),
                "color": rng.choice(["red", "green", "blue"], (ROWS, 1)),
                "w": np.ones(ROWS, np.float32)}
    return features, (features["x"].sum(axis=1) > 0).astype(np.int64)


def _columns():
    """(wide, deep): a numeric and a vocabulary column; the same numeric, an embedding."""
    x = fc.numeric_column("x", shape=[2])
    color = fc.categorical_column_with_vocabulary_list("color", ["red", "green", "blue"])
    return [x, color], [x, fc.embedding_column(color, 3)]


def _make(name: str, **kwargs) -> sm.Model:
    wide, deep = _columns()
    inputs = dict(train_input_fn=_data, eval_input_fn=_data)
    if name.startswith("DNNLinearCombined"):
        kwargs = dict(linear_feature_columns=wide, dnn_feature_columns=deep,
                      dnn_hidden_units=[4], **kwargs)
        return getattr(canned, name)(**inputs, **kwargs)
    columns = deep if name.startswith("DNN") else wide
    hidden = ([4],) if name.startswith("DNN") else ()
    return getattr(canned, name)(*hidden, columns, **inputs, **kwargs)


def _spec(model: sm.Model, mode: str, labels=None) -> sm.ModelSpec:
    """The model function's spec in `mode`, in the current graph (plain variables)."""
    features, default_labels = _data()
    features = {k: tf1.placeholder(tf.as_dtype(v.dtype), [None, *v.shape[1:]])
                for k, v in features.items()}
    labels = default_labels if labels is None else labels
    label = tf1.placeholder(tf.as_dtype(labels.dtype), [None, *labels.shape[1:]])
    return model.model_fn(features, None if mode == sm.ModeKeys.PREDICT else label, mode, {})


def _variables(model: sm.Model) -> dict[str, bool]:
    """{name: trainable} of what the model makes in TRAIN mode."""
    with tf.Graph().as_default():
        _spec(model, sm.ModeKeys.TRAIN)
        trainable = {v.op.name for v in tf1.trainable_variables()}
        return {v.op.name: v.op.name in trainable for v in tf1.global_variables()}


DNN = {"dnn/input_from_feature_columns/input_layer/color_embedding/embedding_weights": True,
       "dnn/hiddenlayer_0/kernel": True, "dnn/hiddenlayer_0/bias": True,
       "dnn/logits/kernel": True, "dnn/logits/bias": True}
LINEAR = {"linear/linear_model/x/weights": True, "linear/linear_model/color/weights": True,
          "linear/linear_model/bias_weights": True}
BATCH_NORM = {"dnn/hiddenlayer_0/batchnorm_0/gamma": True,
              "dnn/hiddenlayer_0/batchnorm_0/beta": True,
              "dnn/hiddenlayer_0/batchnorm_0/moving_mean": False,
              "dnn/hiddenlayer_0/batchnorm_0/moving_variance": False}


@pytest.mark.parametrize("name, kwargs, expected", [
    ("DNNClassifier", {}, DNN),
    ("DNNClassifier", {"batch_norm": True}, {**DNN, **BATCH_NORM}),
    ("DNNRegressor", {}, DNN),
    ("LinearClassifier", {}, LINEAR),
    ("LinearRegressor", {}, LINEAR),
    ("DNNLinearCombinedClassifier", {}, {**DNN, **LINEAR}),
    ("DNNLinearCombinedRegressor", {"batch_norm": True}, {**DNN, **LINEAR, **BATCH_NORM}),
])
def test_each_model_makes_the_estimators_variables_under_its_scopes(name, kwargs, expected):
    """The names tensorflow_estimator's tests pin (dnn_testing_utils, linear_testing_utils)."""
    assert _variables(_make(name, **kwargs)) == expected


def _optimizers(model: sm.Model) -> dict[str, tuple[str, float]]:
    with tf.Graph().as_default():
        optimizer = _spec(model, sm.ModeKeys.TRAIN).optimizer
    if not isinstance(optimizer, dict):
        optimizer = {"": optimizer}
    return {scope: (type(opt).__name__, _rate(opt)) for scope, opt in optimizer.items()}


def _rate(optimizer) -> float:
    # pylint: disable=protected-access
    return optimizer._lr if hasattr(optimizer, "_lr") else optimizer._learning_rate


def _many_columns(params=None):
    return {f"f{i}": np.zeros((ROWS, 1), np.float32) for i in range(36)}, _data()[1]


@pytest.mark.parametrize("name, kwargs, expected", [
    ("DNNClassifier", {}, {"": ("AdagradOptimizer", 0.05)}),
    ("DNNRegressor", {"optimizer": "SGD"}, {"": ("GradientDescentOptimizer", 0.05)}),
    ("LinearClassifier", {}, {"": ("FtrlOptimizer", 0.2)}),
    ("LinearRegressor", {"optimizer": lambda: tf1.train.AdamOptimizer(0.3)},
     {"": ("AdamOptimizer", 0.3)}),
    ("DNNLinearCombinedClassifier", {},
     {"dnn": ("AdagradOptimizer", 0.001), "linear": ("FtrlOptimizer", 0.005)}),
    ("DNNLinearCombinedRegressor", {"dnn_optimizer": "Adam", "linear_optimizer": "SGD"},
     {"dnn": ("AdamOptimizer", 0.001), "linear": ("GradientDescentOptimizer", 0.005)}),
])
def test_the_estimators_default_optimizers_and_the_rate_a_name_gets(name, kwargs, expected):
    assert _optimizers(_make(name, **kwargs)) == expected


def test_a_linear_model_without_an_optimizer_takes_ftrl_at_one_over_root_columns():
    """LinearClassifier(optimizer=None): FTRL at min(0.2, 1 / sqrt(36 columns)) = 1/6."""
    columns = [fc.numeric_column(f"f{i}") for i in range(36)]
    model = canned.LinearClassifier(columns, optimizer=None, train_input_fn=_many_columns,
                                    eval_input_fn=_many_columns)
    with tf.Graph().as_default():
        features, labels = _many_columns()
        spec = model.model_fn({k: tf.constant(v) for k, v in features.items()},
                              tf.constant(labels), sm.ModeKeys.TRAIN, {})
    assert isinstance(spec.optimizer, tf1.train.FtrlOptimizer)
    assert _rate(spec.optimizer) == pytest.approx(1 / 6)


def test_an_optimizer_function_is_called_in_each_graph():
    made = []
    model = _make("DNNClassifier", optimizer=lambda: made.append(
        tf1.train.AdagradOptimizer(0.1)) or made[-1])
    for _ in range(2):
        _optimizers(model)
    assert len(made) == 2 and made[0] is not made[1]


BINARY = ["accuracy", "accuracy_baseline", "auc", "auc_precision_recall", "average_loss",
          "label/mean", "loss", "precision", "prediction/mean", "recall"]
CLASSES = ["all_class_ids", "all_classes", "class_ids", "classes", "logits", "probabilities"]


@pytest.mark.parametrize("name, kwargs, metrics, predictions", [
    ("DNNLinearCombinedClassifier", {}, BINARY, sorted(CLASSES + ["logistic"])),
    ("LinearClassifier", {"n_classes": 3}, ["accuracy", "average_loss", "loss"], CLASSES),
    ("DNNRegressor", {}, ["average_loss", "label/mean", "loss", "prediction/mean"],
     ["predictions"]),
])
def test_the_heads_predictions_and_metrics_have_the_estimators_keys(name, kwargs, metrics,
                                                                    predictions):
    model = _make(name, **kwargs)
    with tf.Graph().as_default():
        assert sorted(_spec(model, sm.ModeKeys.EVAL).eval_metric_ops) == metrics
    with tf.Graph().as_default():
        assert sorted(_spec(model, sm.ModeKeys.PREDICT).predictions) == predictions


def test_wide_and_deep_on_two_ps_gives_each_part_its_optimizers_slots_beside_it():
    """The worker graph the package builds: the dict of optimizers accepted, FTRL's slots on
    the linear part's variables and Adagrad's on the deep part's, each beside its slice; batch
    norm's moving statistics updated as the package updates them (core/audit.py)."""
    layout = ClusterLayout(("p0:1", "p1:1"), ("w0:1", "w1:1"))
    config = TaskConfig(role="worker", index=0, cluster=layout,
                        train=TrainConfig(train_steps=1, batch_size=4))
    built = prepared_graph(config, _make("DNNLinearCombinedClassifier", batch_norm=True,
                                         dnn_dropout=0.5))
    optimizer = built.g.training.optimizer
    with built.graph.as_default():
        trainable = tf1.trainable_variables()
    accumulated = {op.get_attr("shared_name").decode() for op in built.graph.get_operations()
                   if op.type.endswith("ConditionalAccumulator")}
    assert {name for name in accumulated if "moving" in name} == {
        "dnn/hiddenlayer_0/batchnorm_0/moving_mean:0/grad_accum",
        "dnn/hiddenlayer_0/batchnorm_0/moving_variance:0/grad_accum"}
    slots = {(v.op.name, name): optimizer.get_slot(v, name) for v in trainable
             for name in optimizer.get_slot_names()}
    slots = {key: s for key, s in slots.items() if s is not None}
    kinds = {(name.split("/")[0], slot) for name, slot in slots}
    assert kinds == {("dnn", "accumulator"), ("linear", "accum"), ("linear", "linear")}
    assert {v.op.name.split("/")[0] for v in trainable} == {"dnn", "linear"}
    assert len(slots) == sum(2 if v.op.name.startswith("linear/") else 1 for v in trainable)
    assert {v.device for v in trainable} == {"/job:ps/task:0", "/job:ps/task:1"}
    assert all(s.device == v.device for v in trainable for (name, _), s in slots.items()
               if name == v.op.name)


@pytest.mark.parametrize("make, error", [
    (lambda: _make("DNNClassifier", model_dir="/tmp/m"),
     "model_dir is an argument of the Estimator, not of sync_mnist's canned models: here "
     "that is the command line's --logdir"),
    (lambda: _make("LinearRegressor", loss_reduction=tf1.losses.Reduction.NONE),
     "loss_reduction 'none' is not taken here: tf.compat.v1.losses.Reduction.SUM (v1's "
     "canned models' default, and these), SUM_OVER_BATCH_SIZE (TensorFlow 2's), MEAN or "
     "SUM_BY_NONZERO_WEIGHTS"),
    (lambda: _make("DNNClassifier", hidden_unit=[3]), "unexpected keyword argument "
                                                      "'hidden_unit'"),
    (lambda: _make("DNNClassifier", optimizer="Adadelta"),
     "Unsupported optimizer name: Adadelta. Supported names are: ('Adagrad', 'Adam', "
     "'Ftrl', 'RMSProp', 'SGD')"),
    (lambda: canned.DNNLinearCombinedClassifier(train_input_fn=_data, eval_input_fn=_data),
     "Either linear_feature_columns or dnn_feature_columns must be defined."),
    (lambda: canned.DNNLinearCombinedClassifier(
        dnn_feature_columns=_columns()[1], train_input_fn=_data, eval_input_fn=_data),
     "dnn_hidden_units must be defined when dnn_feature_columns is specified."),
    (lambda: _make("LinearClassifier", n_classes=3, label_vocabulary=["a", "b"]),
     "label_vocabulary has 2 labels for n_classes=3"),
    (lambda: _make("DNNRegressor", hooks=_Hook()),
     "hooks must be a list of tf.compat.v1.train.SessionRunHook, got _Hook"),
    (lambda: _make("LinearClassifier", chief_hooks=[_Hook(), print]),
     "chief_hooks[1] must be a tf.compat.v1.train.SessionRunHook, got "
     "builtin_function_or_method"),
])
def test_arguments_are_refused_where_the_model_is_made_saying_why(make, error):
    with pytest.raises((TypeError, ValueError)) as raised:
        make()
    assert str(raised.value) == error


class _Hook(tf1.train.SessionRunHook):
    pass


@pytest.mark.parametrize("name", ["DNNClassifier", "DNNRegressor", "LinearClassifier",
                                  "LinearRegressor", "DNNLinearCombinedClassifier",
                                  "DNNLinearCombinedRegressor"])
def test_each_model_takes_hooks_as_a_train_spec_did(name):
    """hooks: every worker's training hooks; chief_hooks: the chief's alone
    (tests/inprocess/test_canned.py runs them)."""
    every, chief = _Hook(), _Hook()
    model = _make(name, hooks=[every], chief_hooks=(chief,))
    with tf.Graph().as_default():
        spec = _spec(model, sm.ModeKeys.TRAIN)
    with tf.Graph().as_default():
        evaluated = _spec(model, sm.ModeKeys.EVAL)
    assert list(spec.training_hooks) == [every] and list(spec.training_chief_hooks) == [chief]
    assert not evaluated.training_hooks and not evaluated.evaluation_hooks
    with tf.Graph().as_default():
        plain = _spec(_make(name), sm.ModeKeys.TRAIN)
    assert not plain.training_hooks and not plain.training_chief_hooks


def test_labels_the_head_cannot_read_are_refused_in_the_graph():
    """String labels without a vocabulary; float class ids for more than two classes."""
    with tf.Graph().as_default(), pytest.raises(ValueError, match="without a label_vocabulary, "
                                                                  "got string"):
        _spec(_make("LinearClassifier"), sm.ModeKeys.TRAIN, np.array(["yes"] * ROWS))
    with tf.Graph().as_default(), pytest.raises(ValueError, match="integer class ids"):
        _spec(_make("LinearClassifier", n_classes=3), sm.ModeKeys.TRAIN,
              np.zeros(ROWS, np.float32))
