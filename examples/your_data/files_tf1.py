"""An Estimator program over TFRecord files, as TF 1.15 users wrote it: input functions that
stream the files through tf.data (shuffled, repeated, batched), train_and_evaluate. It does not
run on TensorFlow 2.16 or later (no tf.estimator); files_migrated.py is the same program for
sync_mnist (docs/your-model.md, "Your data", counts the lines).
"""

import glob
import os

import tensorflow as tf

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
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.TRAIN:
        optimizer = tf.train.AdamOptimizer(params["learning_rate"])
        train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    metrics = {"accuracy": tf.metrics.accuracy(labels, predictions["classes"])}
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)


def train_input_fn():
    files = sorted(glob.glob(os.path.join(DATA, "train-*.tfrecord")))
    dataset = tf.data.TFRecordDataset(files).map(parse).shuffle(1000)
    return dataset.repeat(5).batch(50)


def eval_input_fn():
    files = sorted(glob.glob(os.path.join(DATA, "eval-*.tfrecord")))
    return tf.data.TFRecordDataset(files).map(parse).batch(50)


if __name__ == "__main__":
    estimator = tf.estimator.Estimator(model_fn, params=PARAMS)
    tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(train_input_fn),
                                    tf.estimator.EvalSpec(eval_input_fn))
