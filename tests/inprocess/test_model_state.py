"""A model's state outside the gradient (batch norm's moving statistics): each update moves it
once, by the mean of the workers' pushes (audit.py), and a step never writes it.

Exact arithmetic, as the counters are tested: a statistic s with decay 1/2, updated by the
model's UPDATE_OPS as batch norm's moving mean is (s -= (s - batch_mean) / 2), on features of
small integers, so that every value below is exact in float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from inprocess_cluster import run_cluster
from sync_mnist.core.shard import Shard
from sync_mnist.core.config import TaskConfig, TrainConfig

tf1 = tf.compat.v1
ROWS, BATCH, STEPS, SEED = 64, 2, 6, 3


def _data(params):
    features = np.random.default_rng(7).integers(0, 8, (ROWS, 1)).astype(np.float32)
    return features, np.zeros(ROWS, np.float32)


def _model_fn(features, labels, mode, params):
    w = tf1.get_variable("w", [1], initializer=tf1.zeros_initializer())
    s = tf1.get_variable("s", [], initializer=tf1.zeros_initializer(), trainable=False)
    if mode == sm.ModeKeys.TRAIN:
        update = tf1.assign_sub(s, (s - tf.reduce_mean(features)) * 0.5)
        tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, update)
        if params.get("update_in_the_step"):  # as TF1 code puts it under the train op
            with tf.control_dependencies([update]):
                features = tf.identity(features)
    loss = tf.reduce_mean(tf.square(features[:, 0] * w - labels))
    if mode == sm.ModeKeys.TRAIN:
        return sm.ModelSpec(mode, loss=loss, optimizer=tf1.train.GradientDescentOptimizer(0.01))
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={"s": (tf.identity(s), tf.no_op())})


MODEL = sm.Model(_model_fn, _data, _data)


def _expected_s(num_workers: int) -> np.float32:
    """s after STEPS updates, each the mean of the workers' (s - batch_mean) / 2."""
    features, labels = _data({})
    shards = [Shard(features, labels, index=i, num_workers=num_workers, batch_size=BATCH,
                         seed=SEED) for i in range(num_workers)]
    s = np.float32(0)
    for step in range(STEPS):
        deltas = [(s - shard.batch(step)[0].mean(dtype=np.float32)) * np.float32(0.5)
                  for shard in shards]
        s = s - np.float32(sum(deltas) / np.float32(num_workers))
    return s


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_update_moves_the_state_once_by_the_mean_of_the_workers_pushes(mode):
    run = run_cluster(2, MODEL, train_steps=STEPS, batch_size=BATCH, seed=SEED, mode=mode)
    s = run.chief.test_metrics["s"]
    if mode == "sync":
        assert run.chief.synchronous is True and run.chief.contributions == [STEPS, STEPS]
        assert s == _expected_s(2)
        # Not what one worker's statistics alone would give, nor both workers' pushes applied
        # one after the other: each update moved s once.
        assert s != _expected_s(1)
    else:  # every push is an update of its own: 2 x STEPS moves, in the order they came
        assert run.chief.contributions == [STEPS, STEPS]
        assert s != _expected_s(2)


def _refused(model: sm.Model) -> str:
    """The line of the ContractError that building a worker's graph of `model` raises."""
    from mlp_graph import prepared_graph
    from sync_mnist.core.cluster import ClusterLayout

    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(("p:1",), ("w0:1",)),
                        train=TrainConfig(train_steps=1, batch_size=BATCH))
    with pytest.raises(sm.ContractError) as raised:
        prepared_graph(config, model)
    return str(raised.value)


def test_a_step_that_runs_the_update_itself_is_refused():
    line = _refused(sm.Model(_model_fn, _data, _data, params={"update_in_the_step": True}))
    assert line == (
        "the training step writes s outside the aggregated update (op AssignSubVariableOp, "
        "AssignSubVariableOp): leave UPDATE_OPS out of the loss's dependencies; sync_mnist "
        "averages them over the workers, once per update")


def test_a_write_of_a_trainable_variable_is_refused():
    def model_fn(features, labels, mode, params):
        w = tf1.get_variable("w", [1], initializer=tf1.zeros_initializer())
        tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, tf1.assign_add(w, [1.0]))
        return sm.ModelSpec(mode, loss=tf.reduce_mean(features[:, 0] * w))

    assert _refused(sm.Model(model_fn, _data, _data)) == (
        "the model function raised AttributeError in mode 'train': 'SymbolicTensor' object has "
        "no attribute 'assign_add': a trainable variable is handed to the model function as "
        "its value, read from the ps; only the optimizer writes it")


# ------------------------------------------------------------- clipping (docs/your-model.md)
# The model's optimizer: its compute_gradients runs on each worker before the push, its
# apply_gradients once per update on the average. Gradients of w are batch means of
# features in {-4, 4}, so the two clippings to [-1, 1] give different, exact updates.


class _ClipEachWorker(tf1.train.GradientDescentOptimizer):
    def compute_gradients(self, *args, **kwargs):
        return [(tf.clip_by_value(g, -1.0, 1.0), v)
                for g, v in super().compute_gradients(*args, **kwargs)]


class _ClipTheAverage(tf1.train.GradientDescentOptimizer):
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        return super().apply_gradients(
            [(tf.clip_by_value(g, -1.0, 1.0), v) for g, v in grads_and_vars], *args, **kwargs)


def _signed_data(params):
    features = np.random.default_rng(5).choice([-4.0, 4.0], (ROWS, 1)).astype(np.float32)
    return features, np.zeros(ROWS, np.float32)


def _linear(features, labels, mode, params):
    w = tf1.get_variable("w", [], initializer=tf1.zeros_initializer())
    loss = tf.reduce_mean(features[:, 0]) * w  # d loss / d w: the batch's mean feature
    if mode == sm.ModeKeys.TRAIN:
        return sm.ModelSpec(mode, loss=loss, optimizer=params["optimizer"](1.0))
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={"w": (tf.identity(w), tf.no_op())})


def _clipped_w(clip_each: bool, steps: int) -> np.float32:
    features, labels = _signed_data({})
    shards = [Shard(features, labels, index=i, num_workers=2, batch_size=BATCH, seed=SEED)
              for i in range(2)]
    w = np.float32(0)
    for step in range(steps):
        means = [shard.batch(step)[0].mean(dtype=np.float32) for shard in shards]
        w -= np.float32(np.mean(np.clip(means, -1, 1)) if clip_each
                        else np.clip(np.mean(means), -1, 1))
    return w


@pytest.mark.parametrize("optimizer, clip_each", [(_ClipEachWorker, True),
                                                  (_ClipTheAverage, False)])
def test_a_models_optimizer_clips_each_workers_gradient_or_their_average(optimizer, clip_each):
    steps = 4  # the two clippings part here (later steps of these data bring them together)
    assert _clipped_w(True, steps) != _clipped_w(False, steps)
    model = sm.Model(_linear, _signed_data, _signed_data, params={"optimizer": optimizer})
    run = run_cluster(2, model, train_steps=steps, batch_size=BATCH, seed=SEED)
    assert run.chief.synchronous is True
    assert run.chief.test_metrics["w"] == _clipped_w(clip_each, steps)
