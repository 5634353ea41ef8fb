"""An Estimator program as TF 1.15 users wrote it: tf.layers with batch norm, numpy input
functions, train_and_evaluate. It does not run on TensorFlow 2.16 or later (no tf.estimator);
estimator_migrated.py is the same model for sync_mnist (docs/your-model.md counts the lines).
"""

import numpy as np
import tensorflow as tf

PARAMS = {"hidden": 32, "classes": 4, "learning_rate": 0.01}


def model_fn(features, labels, mode, params):
    net = tf.layers.dense(features["x"], params["hidden"], activation=tf.nn.relu)
    net = tf.layers.batch_normalization(net, training=mode == tf.estimator.ModeKeys.TRAIN)
    logits = tf.layers.dense(net, params["classes"])
    predictions = {"classes": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.TRAIN:
        optimizer = tf.train.AdamOptimizer(params["learning_rate"])
        with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
            train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    metrics = {"accuracy": tf.metrics.accuracy(labels, predictions["classes"])}
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)


def make_data(rows, seed):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(PARAMS["classes"], 20))
    labels = rng.integers(0, PARAMS["classes"], rows)
    features = centres[labels] + rng.normal(scale=0.5, size=(rows, 20))
    return {"x": features.astype(np.float32)}, labels.astype(np.int64)


train_input_fn = tf.estimator.inputs.numpy_input_fn(
    *make_data(3000, seed=1), batch_size=100, num_epochs=None, shuffle=True)
eval_input_fn = tf.estimator.inputs.numpy_input_fn(*make_data(500, seed=2), shuffle=False)

if __name__ == "__main__":
    estimator = tf.estimator.Estimator(model_fn, params=PARAMS)
    tf.estimator.train_and_evaluate(estimator,
                                    tf.estimator.TrainSpec(train_input_fn, max_steps=300),
                                    tf.estimator.EvalSpec(eval_input_fn))
