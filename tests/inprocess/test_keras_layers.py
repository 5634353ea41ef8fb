"""A model function written with Keras layers: Keras 3's (tf.keras, as `pip install
tensorflow` brings it; the task imports it only when the model reaches for it:
tfcompat.defer_keras) and tf_keras's (the `layers` extra). Embedding, Dense and
BatchNormalization train synchronously on 2 ps, evaluated and exported, and the batch norm's
moving statistics move once per update, by the mean of the workers' (audit.layer_updates):
exact arithmetic, as tests/inprocess/test_model_state.py's. A Keras variable under a
partitioner is refused; a batch norm that never writes its statistics is named before training.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from inprocess_cluster import run_cluster
from procs import ROOT
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskConfig, TrainConfig
from sync_mnist.core.shard import Shard
from sync_mnist.task import graph as graph_lib

tf1 = tf.compat.v1
ROWS, STEPS, BATCH, SEED = 64, 6, 8, 3
MOMENTUM = 0.5  # with features of small integers and batches of 8, every statistic is exact
LAYERS = ROOT / ".venv" / "layers"  # tf-keras, the `layers` extra, as `make install` keeps it


@pytest.fixture
def keras(monkeypatch):
    """tf.keras as a task has it: conftest.py keeps Keras out of the test processes, as
    the task's start-up does until a model uses it."""
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    return tf.keras


def _data(params):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(ROWS, 3))
    return {"ids": ids, "x": rng.integers(0, 8, size=(ROWS, 2)).astype(np.float32)}, \
        (ids[:, 0] % 2).astype(np.int64)


def _spec(mode, labels, logits) -> sm.ModelSpec:
    """The ModelSpec of two-class `logits`: softmax cross-entropy, SGD at 0.1, accuracy."""
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    if mode == sm.ModeKeys.TRAIN:
        return sm.ModelSpec(mode, loss=loss, optimizer=tf1.train.GradientDescentOptimizer(0.1))
    accuracy = tf1.metrics.accuracy(labels, tf.argmax(logits, 1))
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})


def _model(keras_module, batch_norm: bool, training=True) -> sm.Model:
    """Embedding and two Dense layers, and a BatchNormalization of the feature x (called with
    training=`training` in TRAIN mode) if `batch_norm`. `keras_module()` is the Keras whose
    layers it uses, looked up when the model function runs, as a user's module would. Each
    layer is named, as Keras 3 otherwise numbers them per process, not per thread."""
    def model_fn(features, labels, mode, params):
        layers = keras_module().layers
        embedded = tf.reduce_mean(layers.Embedding(50, 4, name="embedding")(features["ids"]),
                                  axis=1)
        x = features["x"]
        if batch_norm:
            x = layers.BatchNormalization(momentum=MOMENTUM, name="batch_norm")(
                x, training=training and mode == sm.ModeKeys.TRAIN)
        x = layers.Dense(8, activation="relu", name="hidden")(tf.concat([embedded, x], 1))
        logits = layers.Dense(2, name="logits")(x)
        return _spec(mode, labels, logits)

    return sm.Model(model_fn, _data, _data)


