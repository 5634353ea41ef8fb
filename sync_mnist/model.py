"""Pure graph builders for the question's model: an MLP 784-256-256-10.

Nothing here knows about the cluster. Device placement is decided by the caller with one
`with tf.device(replica_device_setter(...))` around these calls.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

tf1 = tf.compat.v1

IMAGE_PIXELS = 28 * 28
NUM_CLASSES = 10
HIDDEN_UNITS = (256, 256)


class ModelOutputs(NamedTuple):
    logits: tf.Tensor
    loss: tf.Tensor  # mean cross-entropy over the batch
    accuracy: tf.Tensor  # fraction of the batch classified correctly


def build_model(images: tf.Tensor, labels: tf.Tensor,
                hidden_units: tuple[int, ...] = HIDDEN_UNITS) -> ModelOutputs:
    """Builds the MLP from plain variables (Keras 3 removed tf.compat.v1.layers).

    Args:
      images: float32 [batch, 784], pixels scaled to [0, 1].
      labels: int64 [batch], digits 0-9.
      hidden_units: widths of the ReLU hidden layers.

    Returns:
      ModelOutputs with logits [batch, 10] and scalar loss and accuracy.
    """
    logits = build_logits(images, hidden_units)
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    correct = tf.equal(tf.argmax(logits, axis=1), labels)
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
    return ModelOutputs(logits, loss, accuracy)


def build_logits(images: tf.Tensor, hidden_units: tuple[int, ...] = HIDDEN_UNITS) -> tf.Tensor:
    """The MLP alone, for training and for the exported inference graph (export.py).

    Args:
      images: float32 [batch, 784], pixels scaled to [0, 1].
      hidden_units: widths of the ReLU hidden layers.

    Returns:
      logits [batch, 10]; the variables are `layer<k>/weights` and `layer<k>/biases`.
    """
    sizes = (IMAGE_PIXELS, *hidden_units, NUM_CLASSES)
    x = images
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        with tf1.variable_scope(f"layer{layer}"):
            # Glorot keeps activations at a sane scale; the question's random_normal(stddev=1)
            # saturated the network and is part of why it trained badly.
            weights = tf1.get_variable("weights", [fan_in, fan_out],
                                       initializer=tf1.glorot_uniform_initializer())
            biases = tf1.get_variable("biases", [fan_out], initializer=tf1.zeros_initializer())
        x = tf.matmul(x, weights) + biases
        if layer < len(sizes) - 2:
            x = tf.nn.relu(x)
    return x


def make_optimizer(name: str, learning_rate: float, *, decay_steps: int | None = None,
                   global_step: tf.Tensor | None = None) -> tf1.train.Optimizer:
    """The base optimizer; in sync mode SyncReplicasOptimizer wraps it.

    With `decay_steps`, the rate falls from `learning_rate` to 0 along a cosine as
    `global_step` goes from 0 to `decay_steps` (and stays 0 beyond).
    """
    if decay_steps:
        learning_rate = tf1.train.cosine_decay(learning_rate, global_step, decay_steps)
    if name == "adam":
        return tf1.train.AdamOptimizer(learning_rate)
    if name == "sgd":
        return tf1.train.GradientDescentOptimizer(learning_rate)
    if name == "momentum":
        return tf1.train.MomentumOptimizer(learning_rate, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}")
