"""The canned Estimators of TensorFlow 1.15, as functions that return a `Model`.

`DNNClassifier`, `LinearClassifier`, `DNNLinearCombinedClassifier` (wide & deep) and their
regressors take the Estimator's arguments, with its defaults, and a Model's input functions:

    import sync_mnist.canned as canned

    MODEL = canned.DNNLinearCombinedClassifier(
        linear_feature_columns=[...], dnn_feature_columns=[...], dnn_hidden_units=[100, 50],
        train_input_fn=train_input_fn, eval_input_fn=eval_input_fn)

and `sync-mnist-cluster --model file.py:MODEL`. Each builds the Estimator's model over
tf.compat.v1.feature_column: its variables under the Estimator's names, so the deep part is
scope "dnn" and the wide part "linear", each with its own optimizer in one synchronous update
(core/by_scope.py); its default optimizers and learning rates; the heads' predictions and
evaluation metrics under the Estimator's keys; its SavedModel, which takes serialized
tf.train.Examples (parsed by the columns' make_parse_example_spec, unless serving_input_fn
says otherwise) and answers through the heads' signatures: "classification", "regression" (the
binary classifier's logistic, and the regressors') and "predict"; its loss, summed over the batch as
v1's was unless loss_reduction says otherwise (`_model_fn`), and hooks as a TrainSpec took them.
What differs: the arguments in ESTIMATOR_ONLY are refused, naming what takes their place.
docs/model-reference.md, "Canned models", has the whole list.
"""

# The public functions have the Estimator classes' names, so that a migrated program changes
# its import and not its calls.
# pylint: disable=invalid-name

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import tensorflow as tf

from sync_mnist import api

tf1 = tf.compat.v1
fc = tf1.feature_column

# The Estimator's default learning rates (tensorflow_estimator 1.15, canned/dnn.py, linear.py,
# dnn_linear_combined.py): an optimizer given by name gets the rate of its part.
DNN_LEARNING_RATE = 0.05
LINEAR_LEARNING_RATE = 0.2  # LinearClassifier(optimizer=None): min(this, 1 / sqrt(columns))
COMBINED_DNN_LEARNING_RATE = 0.001
COMBINED_LINEAR_LEARNING_RATE = 0.005  # min(this, 1 / sqrt(linear columns))
BATCH_NORM_MOMENTUM = 0.999  # the Estimator's, "the default of tf.contrib.layers.batch_norm"
BATCH_NORM_EPSILON = 1e-3

OPTIMIZERS = {"Adagrad": tf1.train.AdagradOptimizer, "Adam": tf1.train.AdamOptimizer,
              "Ftrl": tf1.train.FtrlOptimizer, "RMSProp": tf1.train.RMSPropOptimizer,
              "SGD": tf1.train.GradientDescentOptimizer}

# The Estimator's arguments that are not this package's, and what does their job here.
ESTIMATOR_ONLY = {
    "model_dir": "the command line's --logdir",
    "config": "the command line (--ps, --workers, --save-steps, --seed)",
    "warm_start_from": "the command line's --warm-start-from (--warm-start-vars, --warm-start-map)",
    "partitioner": "the package: it cuts every variable over the ps (--ps)",
    "input_layer_partitioner": "the package: it cuts every variable over the ps (--ps)",
}

# loss_reduction: tf.compat.v1.losses.Reduction's (v1's canned models took any but NONE), and
# Keras's names for the two TensorFlow 2's canned models took.
REDUCTION = tf1.losses.Reduction
LOSS_REDUCTIONS = {**{r: r for r in (REDUCTION.SUM, REDUCTION.SUM_OVER_BATCH_SIZE,
                                     REDUCTION.MEAN, REDUCTION.SUM_BY_NONZERO_WEIGHTS)},
                   "sum": REDUCTION.SUM, "sum_over_batch_size": REDUCTION.SUM_OVER_BATCH_SIZE}
