"""A model function written with Keras 3's layers (tf.keras, as `pip install tensorflow`
brings it; the task imports it only when the model reaches for it: tfcompat.defer_keras):
Embedding and Dense train synchronously on 2 ps, evaluated and exported; a
BatchNormalization, whose moving statistics Keras 3 never updates in graph mode, is named
before training (audit.frozen_statistics), never left silently frozen.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from inprocess_cluster import run_cluster
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskConfig, TrainConfig
from sync_mnist.task import graph as graph_lib

tf1 = tf.compat.v1
ROWS, STEPS, BATCH = 64, 6, 8


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
        if mode == sm.ModeKeys.PREDICT:
            return sm.ModelSpec(mode, predictions={"logits": logits})
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        if mode == sm.ModeKeys.TRAIN:
            return sm.ModelSpec(mode, loss=loss,
                                optimizer=tf1.train.GradientDescentOptimizer(0.1))
        accuracy = tf1.metrics.accuracy(labels, tf.argmax(logits, 1))
        return sm.ModelSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})

    return sm.Model(model_fn, _data, _data)


def test_keras_3_embedding_and_dense_train_synchronously_on_two_ps(keras, tmp_path):
    """Made as tf.Variable, not by get_variable, their variables are still the model's
    (placement.Recorded.made_alone): each on a ps, named alike in every graph (the evaluation's,
    the SavedModel's), published and exported. One worker: Keras 3 builds layers in two
    threads of one process no better than its global state allows; a task is a process."""
    logdir, export = tmp_path / "logdir", tmp_path / "export"
    run = run_cluster(1, _model(batch_norm=False), num_ps=2, train_steps=STEPS,
                      batch_size=BATCH, logdir=logdir, export_dir=export)
    assert run.chief.synchronous is True, run.chief.verdict
    assert run.chief.contributions == [STEPS]
    assert run.chief.test_metrics["accuracy"] > 0, run.chief.test_metrics
    trained = tf.train.load_checkpoint(str(logdir))
    assert trained.get_tensor("global_step") == STEPS
    shapes = trained.get_variable_to_shape_map()
    model = {n: s for n, s in shapes.items() if n.split("/")[-1] in ("embeddings", "kernel",
                                                                       "bias")}
    assert sorted(model.values()) == [[2], [6, 8], [8], [8, 2], [50, 4]], shapes
    exported = tf.train.load_checkpoint(str(export / "variables" / "variables"))
    assert set(exported.get_variable_to_shape_map()) == set(model)
    for name in model:  # the trained values, not a fresh initialisation
        np.testing.assert_array_equal(exported.get_tensor(name), trained.get_tensor(name))


def test_keras_3_batch_normalization_is_named_as_frozen_before_training(keras, caplog):
    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(
        ("localhost:1", "localhost:2"), ("localhost:3",)), train=TrainConfig(train_steps=10))
    features, labels = _data({})
    with tf.Graph().as_default():
        graph_lib.build_graph(config, _model(batch_norm=True),
                              ({k: v[:BATCH] for k, v in features.items()}, labels[:BATCH]))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w.split(" (and 1 more)")[0] for w in warned] == [
        "the model's batch norm statistic batch_normalization/moving_mean"], warned
    assert "is never updated in training: no UPDATE_OPS op writes it" in warned[0]
