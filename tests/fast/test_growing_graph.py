"""A growing table's worker graph on 2 ps, built without a cluster: where its parts live, that a
worker's step only reads them and the chief's update writes them; what the audit takes for a
write; an evicted row's initial values; the feature column's combiners, and a canned DNN over
it. The run itself is tests/inprocess/test_growing.py."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.core import audit, growing
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig, WarmStart
from sync_mnist.task.graph import build_graph

tf1 = tf.compat.v1

IDS = np.array([[3], [-8], [10**15], [7]], np.int64)


def _model_fn(features, labels, mode, params):
    rows = sm.growing_embedding(features, name="grow", dim=2, cap=6, min_count=2, ttl=3)
    loss = tf.reduce_mean(rows) + 0 * tf.reduce_sum(labels)
    return sm.ModelSpec(mode, loss=loss, optimizer=tf1.train.AdagradOptimizer(0.1))


MODEL = sm.Model(_model_fn, lambda params: (IDS, np.zeros(len(IDS), np.float32)),
                 lambda params: (IDS, np.zeros(len(IDS), np.float32)))


def _worker_graph(index: int = 0, **train) -> tuple[tf.Graph, object]:
    layout = ClusterLayout(("localhost:2000", "localhost:2001"),
                           ("localhost:3000", "localhost:3001"))
    config = TaskConfig(role="worker", index=index, cluster=layout,
                        train=TrainConfig(model="grow", train_steps=10, **train))
    graph = tf.Graph()
    with graph.as_default():
        built = build_graph(config, MODEL, (IDS, np.zeros(len(IDS), np.float32)), target=10)
    return graph, built


def _ps_of(op) -> int:
    return tf.DeviceSpec.from_string(op.device).task


def test_each_ps_holds_its_slice_of_the_rows_the_bookkeeping_and_the_index():
    graph, _ = _worker_graph()
    ops = {op.name: op for op in graph.get_operations()}
    for k in range(2):
        for name in ("grow/rows", "grow/ids", "grow/seen"):
            assert _ps_of(ops[f"{name}/part_{k}"]) == k
        for table in ("index", "pending"):
            assert _ps_of(ops[f"grow/shard_{k}/grow.shard_{k}.{table}"]) == k
    assert ops["grow/rows/part_0"].get_attr("shape").dim[0].size == 3


def test_a_step_reads_the_table_and_only_the_update_writes_it():
    """The step's closure finds ids in each ps's index and writes none of the table; the
    chief's update (the queue runner's op) writes the rows, the index and the bookkeeping."""
    graph, built = _worker_graph()
    table, = growing.tables(graph)
    state = table.state_names
    step = audit.closure([built.training.train_op])
    assert {op.type for op in step} >= {"LookupTableFindV2", "SparseAccumulatorApplyGradient"}
    assert not [op for op in step if audit.is_write(op) and audit.written(op) in state]
    runner = built.training.optimizer._chief_queue_runner  # pylint: disable=W0212 (sync.py's)
    update = audit.closure(runner.enqueue_ops)
    written = {audit.written(op) for op in update if audit.is_write(op)}
    assert state <= written | {f"grow/rows/part_{k}" for k in range(2)}
    assert {"grow/shard_0/grow.shard_0.index", "grow/seen/part_1", "grow/ids/part_0",
            "grow/rows/part_1/Adagrad"} <= written


def test_the_step_counts_its_push_once_its_ids_are_on_their_ps():
    """Sync: as for the gradients, the counts wait for the batch's ids to be on each ps, so a
    worker killed mid-step (one ps) has pushed and counted all of it or none."""
    graph, built = _worker_graph()
    table, = growing.tables(graph)
    step = audit.closure([built.training.train_op])
    count, = [op for op in step if audit.is_write(op)
              and audit.written(op) == "sync_counters/pushed"]
    waited = {op.name for op in audit.closure([count])}
    copies = table.to_ps()
    assert {t.op.name for t in copies} <= waited
    assert [_ps_of(t.op) for t in copies] == [0, 0, 1, 1]


def test_a_step_that_wrote_the_table_would_be_refused():
    graph, built = _worker_graph()
    table, = growing.tables(graph)
    with graph.as_default():
        shard = table.shards[1]
        sneaked = shard.index.insert(tf.constant([5], tf.int64), tf.constant([0], tf.int64))
        with pytest.raises(RuntimeError, match="a worker's step writes grow/shard_1/grow.shard_1"
                           ".index .* which only the update may write: the growing table grow"):
            audit.check_update_only([sneaked, built.training.train_op], table.state_names,
                                    "the growing table grow")


def test_the_audit_takes_table_writes_for_writes_and_scatter_nd_for_none():
    with tf.Graph().as_default():
        table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1)
        insert = table.insert(tf.constant([1], tf.int64), tf.constant([2], tf.int64))
        made = tf.scatter_nd([[0]], [1.0], [3])
        v = tf1.get_variable("v", [3])
        assert audit.is_write(insert)
        assert not audit.is_write(made.op)
        assert audit.is_write(tf1.scatter_update(v, [0], [1.0]).op)


def test_async_mode_and_a_warm_start_are_refused_naming_the_table(tmp_path):
    with pytest.raises(ConfigError, match="the growing table grow needs --mode sync"):
        _worker_graph(mode="async")
    with pytest.raises(ConfigError, match="the growing table grow cannot be warm-started"):
        _worker_graph(index=0, warm_start=WarmStart(str(tmp_path)))


@pytest.mark.parametrize("initializer, rows", [
    (tf1.constant_initializer(0.1), [[0.1, 0.1]] * 2),  # Adagrad's accumulator: a fill
    (tf1.zeros_initializer(), [[0.0, 0.0]] * 2),
])
def test_an_evicted_row_reads_its_variables_initial_value(initializer, rows):
    with tf.Graph().as_default():
        big = tf1.get_variable("big", [2000, 2], initializer=initializer)
        small = tf1.get_variable("small", [4, 2], initializer=initializer)
        drawn = tf1.get_variable("drawn", [4, 2], initializer=tf1.random_normal_initializer(
            seed=1))
        evicted = tf.constant([3, 1], tf.int64)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for v in (big, small):
                got = sess.run(growing._initial_rows(v, evicted))
                np.testing.assert_array_equal(got, np.array(rows, np.float32))
            # A random initializer's rows are drawn again: of the right shape.
            assert sess.run(growing._initial_rows(drawn, evicted)).shape == (2, 2)


def test_bad_settings_name_the_value_in_a_model_function():
    def model_fn(features, labels, mode, params):
        sm.growing_embedding(features, name="grow", dim=2, cap=6, ttl=-1)

    from sync_mnist.core import placement
    with tf.Graph().as_default():
        with pytest.raises(sm.ContractError, match="ttl must be an integer of at least 1, "
                                                   "got -1"):
            placement.call(model_fn, tf1.placeholder(tf.int64, [None]), None, "train", {})


@pytest.mark.parametrize("combiner, expected", [
    ("mean", [[2.0, 2.0], [0.0, 0.0], [0.5, 0.5]]),
    ("sum", [[4.0, 4.0], [0.0, 0.0], [1.0, 1.0]]),
    ("sqrtn", [[4 / np.sqrt(2)] * 2, [0.0, 0.0], [1 / np.sqrt(2)] * 2]),
])
def test_the_column_combines_an_examples_rows_and_an_id_without_one_reads_zeros(combiner,
                                                                                expected):
    """In a graph of no ps (the SavedModel's): ids 5 and -7 hold rows 1 and 3 (values 1 and 3);
    example 0 has both, example 1 none, example 2 has 5 and 99, which has no row."""
    column = sm.growing_embedding_column("ids", dimension=2, cap=4, combiner=combiner)
    with tf.Graph().as_default():
        ids = tf.SparseTensor([[0, 0], [0, 1], [2, 0], [2, 1]],
                              tf.constant([5, -7, 5, 99], tf.int64), [3, 2])
        out = tf1.feature_column.input_layer({"ids": ids}, [column])
        scope = "input_layer/ids_growing_embedding/ids/"
        found = {v.op.name: v for v in tf1.global_variables()}
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run([found[scope + "rows"].assign(np.repeat([[0.], [1.], [2.], [3.]], 2, 1)),
                      found[scope + "ids"].assign([0, 5, 0, -7]),
                      found[scope + "seen"].assign([-1, 4, -1, 2])])
            sess.run(tf1.tables_initializer())
            np.testing.assert_allclose(sess.run(out), expected, rtol=1e-6)


def test_a_canned_dnn_takes_the_column():
    """DNNClassifier over a growing column: its table is a growing table of the worker graph,
    on the ps, and its parse spec reads the ids as a VarLenFeature."""
    from sync_mnist import canned

    column = sm.growing_embedding_column("user", dimension=4, cap=8, min_count=2, ttl=5)
    users = np.array([[1], [2], [3], [4]], np.int64)
    model = canned.DNNClassifier(
        [4], [column], train_input_fn=lambda params: ({"user": users}, np.zeros(4, np.int64)),
        eval_input_fn=lambda params: ({"user": users}, np.zeros(4, np.int64)))
    layout = ClusterLayout(("localhost:2000", "localhost:2001"),
                           ("localhost:3000", "localhost:3001"))
    config = TaskConfig(role="worker", index=1, cluster=layout,
                        train=TrainConfig(train_steps=10, batch_size=4))
    graph = tf.Graph()
    with graph.as_default():
        build_graph(config, model, ({"user": users}, np.zeros(4, np.int64)), target=10)
    table, = growing.tables(graph)
    assert table.settings.name == "user" and len(table.shards) == 2
    assert tf1.feature_column.make_parse_example_spec([column]) == {
        "user": tf.io.VarLenFeature(tf.int64)}


@pytest.mark.parametrize("bad, named", [
    ({"combiner": "max"}, "combiner must be one of mean, sum, sqrtn, got 'max'"),
    ({"dimension": 0}, "dimension must be an integer of at least 1, got 0"),
    ({"min_count": 0}, "min_count must be an integer of at least 1, got 0"),
])
def test_bad_column_settings_name_the_value(bad, named):
    with pytest.raises(sm.ContractError, match=named):
        sm.growing_embedding_column("user", **{"dimension": 2, "cap": 4, **bad})