# The default: v1's sum over the batch, as these are v1's canned models (TensorFlow 2's took
# the batch mean, SUM_OVER_BATCH_SIZE); _model_fn says what each does.
V1_SUM = REDUCTION.SUM


# --------------------------------------------------------------------------- the two parts


class _Part(NamedTuple):
    """The deep or the wide part: its variable scope (its optimizer's key), its logits, and
    its optimizer (a name, an Optimizer or a callable) with the rate a name gets; its feature
    columns, which say what the SavedModel parses from a tf.train.Example."""

    scope: str
    logits: Callable  # logits(features, mode, units) -> float32 [batch, units]
    optimizer: Any
    learning_rate: float
    columns: list


def _dnn(hidden_units, feature_columns, optimizer, learning_rate, activation_fn=tf.nn.relu,
         dropout=None, batch_norm=False) -> _Part:
    """The Estimator's DNN: input_layer, then per layer dense, dropout (training only) and
    batch norm, then the logits; each under its name in scope "dnn"."""
    hidden_units, feature_columns = list(hidden_units), list(feature_columns)

    def logits(features, mode, units):
        training = mode == api.ModeKeys.TRAIN
        with tf1.variable_scope("dnn"):
            with tf1.variable_scope("input_from_feature_columns"):
                net = fc.input_layer(features, feature_columns)
            for layer, width in enumerate(hidden_units):
                with tf1.variable_scope(f"hiddenlayer_{layer}"):
                    net = _dense(net, width, activation_fn)
                    if dropout is not None and training:
                        net = tf.nn.dropout(net, rate=dropout)
                    if batch_norm:
                        net = _batch_norm(net, training, f"batchnorm_{layer}")
            with tf1.variable_scope("logits"):
                return _dense(net, units)

    return _Part("dnn", logits, _checked(optimizer), learning_rate, feature_columns)


def _linear(feature_columns, optimizer, learning_rate, sparse_combiner="sum") -> _Part:
    """The Estimator's linear model: linear_model in scope "linear"."""
    feature_columns = list(feature_columns)

    def logits(features, mode, units):
        with tf1.variable_scope("linear"):
            return fc.linear_model(features, feature_columns, units=units,
                                   sparse_combiner=sparse_combiner)

    return _Part("linear", logits, _checked(optimizer), learning_rate, feature_columns)


def _dense(x: tf.Tensor, units: int, activation_fn=None) -> tf.Tensor:
    kernel = tf1.get_variable("kernel", [x.shape[-1], units],
                              initializer=tf1.glorot_uniform_initializer())
    bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
    y = tf.matmul(x, kernel) + bias
    return y if activation_fn is None else activation_fn(y)


def _batch_norm(x: tf.Tensor, training: bool, name: str) -> tf.Tensor:
    """tf.layers.batch_normalization as the Estimator's DNN called it, spelled out (the layer
    needs Keras 2): training normalises with the batch's statistics and puts the moving
    statistics' updates in UPDATE_OPS, which the package averages over the workers once per
    update (as for models/cnn.py); otherwise the moving statistics."""
    with tf1.variable_scope(name):
        width = [x.shape[-1]]
        gamma = tf1.get_variable("gamma", width, initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", width, initializer=tf1.zeros_initializer())
        moving_mean = tf1.get_variable("moving_mean", width, trainable=False,
                                       initializer=tf1.zeros_initializer())
        moving_variance = tf1.get_variable("moving_variance", width, trainable=False,
                                           initializer=tf1.ones_initializer())
    if training:
        mean, variance = tf.nn.moments(x, [0])
        for moving, batch in ((moving_mean, mean), (moving_variance, variance)):
            tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, tf1.assign_sub(
                moving, (moving - batch) * (1 - BATCH_NORM_MOMENTUM)))
    else:
        mean, variance = moving_mean, moving_variance
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, BATCH_NORM_EPSILON)


