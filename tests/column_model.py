"""A model function written with tf.compat.v1.feature_column, as Estimator programs were: every
kind of column, into `input_layer` (the deep part) and `linear_model` (the wide part), on 16
examples given either as dense arrays (numpy: strings and ids padded with "" and -1, which the
columns drop) or as variable-length SparseTensors (a tf.data.Dataset, as tf.io.VarLenFeature
parses them) beside dense ones. Tests of feature columns train it and compare what the cluster
made with `reference`: the same model function in one plain session, on all 16 examples a step.

Every table starts from the same values however it is cut over the ps (`RowInitializer`), so
that the cluster and the reference start alike.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import tensorflow as tf

import sync_mnist.api as sm

tf1 = tf.compat.v1
fc = tf1.feature_column

EXAMPLES = 16  # two workers' batches of 8: every update is one step over all of them
VOCABULARY = ["red", "green", "blue"]
WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu"]
LEARNING_RATE = 0.5
# Each column kind's tables (what the model makes), as the checkpoint names them.
TABLES = {
    "embedding, hashed, sum": "input_layer/word_embedding/embedding_weights",
    "embedding, vocabulary, mean": "input_layer/color_embedding/embedding_weights",
    "embedding, crossed, sqrtn": "input_layer/age_bucketized_X_word_embedding/embedding_weights",
    "shared embedding, identity, sqrtn": "input_layer/item_seller_shared_embedding/"
                                         "embedding_weights",
    "linear, bucketized": "linear_model/age_bucketized/weights",
    "linear, hashed": "linear_model/word/weights",
    "linear, vocabulary": "linear_model/color/weights",
    "linear, identity": "linear_model/item/weights",
    "linear, crossed": "linear_model/age_bucketized_X_word/weights",
}
DENSE = ("w", "linear_model/x/weights", "linear_model/bias_weights")  # read whole, pulled
SPARSE_FEATURES = ("word", "color", "item", "seller")  # variable-length


class RowInitializer:
    """value[r, c] a fixed function of the row r and column c, whatever slice holds row r: a
    table is the same however it is cut (a random initializer draws each slice anew)."""

    def __call__(self, shape, dtype=None, partition_info=None):
        offset = partition_info.var_offset[0] if partition_info else 0
        rows = np.arange(offset, offset + shape[0])[:, None]
        columns = np.arange(shape[1] if len(shape) > 1 else 1)[None, :]
        value = ((rows * 7 + columns * 3) % 11 - 5) / 20.0
        return tf.constant(value.reshape(shape), dtype or tf.float32)


def columns():
    """(deep, wide): the columns of input_layer and of linear_model."""
    x = fc.numeric_column("x", shape=[2])
    age = fc.bucketized_column(fc.numeric_column("age"), [-0.5, 0.5])
    word = fc.categorical_column_with_hash_bucket("word", 16)
    color = fc.categorical_column_with_vocabulary_list("color", VOCABULARY)
    item = fc.categorical_column_with_identity("item", 10)
    seller = fc.categorical_column_with_identity("seller", 10)
    crossed = fc.crossed_column([age, "word"], 24)
    init = RowInitializer()
    deep = [x, fc.indicator_column(age), fc.indicator_column(color),
            fc.embedding_column(word, 3, combiner="sum", initializer=init),
            fc.embedding_column(color, 3, combiner="mean", initializer=init),
            fc.embedding_column(crossed, 3, combiner="sqrtn", initializer=init),
            *fc.shared_embedding_columns([item, seller], 2, combiner="sqrtn", initializer=init)]
    wide = [x, age, word, color, item, crossed]
    return deep, wide


def model_fn(features, labels, mode, params):
    deep, wide = columns()
    hidden = tf.tanh(fc.input_layer(features, deep))
    w = tf1.get_variable("w", [hidden.shape[-1], 1], initializer=RowInitializer())
    logits = tf.squeeze(tf.matmul(hidden, w) + fc.linear_model(features, wide), axis=1)
    probabilities = tf.sigmoid(logits)
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"probabilities": probabilities})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == sm.ModeKeys.TRAIN:
        return sm.ModelSpec(mode, loss=loss,
                            optimizer=tf1.train.AdagradOptimizer(LEARNING_RATE))
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf1.metrics.accuracy(labels, tf.cast(probabilities > 0.5, tf.float32))})


def _ragged() -> tuple[dict, np.ndarray]:
    """The examples: dense features as arrays, variable-length ones as lists of lists."""
    rng = np.random.default_rng(3)
    n = EXAMPLES
    dense = {"x": rng.normal(size=(n, 2)).astype(np.float32),
             "age": rng.normal(size=(n, 1)).astype(np.float32)}
    ragged = {  # one example without words, one with an unknown colour
        "word": [[str(w) for w in rng.choice(WORDS, k)] for k in [0, *rng.integers(1, 4, n - 1)]],
        "color": [[*rng.choice(VOCABULARY, int(k))] for k in rng.integers(1, 3, n - 1)] + [
            ["purple", "red"]],
        "item": [list(rng.integers(0, 10, k)) for k in rng.integers(1, 3, n)],
        "seller": [list(rng.integers(0, 10, k)) for k in rng.integers(1, 4, n)]}
    labels = (dense["x"].sum(axis=1) > 0).astype(np.float32)
    return {**dense, **ragged}, labels


def dense_data(params=None) -> tuple[dict, np.ndarray]:
    """numpy arrays: each variable-length feature padded to its longest ("" or -1)."""
    features, labels = _ragged()
    for name in SPARSE_FEATURES:
        rows, pad = features[name], "" if name in ("word", "color") else -1
        width = max(len(r) for r in rows)
        features[name] = np.array([r + [pad] * (width - len(r)) for r in rows],
                                  str if pad == "" else np.int64)
    return features, labels


def sparse_values() -> tuple[dict, np.ndarray]:
    """numpy values: each variable-length feature a SparseTensorValue (of strings or int64), as
    a batch of tf.io.VarLenFeature comes out of a session."""
    features, labels = _ragged()
    for name in SPARSE_FEATURES:
        rows = features[name]
        indices = np.array([[i, j] for i, row in enumerate(rows) for j in range(len(row))],
                           np.int64)
        values = np.array([v for row in rows for v in row],
                          str if name in ("word", "color") else np.int64)
        features[name] = tf1.SparseTensorValue(indices, values, np.array(
            [len(rows), max(len(row) for row in rows)], np.int64))
    return features, labels


def sparse_tensors() -> tuple[dict, tf.Tensor]:
    """sparse_values as tensors: SparseTensors beside dense tensors."""
    features, labels = sparse_values()
    return {name: tf.SparseTensor(*value) if name in SPARSE_FEATURES else tf.constant(value)
            for name, value in features.items()}, tf.constant(labels)


def sparse_dataset(params=None) -> tf.data.Dataset:
    """A tf.data.Dataset of single examples, as a parser of VarLenFeatures gives them."""
    return tf.data.Dataset.from_tensor_slices(sparse_tensors())


DENSE_MODEL = sm.Model(model_fn, dense_data, dense_data)
SPARSE_MODEL = sm.Model(model_fn, sparse_dataset, sparse_dataset)


def _tensors(sparse: bool) -> tuple[dict, tf.Tensor]:
    if sparse:
        return sparse_tensors()
    features, labels = dense_data()
    return {k: tf.constant(v) for k, v in features.items()}, tf.constant(labels)


@functools.lru_cache(maxsize=None)
def reference(inputs: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    """The model function in one plain session, no ps: one step of its optimizer over all
    EXAMPLES for each of `inputs` (that step's input: "dense" or "sparse"), what one
    synchronous update of two workers' halves makes. Returns every variable a checkpoint holds
    (the model's, Adagrad's slots, global_step) after each step."""
    after: list[dict] = []
    for kind, steps in itertools.groupby(inputs):
        with tf.Graph().as_default():
            global_step = tf1.train.get_or_create_global_step()
            features, labels = _tensors(kind == "sparse")
            spec = model_fn(features, labels, sm.ModeKeys.TRAIN, {})
            train = spec.optimizer.minimize(spec.loss, global_step=global_step)
            with tf1.Session() as sess:
                _start(sess, after[-1] if after else None)
                for _ in steps:
                    sess.run(train)
                    after.append(sess.run({v.op.name: v for v in tf1.global_variables()}))
    return after


def predictions(sparse: bool, values: dict[str, np.ndarray]) -> np.ndarray:
    """The model function's predictions on the examples, with the variables at `values`."""
    with tf.Graph().as_default():
        features, _ = _tensors(sparse)
        spec = model_fn(features, None, sm.ModeKeys.PREDICT, {})
        with tf1.Session() as sess:
            _start(sess, values)
            return sess.run(spec.predictions["probabilities"])


def _start(sess: tf1.Session, values: dict[str, np.ndarray] | None) -> None:
    """Initialises the session's variables (to `values`, if given) and fills its tables."""
    variables = tf1.global_variables()
    init = [tf1.tables_initializer(), *[v.initializer for v in variables]]
    sess.run(init, {} if values is None else {
        v.initial_value: values[v.op.name] for v in variables})
