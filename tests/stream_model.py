"""A model over TFRecord files whose variable `count` counts how often each example was used
(tests of streamed input, core/stream.py). Each example carries its id; the loss falls by
count[id] for each example of the batch, so plain gradient descent at rate 1 adds 1 / N to
count[id] for every use in an update averaged over N workers: after a run, count * N is how many
times each example was used.

The files are the *.tfrecord files beside this module: a test writes them (write()) into a
directory and copies this file there (place()), as a user keeps a model beside its data.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

import sync_mnist.api as sm

tf1 = tf.compat.v1

MAX_IDS = 4000  # the size of `count`: ids run from 0 up
_FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64),
             "x": tf.io.FixedLenFeature([2], tf.float32),
             "label": tf.io.FixedLenFeature([], tf.int64)}


def write(directory: Path, sizes: list[int]) -> list[Path]:
    """Files of `sizes` examples each, with ids 0, 1, ... in order; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths, next_id = [], 0
    rng = np.random.default_rng(0)
    for f, size in enumerate(sizes):
        path = directory / f"part-{f:03d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for _ in range(size):
                label = int(rng.integers(2))
                x = rng.normal(size=2).astype(np.float32) + (2 * label - 1)
                feature = {
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[next_id])),
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=list(x))),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())
                next_id += 1
        paths.append(path)
    return paths


def place(directory: Path, sizes: list[int]) -> str:
    """Files of `sizes` examples in `directory`, and this model beside them; its --model SPEC."""
    write(directory, sizes)
    shutil.copy(__file__, directory / "stream_model.py")
    return f"{directory / 'stream_model.py'}:MODEL"


def _files() -> list[str]:
    return sorted(str(p) for p in Path(__file__).parent.glob("*.tfrecord"))


def _parse(record):
    example = tf.io.parse_single_example(record, _FEATURES)
    return {"id": example["id"], "x": example["x"]}, example["label"]


def train_input_fn(params):
    return tf.data.TFRecordDataset(_files()).map(_parse)


def tf_config_input_fn(params):
    """An Estimator-era input function: it cuts its files by TF_CONFIG itself, as TF 1.x
    programs did (the chief counted as a worker), then interleaves, parses and shuffles."""
    config = json.loads(os.environ["TF_CONFIG"])
    kind, index = config["task"]["type"], config["task"]["index"]
    num_workers = len(config["cluster"].get("chief", [])) + len(config["cluster"]["worker"])
    index += len(config["cluster"].get("chief", [])) if kind == "worker" else 0
    files = tf.data.Dataset.list_files(str(Path(__file__).parent / "*.tfrecord"), shuffle=False)
    return (files.shard(num_workers, index)
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(_parse).shuffle(64))


def ignores_context_input_fn(params, input_context=None):
    """Takes an input_context and ignores it: every worker reads every file."""
    return tf.data.TFRecordDataset(_files()).map(_parse)


def eval_input_fn(params):
    """The first 64 examples of the training files, streamed as the training input is."""
    return tf.data.TFRecordDataset(_files()).map(_parse).take(64)


def model_fn(features, labels, mode, params, adam: bool = False):
    """The count trained by SGD at rate 1; with `adam`, the weights by Adam (one optimizer a
    scope: api.ModelSpec), which the count's arithmetic does not see."""
    with tf1.variable_scope("counting"):
        count = tf1.get_variable("count", [MAX_IDS], tf.float32, tf1.zeros_initializer())
    with tf1.variable_scope("model"):
        w = tf1.get_variable("w", [2, 2], tf.float32, tf1.zeros_initializer())
    logits = tf.matmul(features["x"], w)
    predictions = {"classes": tf.argmax(logits, 1)}
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions=predictions)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == sm.ModeKeys.TRAIN:
        used = tf.reduce_sum(tf.gather(count, features["id"]))
        sgd = tf1.train.GradientDescentOptimizer(1.0)
        return sm.ModelSpec(mode, loss=loss - used, optimizer={
            "counting": sgd, "model": tf1.train.AdamOptimizer(0.01)} if adam else sgd)
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf1.metrics.accuracy(labels, predictions["classes"])})


def adam_model_fn(features, labels, mode, params):
    return model_fn(features, labels, mode, params, adam=True)


MODEL = sm.Model(model_fn, train_input_fn, eval_input_fn)
ADAM = sm.Model(adam_model_fn, train_input_fn, eval_input_fn)
TF_CONFIG_CUT = sm.Model(adam_model_fn, tf_config_input_fn, eval_input_fn)
IGNORES_CONTEXT = sm.Model(model_fn, ignores_context_input_fn, eval_input_fn)


def uses(checkpoint: str, num_workers: int) -> np.ndarray:
    """How many times each id was used, read from a checkpoint's `count`."""
    reader = tf.train.load_checkpoint(checkpoint)
    names = [n for n in reader.get_variable_to_shape_map() if n.split("/")[-1] == "count"]
    assert len(names) == 1, names
    return np.round(reader.get_tensor(names[0]) * num_workers).astype(int)