def _checked(optimizer):
    """`optimizer` as given, if it is one the Estimator took; ValueError otherwise."""
    if isinstance(optimizer, str) and optimizer not in OPTIMIZERS:
        raise ValueError(f"Unsupported optimizer name: {optimizer}. Supported names are: "
                         f"{tuple(sorted(OPTIMIZERS))}")
    if not (isinstance(optimizer, (str, tf1.train.Optimizer)) or callable(optimizer)):
        raise ValueError("The given object is not an Optimizer instance, a name or a callable "
                         f"that makes one. Given: {optimizer!r}")
    return optimizer


def _optimizer(part: _Part) -> tf1.train.Optimizer:
    """The part's optimizer in this graph (the Estimator's get_optimizer_instance)."""
    if isinstance(part.optimizer, str):
        return OPTIMIZERS[part.optimizer](learning_rate=part.learning_rate)
    made = part.optimizer
    if callable(made) and not isinstance(made, tf1.train.Optimizer):
        made = made()
    if not isinstance(made, tf1.train.Optimizer):
        raise ValueError(f"the {part.scope} part's optimizer function returned "
                         f"{type(made).__name__}, not a tf.compat.v1.train.Optimizer")
    return made


# ------------------------------------------------------------------------------- the heads

# The heads' signatures besides "serving_default" (tensorflow_estimator's canned/head.py: "a
# local convention without any special meaning", which TensorFlow Serving's clients named).
CLASSIFY_SERVING_KEY = "classification"
REGRESS_SERVING_KEY = "regression"
PREDICT_SERVING_KEY = "predict"


class _BinaryHead:
    """Two classes: one logit, the logistic loss (tf.estimator's binary logistic head)."""

    units = 1

    def __init__(self, label_vocabulary=None):
        self.vocabulary = label_vocabulary

    def predictions(self, logits):
        two = tf.concat([tf.zeros_like(logits), logits], axis=-1)
        return {"logits": logits, "logistic": tf.sigmoid(logits),
                **_class_predictions(two, self.vocabulary)}

    @staticmethod
    def export_outputs(predictions) -> dict:
        """The binary head's signatures: the classes' scores, the logistic as a regression,
        everything as predict."""
        classes = _classification_output(predictions)
        return {api.DEFAULT_SERVING_KEY: classes, CLASSIFY_SERVING_KEY: classes,
                REGRESS_SERVING_KEY: api.RegressionOutput(predictions["logistic"]),
                PREDICT_SERVING_KEY: api.PredictOutput(predictions)}

    def loss(self, labels, logits):
        """(labels as float32 [batch, 1] in [0, 1], the loss of each example)."""
        labels = tf.cast(_label_ids(labels, 2, self.vocabulary, integer=False), tf.float32)
        return labels, tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)

    @staticmethod
    def metrics(labels, predictions, losses, weights) -> dict:
        logistic, class_ids = predictions["logistic"], predictions["class_ids"]
        label_mean = tf1.metrics.mean(labels, weights=weights)
        return {
            "average_loss": tf1.metrics.mean(losses, weights=weights),
            "accuracy": tf1.metrics.accuracy(labels, class_ids, weights=weights),
            "precision": tf1.metrics.precision(labels, class_ids, weights=weights),
            "recall": tf1.metrics.recall(labels, class_ids, weights=weights),
            "prediction/mean": tf1.metrics.mean(logistic, weights=weights),
            "label/mean": label_mean,
            # Always predicting the more common class: a trained model should beat it.
            "accuracy_baseline": tuple(tf.maximum(m, 1 - m) for m in label_mean),
            "auc": tf1.metrics.auc(labels, logistic, weights=weights),
            "auc_precision_recall": tf1.metrics.auc(labels, logistic, weights=weights,
                                                    curve="PR"),
        }


