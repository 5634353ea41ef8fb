"""The feature-column model's worker graph with 2 ps (tests/column_model.py), built without a
cluster, on dense arrays and on SparseTensors: every table a column makes is cut over the ps,
looked up where its rows live, and its gradient accumulated and applied sparse there; the
other variables are pulled whole. A mistake in a column is bad input in TensorFlow's words; the docs' example model builds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import column_model
import sync_mnist.api as sm
from mlp_graph import prepared_graph
from sync_mnist.core import placement
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig
from sync_mnist.task.graph import build_graph

tf1 = tf.compat.v1
fc = tf1.feature_column
PS = ("/job:ps/task:0", "/job:ps/task:1")


def _config() -> TaskConfig:
    layout = ClusterLayout(tuple(f"localhost:{2000 + p}" for p in range(2)),
                           ("localhost:3000", "localhost:3001"))
    return TaskConfig(role="worker", index=1, cluster=layout,
                      train=TrainConfig(train_steps=10, batch_size=8))


def _reads(op) -> set[str]:
    return {c.type for c in op.outputs[0].consumers()
            if not c.name.startswith(op.name + "/") and c.type != "VarIsInitializedOp"}


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_every_table_is_cut_over_the_ps_looked_up_there_and_updated_sparse(kind):
    example = column_model.sparse_values() if kind == "sparse" else column_model.dense_data()
    graph = tf.Graph()
    with graph.as_default():
        build_graph(_config(), column_model.DENSE_MODEL, example, target=10)
    ops = graph.get_operations()
    accumulators = {op.get_attr("shared_name").decode(): op for op in ops
                    if op.type == "SparseConditionalAccumulator"}
    assert len(accumulators) == 2 * len(column_model.TABLES)  # one per slice: nothing else
    for what, table in column_model.TABLES.items():
        slices = [op for op in ops if op.type == "VarHandleOp"
                  and re.fullmatch(re.escape(table) + r"/part_\d", op.name)]
        assert [op.device for op in slices] == list(PS), what
        for op in slices:
            # Looked up (gathered where it lives) and applied sparse; never read whole.
            assert _reads(op) == {"ResourceGather", "ResourceSparseApplyAdagrad"}, what
            assert {c.device for c in op.outputs[0].consumers()
                    if c.type == "ResourceGather"} == {op.device}, what
            # Its gradient pushed as IndexedSlices, summed on its ps (sync.py).
            accumulator = accumulators[f"{op.name}:0/grad_accum"]
            assert accumulator.device == op.device, what
            assert accumulator.get_attr("reduction_type") == b"SUM", what
    for name in column_model.DENSE:  # read whole, in the step's one pull per ps
        for op in ops:
            if op.type == "VarHandleOp" and re.fullmatch(re.escape(name) + r"(/part_\d)?",
                                                         op.name):
                assert _reads(op) == {"ReadVariableOp", "ResourceApplyAdagrad"}, op.name


def _crossing_a_hashed_column(features, labels, mode, params):
    word = fc.categorical_column_with_hash_bucket("word", 16)
    crossed = fc.crossed_column([word, "color"], 24)  # cross "word" itself, not its hash
    return _linear(features, labels, mode, [crossed])


def _an_identity_column_over_strings(features, labels, mode, params):
    return _linear(features, labels, mode, [fc.categorical_column_with_identity("word", 10)])


def _linear(features, labels, mode, columns):
    logits = tf.squeeze(fc.linear_model(features, columns), 1)
    return sm.ModelSpec(mode, loss=tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)))


@pytest.mark.parametrize("model_fn, words", [
    (_crossing_a_hashed_column, "categorical_column_with_hash_bucket is not supported for "
                                "crossing. Hashing before crossing will increase probability "
                                "of collision. Instead, use the feature name as a string. "
                                "Given: HashedCategoricalColumn(key='word'"),
    (_an_identity_column_over_strings, "Invalid input, not integer. key: word dtype: "
                                       "<dtype: 'string'>"),
])
def test_a_mistake_in_a_column_is_bad_input_in_tensorflows_words(model_fn, words):
    model = sm.Model(model_fn, column_model.dense_data, column_model.dense_data)
    with pytest.raises(sm.ContractError) as raised, tf.Graph().as_default():
        prepared_graph(_config(), model)
    assert isinstance(raised.value, ConfigError)  # exit 2
    assert str(raised.value).startswith(
        f"the model function raised ValueError in mode 'train': {words}")
    assert "test_feature_column_graph.py" in raised.value.details  # the user's traceback


def _docs_example() -> str:
    """The model file of docs/model-reference.md's "Feature columns"."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "model-reference.md").read_text()
    section = text.split("\n## Feature columns\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```\n", 1)[0]


def test_the_docs_example_makes_its_columns_tables_embedding_tables():
    namespace: dict = {}
    exec(compile(_docs_example(), "model-reference.md", "exec"), namespace)
    words = tf1.SparseTensorValue(np.array([[0, 0], [0, 1], [2, 0]], np.int64),
                                  np.array([b"cheap", b"flights", b"hotel"], object),
                                  np.array([3, 2], np.int64))
    batch = ({"age": np.array([[20.0], [35.0], [70.0]], np.float32),
              "color": np.array([["red"], ["blue"], ["pink"]]), "words": words},
             np.array([1.0, 0.0, 1.0], np.float32))
    with tf.Graph().as_default():
        recorded = placement.record(namespace["MODEL"].model_fn, *placement.placeholders(*batch),
                                    sm.ModeKeys.TRAIN, {})
    assert sorted(placement.sparse_names(recorded)) == [
        "input_layer/words_embedding/embedding_weights", "linear_model/age_bucketized/weights",
        "linear_model/age_bucketized_X_color/weights", "linear_model/color/weights",
        "linear_model/words/weights"]
    assert sorted(r.name for r in recorded if not r.sparse) == [
        "hidden", "linear_model/bias_weights", "out"]
