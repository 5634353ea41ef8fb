"""files_tf1.py, migrated to sync_mnist (docs/your-model.md, "Your data", counts the lines).

Write the example's files, then train on them:
  python examples/your_data/write_files.py examples/your_data/data
  sync-mnist-cluster --model examples/your_data/files_migrated.py:MODEL --epochs 5
"""

import glob
import os

import tensorflow.compat.v1 as tf

import sync_mnist.api as sm

DATA = os.environ.get("MY_DATA", os.path.join(os.path.dirname(__file__), "data"))
PARAMS = {"hidden": 32, "classes": 4, "learning_rate": 0.01}
FEATURES = {"x": tf.io.FixedLenFeature([20], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):
    example = tf.io.parse_single_example(record, FEATURES)
    return {"x": example["x"]}, example["label"]


def model_fn(features, labels, mode, params):
    w1 = tf.get_variable("w1", [20, params["hidden"]])
    b1 = tf.get_variable("b1", [params["hidden"]], initializer=tf.zeros_initializer())
    w2 = tf.get_variable("w2", [params["hidden"], params["classes"]])
    b2 = tf.get_variable("b2", [params["classes"]], initializer=tf.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(features["x"], w1) + b1), w2) + b2
    predictions = {"classes": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions=predictions)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == sm.ModeKeys.TRAIN:
        optimizer = tf.train.AdamOptimizer(params["learning_rate"])
        return sm.ModelSpec(mode, loss=loss, optimizer=optimizer)
    metrics = {"accuracy": tf.metrics.accuracy(labels, predictions["classes"])}
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops=metrics)


def train_input_fn(params):
    files = sorted(glob.glob(os.path.join(DATA, "train-*.tfrecord")))
    dataset = tf.data.TFRecordDataset(files).map(parse).shuffle(1000)
    return dataset


def eval_input_fn(params):
    files = sorted(glob.glob(os.path.join(DATA, "eval-*.tfrecord")))
    return tf.data.TFRecordDataset(files).map(parse)


MODEL = sm.Model(model_fn, train_input_fn, eval_input_fn, params=PARAMS)