class _MultiClassHead:
    """n_classes > 2: one logit per class, softmax cross-entropy."""

    def __init__(self, n_classes: int, label_vocabulary=None):
        self.units, self.vocabulary = n_classes, label_vocabulary

    def predictions(self, logits):
        return {"logits": logits, **_class_predictions(logits, self.vocabulary)}

    @staticmethod
    def export_outputs(predictions) -> dict:
        classes = _classification_output(predictions)
        return {api.DEFAULT_SERVING_KEY: classes, CLASSIFY_SERVING_KEY: classes,
                PREDICT_SERVING_KEY: api.PredictOutput(predictions)}

    def loss(self, labels, logits):
        """(labels as int64 class ids [batch, 1], the loss of each example)."""
        ids = _label_ids(labels, self.units, self.vocabulary, integer=True)
        return ids, tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=ids[:, 0], logits=logits)[:, None]

    @staticmethod
    def metrics(labels, predictions, losses, weights) -> dict:
        return {"average_loss": tf1.metrics.mean(losses, weights=weights),
                "accuracy": tf1.metrics.accuracy(labels, predictions["class_ids"],
                                                 weights=weights)}


class _RegressionHead:
    """label_dimension outputs, the squared error."""

    def __init__(self, label_dimension: int = 1):
        self.units = label_dimension

    @staticmethod
    def predictions(logits):
        return {"predictions": logits}

    @staticmethod
    def export_outputs(predictions) -> dict:
        value = api.RegressionOutput(predictions["predictions"])
        return {api.DEFAULT_SERVING_KEY: value, REGRESS_SERVING_KEY: value,
                PREDICT_SERVING_KEY: api.PredictOutput(predictions)}

    def loss(self, labels, logits):
        labels = tf.cast(_as_column(labels, self.units), tf.float32)
        return labels, tf.math.squared_difference(labels, logits)

    @staticmethod
    def metrics(labels, predictions, losses, weights) -> dict:
        return {"average_loss": tf1.metrics.mean(losses, weights=weights),
                "prediction/mean": tf1.metrics.mean(predictions["predictions"],
                                                    weights=weights),
                "label/mean": tf1.metrics.mean(labels, weights=weights)}


def _classifier_head(n_classes: int, label_vocabulary):
    if not isinstance(n_classes, int) or n_classes < 2:
        raise ValueError(f"n_classes must be an integer of at least 2: {n_classes!r}")
    if label_vocabulary is not None and len(label_vocabulary) != n_classes:
        raise ValueError(f"label_vocabulary has {len(label_vocabulary)} labels for "
                         f"n_classes={n_classes}")
    return _BinaryHead(label_vocabulary) if n_classes == 2 else \
        _MultiClassHead(n_classes, label_vocabulary)


def _class_predictions(logits, vocabulary) -> dict:
    """The classes' predictions from one logit per class: probabilities, the most probable
    class (its id, and its name: the vocabulary's, or the id as a string) and every class."""
    n = logits.shape[-1]
    names = tf.constant(list(vocabulary) if vocabulary else [str(i) for i in range(n)])
    class_ids = tf.argmax(logits, axis=-1)[:, None]
    rows = [tf.shape(logits)[0], 1]
    return {"probabilities": tf.nn.softmax(logits), "class_ids": class_ids,
            "classes": tf.gather(names, class_ids),
            "all_class_ids": tf.tile(tf.range(n)[None, :], rows),
            "all_classes": tf.tile(names[None, :], rows)}


def _classification_output(predictions) -> api.ClassificationOutput:
    """Each class's probability, beside its name (as the Estimator's _classification_output:
    every class in every row, TensorFlow Serving's Classify API takes string classes)."""
    return api.ClassificationOutput(scores=predictions["probabilities"],
                                    classes=predictions["all_classes"])


