"""A small CNN with batch normalisation on MNIST, written as a user writes a model.

Two 3x3 convolutions (16 and 32 channels), each with batch norm, ReLU and 2x2 max pooling,
then a dense layer of 128 with batch norm and ReLU, and 10 logits. Plain tf1 ops and
tf1.get_variable: batch norm is spelled out, as TF1's layers did it, so that what the package
does with its moving statistics is plain to see.

Batch norm under synchronous training: in a training step each worker normalises with its
own batch's statistics, and pushes the moving statistics' update (UPDATE_OPS) beside its
gradient; each update of the cluster moves them once, by the average of the N workers'
pushes (sync_mnist/core/audit.py). Evaluation and the SavedModel use the moving statistics.
"""

from __future__ import annotations

import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.models import mnist

tf1 = tf.compat.v1

DECAY = 0.9  # of the moving statistics, per update
EPSILON = 1e-3


def model_fn(features, labels, mode, params):
    training = mode == sm.ModeKeys.TRAIN
    x = tf.reshape(mnist.pixels(features), [-1, mnist.IMAGE_SIZE, mnist.IMAGE_SIZE, 1])
    for layer, channels in enumerate(params["channels"]):
        with tf1.variable_scope(f"conv{layer}"):
            kernel = tf1.get_variable("kernel", [3, 3, x.shape[-1], channels],
                                      initializer=tf1.glorot_uniform_initializer())
            x = tf.nn.conv2d(x, kernel, strides=1, padding="SAME")
            x = tf.nn.relu(batch_norm(x, training, axes=[0, 1, 2]))
            x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME")
    x = tf.reshape(x, [-1, x.shape[1] * x.shape[2] * x.shape[3]])
    with tf1.variable_scope("dense"):
        x = tf.matmul(x, tf1.get_variable("weights", [x.shape[-1], params["dense_units"]],
                                          initializer=tf1.glorot_uniform_initializer()))
        x = tf.nn.relu(batch_norm(x, training, axes=[0]))
    with tf1.variable_scope("logits"):
        logits = tf.matmul(x, tf1.get_variable("weights", [x.shape[-1], mnist.NUM_CLASSES],
                                               initializer=tf1.glorot_uniform_initializer()))
        logits += tf1.get_variable("biases", [mnist.NUM_CLASSES],
                                   initializer=tf1.zeros_initializer())
    return mnist.classify(logits, labels, mode, sm)


def batch_norm(x: tf.Tensor, training: bool, axes: list[int]) -> tf.Tensor:
    """Batch normalisation over `axes`, with a scale and an offset per channel (last axis).

    Training: the batch's own statistics, and an update of the moving ones in UPDATE_OPS, not
    run here: sync_mnist averages it over the workers, once per update. Otherwise: the
    moving statistics.
    """
    channels = x.shape[-1]
    gamma = tf1.get_variable("gamma", [channels], initializer=tf1.ones_initializer())
    beta = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer())
    moving_mean = tf1.get_variable("moving_mean", [channels], trainable=False,
                                   initializer=tf1.zeros_initializer())
    moving_variance = tf1.get_variable("moving_variance", [channels], trainable=False,
                                       initializer=tf1.ones_initializer())
    if training:
        mean, variance = tf.nn.moments(x, axes)
        for moving, batch in ((moving_mean, mean), (moving_variance, variance)):
            tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                                  tf1.assign_sub(moving, (moving - batch) * (1 - DECAY)))
    else:
        mean, variance = moving_mean, moving_variance
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, EPSILON)


MODEL = sm.Model(model_fn, mnist.train_input_fn, mnist.eval_input_fn,
                 serving_input_fn=mnist.serving_input_fn, check=mnist.check,
                 params={**mnist.PARAMS, "channels": [16, 32], "dense_units": 128})
