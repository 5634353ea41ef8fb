"""The ctr model's worker graph with 2 ps, built without a cluster: the embedding table is cut
evenly over the ps, never read whole, its gradient accumulated and applied sparse there."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.core import placement
from sync_mnist.task.graph import build_graph
from sync_mnist.task.inputs import input_data, model_params
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskConfig, TrainConfig
from sync_mnist.models import ctr

tf1 = tf.compat.v1

ROWS = 10_001  # not a multiple of 2: the slices differ by one row


def _worker_graph(num_ps: int, rows: int = ROWS, model=ctr.SMALL) -> tf.Graph:
    model = dataclasses.replace(model, params={**model.params, "rows": rows,
                                               "train_examples": 400, "eval_examples": 100})
    layout = ClusterLayout(tuple(f"localhost:{2000 + p}" for p in range(num_ps)),
                           ("localhost:3000", "localhost:3001"))
    config = TaskConfig(role="worker", index=1, cluster=layout,
                        train=TrainConfig(model="ctr", train_steps=10))
    features, labels = input_data("train_input_fn", model.train_input_fn,
                                         model_params(config, model))
    example = ({k: v[:100] for k, v in features.items()}, labels[:100])
    graph = tf.Graph()
    with graph.as_default():
        build_graph(config, model, example, target=10)
    return graph


def test_the_table_is_cut_evenly_over_the_ps_and_never_read_whole():
    graph = _worker_graph(2)
    slices = [op for op in graph.get_operations()
              if op.type == "VarHandleOp" and re.fullmatch(r"embedding/table/part_\d", op.name)]
    assert [op.device for op in slices] == ["/job:ps/task:0", "/job:ps/task:1"]
    assert [tf.TensorShape(op.get_attr("shape")).as_list() for op in slices] == [
        [5001, 16], [5000, 16]]  # rows within 2% of even: within one row
    for op in slices:
        reads = {c.type for c in op.outputs[0].consumers()
                 if not c.name.startswith(op.name + "/") and c.type != "VarIsInitializedOp"}
        # Looked up (gathered where it lives) and applied; never read whole, never pulled.
        assert reads == {"ResourceGather", "ResourceSparseApplyAdagrad"}, (op.name, reads)
        gathers = [c for c in op.outputs[0].consumers() if c.type == "ResourceGather"]
        assert all(g.device == op.device for g in gathers)
    # Nothing on the worker is table-sized: the biggest tensor there is far from 5,000 rows.
    on_worker = [t for op in graph.get_operations() if op.device.startswith("/job:worker")
                 for t in op.outputs if t.shape.is_fully_defined()]
    assert max(t.shape.num_elements() for t in on_worker) < 5000 * 16 // 10


def test_the_table_gradient_stays_sparse_to_the_optimizer():
    graph = _worker_graph(2)
    sparse = [op for op in graph.get_operations() if op.type == "SparseConditionalAccumulator"]
    # One per slice, on its ps, summing (sync._sparse_accumulators_sum).
    assert sorted(op.device for op in sparse) == ["/job:ps/task:0", "/job:ps/task:1"]
    assert {op.get_attr("reduction_type") for op in sparse} == {b"SUM"}
    dense_shapes = [tf.TensorShape(op.get_attr("shape")).as_list()
                    for op in graph.get_operations() if op.type == "ConditionalAccumulator"]
    assert not any(shape and shape[0] >= 5000 for shape in dense_shapes), dense_shapes
    # The whole table's gradient is never made: a tensor with a slice's rows is the slice or
    # its Adagrad accumulator (their initial values and reads), made beside the slice.
    sized = [op for op in graph.get_operations() for t in op.outputs
             if t.shape.rank and t.shape[0] in (5000, 5001, ROWS)]
    assert sized and all(re.match(r"embedding/table/part_(\d)/", op.name) for op in sized)


def test_a_table_read_whole_is_refused():
    def model_fn(features, labels, mode, params):
        table = tf1.get_variable("table", [10, 1])
        rows = tf.gather(table, features[:, 0])  # tf.gather on a PartitionedVariable: concat
        return sm.ModelSpec(mode, loss=tf.reduce_mean(rows) + 0 * tf.reduce_mean(labels))

    features, labels = np.zeros([4, 1], np.int64), np.zeros([4], np.float32)
    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        like = placement.placeholders(features, labels)
        with pytest.raises(sm.ContractError, match="reads the embedding table table whole"):
            placement.build(model_fn, *like, sm.ModeKeys.TRAIN, {}, num_ps=2)


def test_a_variable_length_feature_reaches_the_model_function_as_a_sparse_tensor():
    # A streamed input's tf.io.VarLenFeature is a SparseTensor: the scratch graph that records
    # the model's variables must take one (it was refused as "must be tensors").
    seen = []

    def model_fn(features, labels, mode, params):
        seen.append(type(features["words"]).__name__)
        table = tf1.get_variable("table", [50, 4])
        embedded = tf.nn.safe_embedding_lookup_sparse(table, features["words"], combiner="mean")
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(embedded, 1) - labels))
        return sm.ModelSpec(mode, loss=loss)

    with tf.Graph().as_default():
        features = {"words": tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64),
                                             [8, 3])}
        labels = tf.zeros([8])
    recorded = placement.record(model_fn, features, labels, sm.ModeKeys.TRAIN, {})
    assert [r.name for r in recorded] == ["table"] and seen == ["SparseTensor"]