def _label_ids(labels, n_classes: int, vocabulary, integer: bool) -> tf.Tensor:
    """Labels as [batch, 1]: a string's index in `vocabulary`, else the label itself (an
    integer, for more than two classes); checked as they are read to be in [0, n_classes - 1],
    as the Estimator checked them (a label out of range would train the logistic loss on
    nonsense without a word)."""
    labels = _as_column(labels, 1)
    if vocabulary:
        if labels.dtype != tf.string:
            raise ValueError(f"labels must be strings with a label_vocabulary, got "
                             f"{labels.dtype.name}")
        matches = tf.equal(labels, tf.constant(list(vocabulary)))  # [batch, n_classes]
        known = tf.debugging.Assert(tf.reduce_all(tf.reduce_any(matches, axis=-1)), [
            f"a label is not in label_vocabulary {list(vocabulary)}:", labels])
        with tf.control_dependencies([known]):
            return tf.argmax(tf.cast(matches, tf.int32), axis=-1)[:, None]
    if labels.dtype == tf.bool and not integer:
        # The binary head cast its labels to float before their range check, so a bool label
        # was one (the census program's `tf.equal(income_bracket, ">50K")`).
        labels = tf.cast(labels, tf.float32)
    if labels.dtype == tf.string or (integer and not labels.dtype.is_integer):
        raise ValueError(f"labels must be {'integer class ids' if integer else 'numbers'} "
                         f"without a label_vocabulary, got {labels.dtype.name}")
    checks = [tf.debugging.assert_non_negative(labels, message="labels must be >= 0"),
              tf.debugging.assert_less_equal(labels, tf.cast(n_classes - 1, labels.dtype),
                                             message=f"labels must be <= {n_classes - 1}")]
    with tf.control_dependencies(checks):
        return tf.identity(labels)


def _as_column(labels, width: int) -> tf.Tensor:
    """Labels of one value per example, [batch], as [batch, 1]; [batch, width] as they are."""
    if labels is None:
        raise ValueError("the input function gave no labels")
    labels = tf.convert_to_tensor(labels)
    return labels[:, None] if labels.shape.rank == 1 and width == 1 else labels


# --------------------------------------------------------------------------- the model


def _weights(features, weight_column) -> tf.Tensor | None:
    """The examples' weights, [batch, 1] (or [batch, label_dimension]): the feature
    `weight_column` names, through its normalizer if it is a numeric column."""
    if weight_column is None:
        return None
    key = weight_column if isinstance(weight_column, str) else weight_column.key
    weights = tf.cast(features[key], tf.float32)
    if getattr(weight_column, "normalizer_fn", None) is not None:
        weights = weight_column.normalizer_fn(weights)
    return weights[:, None] if weights.shape.rank == 1 else weights


def _model_fn(head, parts: Sequence[_Part], weight_column, reduction: str, hooks: Sequence,
              chief_hooks: Sequence) -> Callable:
    """The model function: the parts' logits, added, through the head.

    The loss trained is the weighted losses reduced by `reduction`: by default their sum over
    the batch (SUM, the default of v1's canned models, whose names and arguments these are), so
    that each update averages N batch sums, as SyncReplicasOptimizer did over an Estimator, and
    a program migrated from TF 1.x takes the steps it took at the same settings. With
    SUM_OVER_BATCH_SIZE (the default of TensorFlow 2's canned Estimators) each update averages
    N batch means, and a learning rate means the same at any batch size; the steps are then 1/B
    of the sum's for SGD, and smaller first steps for Adagrad and FTRL, whose starting
    accumulator of 0.1 then weighs more. The `loss` metric is that loss's mean over the
    evaluation batches, as Estimator.evaluate reported it; the EVAL spec's own loss is the
    batch mean, as ModelSpec's contract asks, so that the chief's test_loss is per example.
    """
    def model_fn(features, labels, mode, params):
        if not isinstance(features, Mapping):
            raise ValueError("features must be a dict of tensors (one per feature column's "
                             f"key), got {type(features).__name__}")
        logits = tf.add_n([part.logits(features, mode, head.units) for part in parts])
        with tf1.name_scope("head"):
            predictions = head.predictions(logits)
            if mode == api.ModeKeys.PREDICT:
                return api.ModelSpec(mode, predictions=predictions,
                                     export_outputs=head.export_outputs(predictions))
            labels, losses = head.loss(labels, logits)
            weights = _weights(features, weight_column)
            loss = _reduced(losses, weights, reduction)
        if mode == api.ModeKeys.TRAIN:
            optimizers = {part.scope: _optimizer(part) for part in parts}
            return api.ModelSpec(mode, loss=loss, optimizer=optimizers if len(parts) > 1
                                 else optimizers[parts[0].scope], training_hooks=hooks,
                                 training_chief_hooks=chief_hooks)
        with tf1.name_scope("metrics"):
            metrics = head.metrics(labels, predictions, losses, weights)
            metrics["loss"] = tf1.metrics.mean(loss)  # as Estimator.evaluate added it
        return api.ModelSpec(mode, loss=_reduced(losses, weights, REDUCTION.SUM_OVER_BATCH_SIZE),
                             eval_metric_ops=metrics)

    return model_fn


