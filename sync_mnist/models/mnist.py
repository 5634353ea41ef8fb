"""MNIST for the built-in models: input functions in the shape sync_mnist.api asks for.

params: "dataset" ("mnist": the shipped digits, or the user's IDX or npz files in "data_dir";
"synthetic": generated from "seed"), "data_dir", "seed" (--dataset, --data-dir, --seed); `check`
checks the files before any task starts.
Features are the pixels as stored, uint8 [n, 784]: a worker's shard stays a quarter of the
float32 size, and the model scales them (`pixels`).
"""

from __future__ import annotations

import tensorflow as tf

from sync_mnist.models import data

tf1 = tf.compat.v1

IMAGE_SIZE = data.IMAGE_SIZE
IMAGE_PIXELS = data.NUM_PIXELS
NUM_CLASSES = data.NUM_CLASSES
# The SavedModel's signature: uint8 [None, 28, 28] in, as MNIST stores a digit (sync_mnist.tools.inference).
SERVING_INPUT = "images"

PARAMS = {"dataset": "mnist", "data_dir": None, "seed": 0}


def train_input_fn(params):
    dataset = data.load_dataset(params["dataset"], params["data_dir"], seed=params["seed"])
    return dataset.train_images, dataset.train_labels


def eval_input_fn(params):
    return data.load_test(params["dataset"], params["data_dir"], seed=params["seed"])


def check(params):
    """The files train_input_fn and eval_input_fn will read, checked before any task starts:
    the shipped MNIST's digests, or that "data_dir" holds MNIST."""
    data.check_source(params["dataset"], params["data_dir"])


def serving_input_fn(params):
    images = tf1.placeholder(tf.uint8, [None, IMAGE_SIZE, IMAGE_SIZE], name=SERVING_INPUT)
    return {SERVING_INPUT: images}, tf.reshape(images, [-1, IMAGE_PIXELS])


def pixels(features: tf.Tensor) -> tf.Tensor:
    """uint8 pixels [batch, 784] as float32 in [0, 1]."""
    return tf.cast(features, tf.float32) / 255.0


def classify(logits: tf.Tensor, labels, mode: str, sm):
    """The classifier's ModelSpec for `mode` from its logits: cross-entropy, accuracy, and the
    SavedModel's outputs `probabilities` and `classes`."""
    classes = tf.argmax(logits, axis=1, output_type=tf.int64)
    predictions = {"probabilities": tf.nn.softmax(logits), "classes": classes}
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions=predictions)
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == sm.ModeKeys.TRAIN:
        accuracy = tf.reduce_mean(tf.cast(tf.equal(classes, labels), tf.float32))
        return sm.ModelSpec(mode, loss=loss, train_metrics={"accuracy": accuracy})
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf1.metrics.accuracy(labels, classes)})
