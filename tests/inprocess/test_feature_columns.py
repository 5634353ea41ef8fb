"""Feature columns in a model function (tests/column_model.py: every kind of column, into
input_layer and linear_model) train synchronously on dense arrays and on variable-length
SparseTensors, and resume on another number of ps.

One logdir, two clusters of 2 workers: the padded numpy arrays on 2 ps for FIRST updates, then
the SparseTensors, streamed, on 1 ps, resumed up to THEN (the model's variables are the same
whatever its input). Each checkpoint is compared with the same model function trained in one
plain session (column_model.reference), one step over all 16 examples for each update of the 2
workers' 8. Equal values prove the arithmetic of every update for every table: one gradient
from each worker, averaged (a sparse one per row over N, not over the pushes that held the
row), applied once with Adagrad's slots, restored whole when the number of ps changed. How the
tables are cut and looked up on the ps, and that their gradients stay sparse, is in
tests/fast/test_feature_column_graph.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import column_model
from inprocess_cluster import run_cluster

tf1 = tf.compat.v1

FIRST, THEN = 2, 4  # updates on 2 ps (dense input), then up to this many on 1 ps (sparse)
INPUTS = ("dense",) * FIRST + ("sparse",) * (THEN - FIRST)
BATCH = column_model.EXAMPLES // 2
SAME = dict(rtol=2e-5, atol=1e-6)  # the same sums in another order


def _checkpoint(logdir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(logdir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Both runs: what each left in the logdir, and its SavedModel."""
    tmp = tmp_path_factory.mktemp("columns")
    logdir = tmp / "logdir"
    dense = run_cluster(2, column_model.DENSE_MODEL, num_ps=2, train_steps=FIRST,
                        batch_size=BATCH, logdir=logdir, export_dir=tmp / "dense")
    at_first = _checkpoint(logdir)
    sparse = run_cluster(2, column_model.SPARSE_MODEL, num_ps=1, train_steps=THEN,
                         batch_size=BATCH, logdir=logdir, export_dir=tmp / "sparse")
    return dict(dense=(dense, at_first, tmp / "dense"),
                sparse=(sparse, _checkpoint(logdir), tmp / "sparse"))


def _assert_trained_as_one_batch(saved: dict, steps: int) -> None:
    expected = column_model.reference(INPUTS)[steps - 1]
    assert set(expected) <= set(saved)  # with the counters beside them
    assert not [name for name in saved if "part_" in name]  # each whole, not its slices
    for name, value in expected.items():
        np.testing.assert_allclose(saved[name], value, **SAME, err_msg=f"{name}, {steps}")
    for table in column_model.TABLES.values():  # every kind's table was looked up and moved
        assert (np.abs(saved[f"{table}/Adagrad"] - 0.1) > 1e-4).any(), table


def test_dense_input_on_two_ps_updates_every_table_as_one_batch(trained):
    run, saved, _ = trained["dense"]
    assert run.chief.verdict.startswith(f"synchronous: each of {FIRST} updates averaged "
                                        "exactly one gradient from each of 2 workers")
    assert "accuracy" in run.chief.test_metrics  # evaluated, its vocabulary's table filled
    _assert_trained_as_one_batch(saved, FIRST)


def test_sparse_input_resumes_that_checkpoint_on_one_ps_as_one_batch(trained):
    run, saved, _ = trained["sparse"]
    assert run.chief.synchronous, run.chief.verdict
    assert run.chief.contributions == [THEN, THEN]  # the counters resumed too
    assert "accuracy" in run.chief.test_metrics
    _assert_trained_as_one_batch(saved, THEN)


@pytest.mark.parametrize("kind, steps", [("dense", FIRST), ("sparse", THEN)])
def test_the_saved_model_takes_the_features_as_the_input_has_them(trained, kind, steps):
    """Strings, ids and SparseTensors in, as in training; the vocabulary's table filled when
    the model is loaded."""
    export_dir = trained[kind][2]
    features, _ = column_model.sparse_values() if kind == "sparse" else \
        column_model.dense_data()
    expected = column_model.predictions(kind == "sparse",
                                        column_model.reference(INPUTS)[steps - 1])
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.loader.load(sess, [tf1.saved_model.SERVING], str(export_dir))
        signature = meta.signature_def["serving_default"]
        assert set(signature.inputs) == set(features)
        tensor = tf1.saved_model.utils.get_tensor_from_tensor_info
        probabilities = sess.run(tensor(signature.outputs["probabilities"]), {
            tensor(info): features[name] for name, info in signature.inputs.items()})
    np.testing.assert_allclose(probabilities, expected, **SAME)