def _reduced(losses, weights, reduction: str) -> tf.Tensor:
    """The examples' losses, each times its weight, reduced over the batch as v1's heads did."""
    return tf1.losses.compute_weighted_loss(losses, 1.0 if weights is None else weights,
                                            reduction=reduction, loss_collection=None)


def _reduction(loss_reduction) -> str:
    """loss_reduction as tf.compat.v1.losses.Reduction names it, checked."""
    if not isinstance(loss_reduction, str) or loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(
            f"loss_reduction {loss_reduction!r} is not taken here: tf.compat.v1.losses."
            "Reduction.SUM (v1's canned models' default, and "
            "these), SUM_OVER_BATCH_SIZE (TensorFlow 2's), MEAN or SUM_BY_NONZERO_WEIGHTS")
    return LOSS_REDUCTIONS[loss_reduction]


def _model(head, parts: Sequence[_Part], weight_column, estimator_only: Mapping[str, Any],
           train_input_fn, eval_input_fn, serving_input_fn, params, hooks=(),
           chief_hooks=(), loss_reduction=V1_SUM) -> api.Model:
    for name in estimator_only:
        if name in ESTIMATOR_ONLY:
            raise TypeError(f"{name} is an argument of the Estimator, not of sync_mnist's "
                            f"canned models: here that is {ESTIMATOR_ONLY[name]}")
        raise TypeError(f"unexpected keyword argument {name!r}")
    if weight_column is not None and not isinstance(weight_column, str) and \
            not hasattr(weight_column, "key"):
        raise TypeError("weight_column must be a feature's key or a numeric_column, got "
                        f"{type(weight_column).__name__}")
    hooks, chief_hooks = _hooks("hooks", hooks), _hooks("chief_hooks", chief_hooks)
    reduction = _reduction(loss_reduction)
    if serving_input_fn is None:
        serving_input_fn = api.parsing_serving_input_fn(_parse_spec(parts))
    return api.Model(_model_fn(head, parts, weight_column, reduction, hooks, chief_hooks),
                     train_input_fn, eval_input_fn, serving_input_fn=serving_input_fn,
                     params=dict(params or {}))


def _hooks(name: str, hooks) -> list:
    """`hooks` (TrainSpec(hooks=...)'s: every worker's; chief_hooks: the chief's alone) as the
    TRAIN ModelSpec's, checked here, where the program names them."""
    if isinstance(hooks, tf1.train.SessionRunHook) or not isinstance(hooks, (list, tuple)):
        raise TypeError(f"{name} must be a list of tf.compat.v1.train.SessionRunHook, got "
                        f"{type(hooks).__name__}")
    for k, hook in enumerate(hooks):
        if not isinstance(hook, tf1.train.SessionRunHook):
            raise TypeError(f"{name}[{k}] must be a tf.compat.v1.train.SessionRunHook, got "
                            f"{type(hook).__name__}")
    return list(hooks)


def _parse_spec(parts: Sequence[_Part]) -> dict:
    """What the SavedModel parses from a tf.train.Example: the features of the parts' columns,
    and so not the weight column (unless a part reads it), which serving needs no more than
    the labels."""
    return fc.make_parse_example_spec([c for part in parts for c in part.columns])


