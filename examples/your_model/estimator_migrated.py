"""estimator_tf1.py, migrated to sync_mnist (docs/your-model.md counts the changed lines).

tf.layers needs the optional extra tf-keras (pip install 'sync_mnist[layers]') and
TF_USE_LEGACY_KERAS=1 in the environment:
  TF_USE_LEGACY_KERAS=1 sync-mnist-cluster --model estimator_migrated.py:MODEL --train-steps 300
"""

import numpy as np
import tensorflow.compat.v1 as tf

import sync_mnist.api as sm

PARAMS = {"hidden": 32, "classes": 4, "learning_rate": 0.01}


def model_fn(features, labels, mode, params):
    net = tf.layers.dense(features["x"], params["hidden"], activation=tf.nn.relu)
    net = tf.layers.batch_normalization(net, training=mode == sm.ModeKeys.TRAIN)
    logits = tf.layers.dense(net, params["classes"])
    predictions = {"classes": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions=predictions)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == sm.ModeKeys.TRAIN:
        optimizer = tf.train.AdamOptimizer(params["learning_rate"])
        return sm.ModelSpec(mode, loss=loss, optimizer=optimizer)
    metrics = {"accuracy": tf.metrics.accuracy(labels, predictions["classes"])}
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops=metrics)


def make_data(rows, seed):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(PARAMS["classes"], 20))
    labels = rng.integers(0, PARAMS["classes"], rows)
    features = centres[labels] + rng.normal(scale=0.5, size=(rows, 20))
    return {"x": features.astype(np.float32)}, labels.astype(np.int64)


def train_input_fn(params):
    return make_data(3000, seed=1)


def eval_input_fn(params):
    return make_data(500, seed=2)


MODEL = sm.Model(model_fn, train_input_fn, eval_input_fn, params=PARAMS)