def _expected_statistics(num_workers: int, in_turn: bool = False
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The moving mean and variance of x after STEPS updates. Each worker's layer writes
    s * m + batch_statistic * (1 - m), a push of d = s - that; each update subtracts the mean
    of the workers' d, once (`in_turn`: each worker's write applied as it is, one after the
    other, as unsynchronised workers would)."""
    features, labels = _data({})
    shards = [Shard(features, labels, index=i, num_workers=num_workers, batch_size=BATCH,
                    seed=SEED) for i in range(num_workers)]
    m = np.float32(MOMENTUM)
    mean, variance = np.zeros(2, np.float32), np.ones(2, np.float32)
    for step in range(STEPS):
        batches = [shard.batch(step)[0]["x"] for shard in shards]
        for s, statistic in ((mean, lambda b: b.mean(axis=0, dtype=np.float32)),
                             (variance, lambda b: b.var(axis=0, dtype=np.float32))):
            if in_turn:
                for b in batches:
                    s[:] = s * m + statistic(b) * (np.float32(1) - m)
                continue
            deltas = [s - (s * m + statistic(b) * (np.float32(1) - m)) for b in batches]
            s -= np.float32(sum(deltas) / np.float32(num_workers))
    return mean, variance


def _train_and_check(keras_module, tmp_path, num_workers: int) -> None:
    """Trains the model with batch norm on 2 ps, verified; its moving statistics are the
    expected ones, and the SavedModel holds the trained values."""
    logdir, export = tmp_path / "logdir", tmp_path / "export"
    # TensorFlow's lazy tf.keras, first reached by two threads at once, recurses until
    # RecursionError (tensorflow/python/util/lazy_loader.py, 2.21): this thread reaches it
    # first, as a task's one thread does.
    keras_module().layers.Dense
    run = run_cluster(num_workers, _model(keras_module, batch_norm=True), num_ps=2,
                      train_steps=STEPS, batch_size=BATCH, seed=SEED, logdir=logdir,
                      export_dir=export)
    assert run.chief.synchronous is True, run.chief.verdict
    assert run.chief.contributions == [STEPS] * num_workers
    assert run.chief.test_metrics["accuracy"] > 0, run.chief.test_metrics
    trained = tf.train.load_checkpoint(str(logdir))
    assert trained.get_tensor("global_step") == STEPS
    shapes = trained.get_variable_to_shape_map()
    model = {n: s for n, s in shapes.items()
             if n.split("/")[0] in ("embedding", "hidden", "logits", "batch_norm")
             and n.split("/")[-1] in ("embeddings", "kernel", "bias", "gamma", "beta",
                                      "moving_mean", "moving_variance")}
    assert sorted(model.items()) == [
        ("batch_norm/beta", [2]), ("batch_norm/gamma", [2]), ("batch_norm/moving_mean", [2]),
        ("batch_norm/moving_variance", [2]), ("embedding/embeddings", [50, 4]),
        ("hidden/bias", [8]), ("hidden/kernel", [6, 8]), ("logits/bias", [2]),
        ("logits/kernel", [8, 2])], shapes
    mean, variance = _expected_statistics(num_workers)
    np.testing.assert_array_equal(trained.get_tensor("batch_norm/moving_mean"), mean)
    np.testing.assert_array_equal(trained.get_tensor("batch_norm/moving_variance"), variance)
    if num_workers > 1:
        # Not one worker's statistics alone, nor each worker's write applied in turn: each
        # update moved them once, by the mean of the workers' pushes.
        assert not np.array_equal(mean, _expected_statistics(1)[0])
        assert not np.array_equal(mean, _expected_statistics(num_workers, in_turn=True)[0])
    exported = tf.train.load_checkpoint(str(export / "variables" / "variables"))
    assert set(exported.get_variable_to_shape_map()) == set(model)
    for name in model:  # the trained values, not a fresh initialisation
        np.testing.assert_array_equal(exported.get_tensor(name), trained.get_tensor(name))


def test_keras_3_embedding_and_dense_train_synchronously_on_two_ps(keras, tmp_path):
    """Made as tf.Variable, not by get_variable, their variables are still the model's
    (placement.Recorded.made_alone): each on a ps, named alike in every graph (the evaluation's,
    the SavedModel's), published and exported. One worker, layers unnamed: Keras 3 numbers
    layers in two threads of one process no better than its global state allows; a task is a
    process."""
    def model_fn(features, labels, mode, params):
        layers = tf.keras.layers
        embedded = tf.reduce_mean(layers.Embedding(50, 4)(features["ids"]), axis=1)
        x = layers.Dense(8, activation="relu")(tf.concat([embedded, features["x"]], 1))
        logits = layers.Dense(2)(x)
        return _spec(mode, labels, logits)

    logdir, export = tmp_path / "logdir", tmp_path / "export"
    run = run_cluster(1, sm.Model(model_fn, _data, _data), num_ps=2, train_steps=STEPS,
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


def test_keras_3_batch_normalization_moves_once_per_update_by_the_workers_mean(keras,
                                                                                tmp_path):
    _train_and_check(lambda: tf.keras, tmp_path, num_workers=2)


def _tf_keras():
    import tf_keras  # pylint: disable=import-outside-toplevel

    return tf_keras


def _legacy_tf_keras():
    """tf.keras as TF_USE_LEGACY_KERAS=1 (the user's, kept by the task's start-up) makes it,
    tf_keras installed."""
    assert tf.keras.layers.Dense.__module__.startswith("tf_keras."), tf.keras.layers.Dense
    return tf.keras


# Each in a pytest process of its own (conftest.py's own_process): tf_keras, once imported,
# would be what tf.keras is for every later test of a shared process.
@pytest.mark.own_process
@pytest.mark.parametrize("keras_module", [_tf_keras, _legacy_tf_keras],
                         ids=["import tf_keras", "TF_USE_LEGACY_KERAS=1"])
def test_tf_keras_batch_normalization_moves_once_per_update_by_the_workers_mean(
        keras_module, monkeypatch, tmp_path):
    """tf_keras's BatchNormalization has updates (`layer.updates`), though not in UPDATE_OPS."""
    assert (LAYERS / "tf_keras").is_dir(), f"no tf-keras in {LAYERS}: run make install"
    monkeypatch.syspath_prepend(str(LAYERS))
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    _train_and_check(keras_module, tmp_path, num_workers=2)


def _worker_graph(model: sm.Model) -> None:
    """Builds worker 0's graph of `model` (2 ps, 1 worker), with no server."""
    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(
        ("localhost:1", "localhost:2"), ("localhost:3",)), train=TrainConfig(train_steps=10))
    features, labels = _data({})
    with tf.Graph().as_default():
        graph_lib.build_graph(config, model,
                              ({k: v[:BATCH] for k, v in features.items()}, labels[:BATCH]))


