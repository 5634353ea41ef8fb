"""The question's model: an MLP 784-256-256-10 on MNIST, written as a user writes a model.

Plain tf1.get_variable (Keras 3 removed tf.compat.v1.layers). The optimizer is left to the
command line (--optimizer, --learning-rate, --lr-decay): ModelSpec(optimizer=None).
"""

from __future__ import annotations

import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.models import mnist

tf1 = tf.compat.v1

HIDDEN_UNITS = (256, 256)


def model_fn(features, labels, mode, params):
    return mnist.classify(logits(mnist.pixels(features), params["hidden_units"]), labels, mode, sm)


def logits(x: tf.Tensor, hidden_units=HIDDEN_UNITS) -> tf.Tensor:
    """ReLU layers of `hidden_units`, then 10 logits; variables layer<k>/weights, /biases."""
    sizes = (mnist.IMAGE_PIXELS, *hidden_units, mnist.NUM_CLASSES)
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


def variable_shapes(hidden_units=HIDDEN_UNITS) -> list[list[int]]:
    """The shapes of the variables, whole, in the order `logits` makes them (for experiments
    that stand in for the model's bytes)."""
    sizes = (mnist.IMAGE_PIXELS, *hidden_units, mnist.NUM_CLASSES)
    shapes = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        shapes += [[fan_in, fan_out], [fan_out]]
    return shapes


MODEL = sm.Model(model_fn, mnist.train_input_fn, mnist.eval_input_fn,
                 serving_input_fn=mnist.serving_input_fn, check=mnist.check,
                 params={**mnist.PARAMS, "hidden_units": list(HIDDEN_UNITS)})
