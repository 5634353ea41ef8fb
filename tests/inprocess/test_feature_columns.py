"""Feature columns in a model function (tests/column_model.py: every kind of column, into
input_layer and linear_model) train synchronously, on dense arrays and on variable-length
SparseTensors, and resume on another number of ps.

Each run's checkpoint is compared with the same model function trained in one plain session
(column_model.reference), one step over all 16 examples for each update of 2 workers' 8. Equal
values prove the arithmetic of every update for every table: one gradient from each worker,
averaged (a sparse one per row over N, not over the pushes that held the row), applied once
with Adagrad's slots, restored whole when the number of ps changes. How the tables are cut and
looked up on the ps, and that their gradients stay sparse, is in
tests/fast/test_feature_column_graph.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import column_model
from inprocess_cluster import run_cluster

tf1 = tf.compat.v1

FIRST, THEN = 2, 4  # updates on 2 ps, then up to this many
BATCH = column_model.EXAMPLES // 2
SAME = dict(rtol=2e-5, atol=1e-6)  # the same sums in another order


def _checkpoint(logdir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(logdir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """Dense arrays in memory: FIRST updates on 2 ps; then resumed on 1 ps, up to THEN."""
    tmp = tmp_path_factory.mktemp("dense")
    model, logdir = column_model.DENSE_MODEL, tmp / "logdir"
    first = run_cluster(2, model, num_ps=2, train_steps=FIRST, batch_size=BATCH, logdir=logdir)
    at_first = _checkpoint(logdir)
    then = run_cluster(2, model, num_ps=1, train_steps=THEN, batch_size=BATCH, logdir=logdir,
                       export_dir=tmp / "model")
    return first, at_first, then, _checkpoint(logdir), tmp / "model"


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    """SparseTensors streamed (a tf.data.Dataset) beside dense tensors: THEN updates on 2 ps."""
    tmp = tmp_path_factory.mktemp("sparse")
    run = run_cluster(2, column_model.SPARSE_MODEL, num_ps=2, train_steps=THEN,
                      batch_size=BATCH, logdir=tmp / "logdir", export_dir=tmp / "model")
    return run, _checkpoint(tmp / "logdir"), tmp / "model"


def _assert_trained_as_one_batch(saved: dict, expected: dict, steps: int) -> None:
    assert set(expected) <= set(saved)  # with the counters beside them
    assert not [name for name in saved if "part_" in name]  # each whole, not its slices
    for name, value in expected.items():
        np.testing.assert_allclose(saved[name], value, **SAME, err_msg=f"{name}, {steps}")
    for table in column_model.TABLES.values():  # every kind's table was looked up and moved
        assert (np.abs(saved[f"{table}/Adagrad"] - 0.1) > 1e-4).any(), table


def test_dense_input_updates_every_table_as_one_batch_and_resumes_on_one_ps(dense):
    first, at_first, then, at_then, _ = dense
    assert first.chief.verdict.startswith(f"synchronous: each of {FIRST} updates averaged "
                                          "exactly one gradient from each of 2 workers")
    assert then.chief.synchronous, then.chief.verdict
    assert then.chief.contributions == [THEN, THEN]  # the counters resumed too
    expected, _ = column_model.reference(False, (FIRST, THEN))
    _assert_trained_as_one_batch(at_first, expected[FIRST], FIRST)
    _assert_trained_as_one_batch(at_then, expected[THEN], THEN)


def test_sparse_input_updates_every_table_as_one_batch(sparse):
    run, saved, _ = sparse
    assert run.chief.verdict.startswith(f"synchronous: each of {THEN} updates averaged "
                                        "exactly one gradient from each of 2 workers")
    expected, _ = column_model.reference(True, (THEN,))
    _assert_trained_as_one_batch(saved, expected[THEN], THEN)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_the_saved_model_takes_the_features_as_the_input_has_them(kind, request):
    """Strings, ids and SparseTensors in, as in training; its vocabulary's table filled when it
    is loaded."""
    export_dir = request.getfixturevalue(kind)[-1]
    features, _ = column_model.sparse_values() if kind == "sparse" else \
        column_model.dense_data()
    _, expected = column_model.reference(kind == "sparse", (THEN,))
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.loader.load(sess, [tf1.saved_model.SERVING], str(export_dir))
        signature = meta.signature_def["serving_default"]
        assert set(signature.inputs) == set(features)
        tensor = tf1.saved_model.utils.get_tensor_from_tensor_info
        probabilities = sess.run(tensor(signature.outputs["probabilities"]), {
            tensor(info): features[name] for name, info in signature.inputs.items()})
    np.testing.assert_allclose(probabilities, expected, **SAME)
