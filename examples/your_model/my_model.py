"""A model of your own for sync_mnist: a softmax regression on generated data.

Run it on the localhost cluster:  sync-mnist-cluster --model my_model.py:MODEL
"""

import numpy as np
import tensorflow as tf

import sync_mnist.api as sm

tf1 = tf.compat.v1


def model_fn(features, labels, mode, params):
    weights = tf1.get_variable("weights", [params["inputs"], params["classes"]],
                               initializer=tf1.zeros_initializer())
    biases = tf1.get_variable("biases", [params["classes"]], initializer=tf1.zeros_initializer())
    logits = tf.matmul(features, weights) + biases
    classes = tf.argmax(logits, axis=1)
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"classes": classes,
                                                "probabilities": tf.nn.softmax(logits)})
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == sm.ModeKeys.TRAIN:
        return sm.ModelSpec(mode, loss=loss,
                            optimizer=tf1.train.GradientDescentOptimizer(params["learning_rate"]))
    return sm.ModelSpec(mode, loss=loss,
                        eval_metric_ops={"accuracy": tf1.metrics.accuracy(labels, classes)})


def _data(params, rows, seed):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(params["classes"], params["inputs"]))
    labels = rng.integers(0, params["classes"], rows)
    features = centres[labels] + rng.normal(scale=0.5, size=(rows, params["inputs"]))
    return features.astype(np.float32), labels.astype(np.int64)


def train_input_fn(params):
    return _data(params, 3000, seed=1)


def eval_input_fn(params):
    return _data(params, 500, seed=2)


MODEL = sm.Model(model_fn, train_input_fn, eval_input_fn,
                 params={"inputs": 20, "classes": 4, "learning_rate": 0.5})