def test_keras_3_batch_normalization_called_in_inference_is_named_as_frozen(keras, caplog):
    _worker_graph(_model(lambda: tf.keras, batch_norm=True, training=False))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w.split(" (and 1 more)")[0] for w in warned] == [
        "the model's batch norm statistic batch_norm/moving_mean"], warned
    assert warned[0].endswith(
        "is never updated in training: nothing writes it (no UPDATE_OPS op, no Keras layer's "
        "update), so it keeps its start all the run. Unless frozen on purpose, call the layer "
        "with training=(mode == ModeKeys.TRAIN)"), warned
    caplog.clear()
    _worker_graph(_model(lambda: tf.keras, batch_norm=True))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_keras_3_variable_under_a_partitioner_is_refused(keras):
    def model_fn(features, labels, mode, params):
        with tf1.variable_scope("deep", partitioner=tf1.fixed_size_partitioner(2)):
            embedded = tf.keras.layers.Embedding(50, 4, name="table")(features["ids"])
        logits = tf.keras.layers.Dense(2)(tf.reduce_mean(embedded, axis=1))
        return sm.ModelSpec(mode, loss=tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)))

    with pytest.raises(sm.ContractError) as refused:
        _worker_graph(sm.Model(model_fn, _data, _data))
    assert str(refused.value) == (
        "the model function makes deep/table/embeddings as tf.Variable (a Keras layer's, say) "
        "under the variable_scope 'deep', whose partitioner it ignores: it would stay whole on "
        "one ps. For a table cut over every ps, make it with tf.compat.v1.get_variable "
        "(sync_mnist cuts it over the ps) and look its rows up with tf.nn.embedding_lookup, as "
        "the ctr model does")


def test_a_non_trainable_variable_under_a_partitioner_is_left_alone(keras):
    """A metric's, say: local and small, no table to cut."""
    def model_fn(features, labels, mode, params):
        with tf1.variable_scope("deep", partitioner=tf1.fixed_size_partitioner(2)):
            seen = tf.Variable(0.0, trainable=False, name="seen",
                               collections=[tf1.GraphKeys.LOCAL_VARIABLES])
        logits = tf.keras.layers.Dense(2)(features["x"])
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits)) + 0 * seen
        return sm.ModelSpec(mode, loss=loss)

    _worker_graph(sm.Model(model_fn, _data, _data))