def _combined(linear_feature_columns, linear_optimizer, dnn_feature_columns, dnn_optimizer,
              dnn_hidden_units, dnn_activation_fn, dnn_dropout, batch_norm,
              linear_sparse_combiner) -> list[_Part]:
    """Wide & deep's parts: either may be absent, not both."""
    linear_feature_columns = list(linear_feature_columns or [])
    dnn_feature_columns = list(dnn_feature_columns or [])
    if not linear_feature_columns and not dnn_feature_columns:
        raise ValueError("Either linear_feature_columns or dnn_feature_columns must be defined.")
    parts = []
    if dnn_feature_columns:
        if not dnn_hidden_units:
            raise ValueError("dnn_hidden_units must be defined when dnn_feature_columns is "
                             "specified.")
        parts.append(_dnn(dnn_hidden_units, dnn_feature_columns, dnn_optimizer,
                          COMBINED_DNN_LEARNING_RATE, dnn_activation_fn, dnn_dropout,
                          batch_norm))
    if linear_feature_columns:
        rate = min(COMBINED_LINEAR_LEARNING_RATE, 1 / math.sqrt(len(linear_feature_columns)))
        parts.append(_linear(linear_feature_columns, linear_optimizer, rate,
                             linear_sparse_combiner))
    return parts


def _linear_default(optimizer, feature_columns) -> tuple[Any, float]:
    """LinearClassifier's optimizer and the rate a name gets: a name at 0.2; None, FTRL at
    min(0.2, 1 / sqrt(columns)) (linear.py's two defaults)."""
    if optimizer is None:
        return "Ftrl", min(LINEAR_LEARNING_RATE, 1 / math.sqrt(len(list(feature_columns))))
    return optimizer, LINEAR_LEARNING_RATE


# ----------------------------------------------------------------- the public functions
# Each takes the Estimator's arguments (keywords after the first), then the input functions
# and params of sync_mnist.api.Model, and the hooks a TrainSpec took: `hooks` every worker's,
# `chief_hooks` the chief's alone (the TRAIN ModelSpec's training_hooks, training_chief_hooks).


def DNNClassifier(hidden_units, feature_columns, *, train_input_fn, eval_input_fn,
                  serving_input_fn=None, params=None, hooks=(), chief_hooks=(), n_classes=2,
                  weight_column=None, label_vocabulary=None, optimizer="Adagrad",
                  activation_fn=tf.nn.relu, dropout=None, batch_norm=False,
                  loss_reduction=V1_SUM, **estimator_only) -> api.Model:
    """tf.estimator.DNNClassifier: dense layers over `feature_columns`, Adagrad at 0.05."""
    part = _dnn(hidden_units, feature_columns, optimizer, DNN_LEARNING_RATE, activation_fn,
                dropout, batch_norm)
    return _model(_classifier_head(n_classes, label_vocabulary), [part], weight_column,
                  estimator_only, train_input_fn, eval_input_fn, serving_input_fn, params,
                  hooks, chief_hooks, loss_reduction)


def DNNRegressor(hidden_units, feature_columns, *, train_input_fn, eval_input_fn,
                 serving_input_fn=None, params=None, hooks=(), chief_hooks=(),
                 label_dimension=1, weight_column=None, optimizer="Adagrad",
                 activation_fn=tf.nn.relu, dropout=None, batch_norm=False,
                 loss_reduction=V1_SUM, **estimator_only) -> api.Model:
    """tf.estimator.DNNRegressor: dense layers over `feature_columns`, Adagrad at 0.05."""
    part = _dnn(hidden_units, feature_columns, optimizer, DNN_LEARNING_RATE, activation_fn,
                dropout, batch_norm)
    return _model(_RegressionHead(label_dimension), [part], weight_column,
                  estimator_only, train_input_fn, eval_input_fn, serving_input_fn, params,
                  hooks, chief_hooks, loss_reduction)


