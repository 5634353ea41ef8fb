"""A model function written with Keras 3's layers (tf.keras, as `pip install tensorflow`
brings it; the task imports it only when the model reaches for it: tfcompat.defer_keras): a
BatchNormalization, whose moving statistics Keras 3 never updates in graph mode, is refused in
one line naming them (audit.check_moving_statistics), never left silently frozen.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskConfig, TrainConfig
from sync_mnist.task import graph as graph_lib

tf1 = tf.compat.v1
ROWS, BATCH = 64, 8


@pytest.fixture
def keras(monkeypatch):
    """tf.keras as a task has it: conftest.py keeps Keras out of the test processes, as
    the task's start-up does until a model uses it."""
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    return tf.keras


def _data(params):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(ROWS, 3))
    return {"ids": ids, "x": rng.normal(size=(ROWS, 2)).astype(np.float32)}, \
        (ids[:, 0] % 2).astype(np.int64)


def _model(batch_norm: bool) -> sm.Model:
    def model_fn(features, labels, mode, params):
        layers = tf.keras.layers
        embedded = tf.reduce_mean(layers.Embedding(50, 4)(features["ids"]), axis=1)
        x = layers.Dense(8, activation="relu")(tf.concat([embedded, features["x"]], 1))
        if batch_norm:
            x = layers.BatchNormalization()(x, training=mode == sm.ModeKeys.TRAIN)
        logits = layers.Dense(2)(x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        if mode == sm.ModeKeys.TRAIN:
            return sm.ModelSpec(mode, loss=loss,
                                optimizer=tf1.train.GradientDescentOptimizer(0.1))
        accuracy = tf1.metrics.accuracy(labels, tf.argmax(logits, 1))
        return sm.ModelSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})

    return sm.Model(model_fn, _data, _data)


def test_keras_3_batch_normalization_is_refused_naming_its_statistics(keras):
    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(
        ("localhost:1", "localhost:2"), ("localhost:3",)), train=TrainConfig(train_steps=10))
    features, labels = _data({})
    with tf.Graph().as_default(), pytest.raises(sm.ContractError) as raised:
        graph_lib.build_graph(config, _model(batch_norm=True),
                              ({k: v[:BATCH] for k, v in features.items()}, labels[:BATCH]))
    assert str(raised.value).startswith("the model's batch norm statistic "), raised.value
    assert "moving_mean (and 1 more) is never updated in training: no UPDATE_OPS op writes it" \
        in str(raised.value)
