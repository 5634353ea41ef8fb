"""Sparse models: an embedding table stays on the ps, cut over them, and its gradient stays
sparse up to the optimizer, averaged exactly as a dense one is.

An in-process cluster of 2 workers and 2 ps on a table of 6 rows, with exact arithmetic (as
TensorFlow's own sync_replicas_optimizer_test); and the ctr model's graph, built without a
cluster. The ctr model trained to near its planted optimum is in tests/convergence.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from inprocess_cluster import run_cluster
from sync_mnist.models import ctr

tf1 = tf.compat.v1

# 8 examples of one id each; each worker's batch is its whole shard of 4, one update.
IDS = np.array([[0], [0], [1], [2], [3], [3], [3], [4]], np.int64)  # row 5: never looked up
ROWS = 6


def _lookup_model_fn(features, labels, mode, params):
    table = tf1.get_variable("table", [ROWS, 1], initializer=tf1.zeros_initializer())
    looked_up = tf.reshape(tf.nn.embedding_lookup(table, tf.reshape(features, [-1])), [-1])
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"value": looked_up})
    loss = tf.reduce_mean(looked_up + 0 * labels)  # d loss / d row r = (r's count) / batch
    return sm.ModelSpec(mode, loss=loss, optimizer=tf1.train.GradientDescentOptimizer(1.0))


LOOKUP = sm.Model(_lookup_model_fn, lambda params: (IDS, np.zeros(len(IDS), np.float32)),
                  lambda params: (IDS, np.zeros(len(IDS), np.float32)))


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_a_sparse_update_is_the_mean_of_one_gradient_per_worker(tmp_path, wire_dtype):
    """Each row moves by lr * (its count over both batches) / (2 workers * 4 examples), as
    a dense mean of the two gradients; a row no worker looked up does not move.

    The stock SyncReplicasOptimizer averages a sparse gradient per row, over the pushes that
    held that row: row 4, in one worker's batch only, would move by 1/4, not 1/8, and row 3,
    three times in one batch, by 3/4 where the mean is 3/8.
    """
    export_dir = tmp_path / "model"
    result = run_cluster(2, LOOKUP, num_ps=2, train_steps=1, batch_size=4,
                         export_dir=export_dir, wire_dtype=wire_dtype)
    assert result.chief.synchronous, result.chief.verdict
    table = _exported(export_dir, "table")
    counts = np.bincount(IDS.ravel(), minlength=ROWS)
    np.testing.assert_array_equal(table.ravel(), -counts / 8.0)  # 0.125 steps: exact
    assert table[5, 0] == 0.0


def _exported(export_dir, name: str) -> np.ndarray:
    with tf.Graph().as_default(), tf1.Session() as sess:
        tf1.saved_model.loader.load(sess, [tf1.saved_model.SERVING], str(export_dir))
        return sess.run(next(v for v in tf1.global_variables() if v.op.name == name))


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_a_sparse_gradient_crosses_as_sorted_unique_rows_beside_the_dense_ones(wire_dtype):
    """sync.to_ps and sync.restored on one device (no cluster): a dense gradient comes back
    as it was, a sparse one with its repeated rows summed and its rows sorted, as the sparse
    accumulator needs (test_a_sparse_update_is_the_mean... shows what it does otherwise)."""
    from sync_mnist.core import sync

    with tf.Graph().as_default():
        dense = tf1.get_variable("dense", [2, 3])
        table = tf1.get_variable("table", [10, 2])
        other = tf1.get_variable("other", [7, 1])
        grads = [
            (tf.constant([[1., 2., 3.], [4., 5., 6.]]), dense),
            (tf.IndexedSlices(tf.constant([[1., 1.], [2., 2.], [4., 4.], [8., 8.]]),
                              tf.constant([7, 2, 7, 0]), tf.constant([10, 2])), table),
            (tf.IndexedSlices(tf.constant([[0.5]]), tf.constant([6], tf.int64)), other)]
        back = sync.restored(sync.to_ps(grads, wire_dtype), grads)
        with tf1.Session() as sess:
            d, t, o = sess.run([back[0][0], back[1][0], back[2][0]])
    np.testing.assert_array_equal(d, [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(t.indices, [0, 2, 7])
    np.testing.assert_array_equal(t.values, [[8, 8], [2, 2], [5, 5]])
    np.testing.assert_array_equal(t.dense_shape, [10, 2])
    np.testing.assert_array_equal(o.indices, [6])
    np.testing.assert_array_equal(o.values, [[0.5]])