def LinearClassifier(feature_columns, *, train_input_fn, eval_input_fn, serving_input_fn=None,
                     params=None, hooks=(), chief_hooks=(), n_classes=2, weight_column=None,
                     label_vocabulary=None, optimizer="Ftrl", sparse_combiner="sum",
                     loss_reduction=V1_SUM, **estimator_only) -> api.Model:
    """tf.estimator.LinearClassifier: linear_model over `feature_columns`, FTRL at 0.2 (with
    optimizer=None, at min(0.2, 1 / sqrt(len(feature_columns))))."""
    part = _linear(feature_columns, *_linear_default(optimizer, feature_columns),
                   sparse_combiner)
    return _model(_classifier_head(n_classes, label_vocabulary), [part], weight_column,
                  estimator_only, train_input_fn, eval_input_fn, serving_input_fn, params,
                  hooks, chief_hooks, loss_reduction)


def LinearRegressor(feature_columns, *, train_input_fn, eval_input_fn, serving_input_fn=None,
                    params=None, hooks=(), chief_hooks=(), label_dimension=1,
                    weight_column=None, optimizer="Ftrl", sparse_combiner="sum",
                    loss_reduction=V1_SUM, **estimator_only) -> api.Model:
    """tf.estimator.LinearRegressor: linear_model over `feature_columns`, FTRL as
    LinearClassifier's."""
    part = _linear(feature_columns, *_linear_default(optimizer, feature_columns),
                   sparse_combiner)
    return _model(_RegressionHead(label_dimension), [part], weight_column,
                  estimator_only, train_input_fn, eval_input_fn, serving_input_fn, params,
                  hooks, chief_hooks, loss_reduction)


def DNNLinearCombinedClassifier(*, train_input_fn, eval_input_fn, serving_input_fn=None,
                                params=None, hooks=(), chief_hooks=(),
                                linear_feature_columns=None, linear_optimizer="Ftrl",
                                dnn_feature_columns=None,
                                dnn_optimizer="Adagrad", dnn_hidden_units=None,
                                dnn_activation_fn=tf.nn.relu, dnn_dropout=None, n_classes=2,
                                weight_column=None, label_vocabulary=None, batch_norm=False,
                                linear_sparse_combiner="sum", loss_reduction=V1_SUM,
                                **estimator_only) -> api.Model:
    """tf.estimator.DNNLinearCombinedClassifier (wide & deep): the linear part's logits plus
    the deep part's, each trained by its own optimizer in one update: FTRL at
    min(0.005, 1 / sqrt(len(linear_feature_columns))) and Adagrad at 0.001 by default."""
    parts = _combined(linear_feature_columns, linear_optimizer, dnn_feature_columns,
                      dnn_optimizer, dnn_hidden_units, dnn_activation_fn, dnn_dropout,
                      batch_norm, linear_sparse_combiner)
    return _model(_classifier_head(n_classes, label_vocabulary), parts, weight_column,
                  estimator_only, train_input_fn, eval_input_fn, serving_input_fn, params,
                  hooks, chief_hooks, loss_reduction)


def DNNLinearCombinedRegressor(*, train_input_fn, eval_input_fn, serving_input_fn=None,
                               params=None, hooks=(), chief_hooks=(),
                               linear_feature_columns=None, linear_optimizer="Ftrl",
                               dnn_feature_columns=None,
                               dnn_optimizer="Adagrad", dnn_hidden_units=None,
                               dnn_activation_fn=tf.nn.relu, dnn_dropout=None,
                               label_dimension=1, weight_column=None, batch_norm=False,
                               linear_sparse_combiner="sum", loss_reduction=V1_SUM,
                               **estimator_only) -> api.Model:
    """tf.estimator.DNNLinearCombinedRegressor: wide & deep, regressing."""
    parts = _combined(linear_feature_columns, linear_optimizer, dnn_feature_columns,
                      dnn_optimizer, dnn_hidden_units, dnn_activation_fn, dnn_dropout,
                      batch_norm, linear_sparse_combiner)
    return _model(_RegressionHead(label_dimension), parts, weight_column,
                  estimator_only, train_input_fn, eval_input_fn, serving_input_fn, params,
                  hooks, chief_hooks, loss_reduction)
