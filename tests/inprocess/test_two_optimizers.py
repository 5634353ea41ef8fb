"""Two optimizers in one synchronous update (ModelSpec(optimizer={scope: optimizer}), as wide &
deep trains its linear part with FTRL and its deep part with Adagrad): each update applies each
optimizer once, to the average of one gradient from each worker, and counts as one update.

Exact arithmetic, as the counters are tested: a loss linear in two scalars, w under "linear"
and v under "dnn", on features of small integers, so that every gradient is a batch mean
known in advance and every value below is exact in float32. Then the sparse path (an
embedding table under FTRL beside a dense variable under Adagrad) against the same formulas
in numpy, resumed from a checkpoint with another number of ps: the slots were saved whole.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from inprocess_cluster import run_cluster
from mlp_graph import prepared_graph
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig
from sync_mnist.core.shard import Shard

tf1 = tf.compat.v1
ROWS, BATCH, STEPS, SEED = 32, 2, 6, 3
LR_W, LR_V, MOMENTUM = 1.0, 0.5, 0.5


def _data(params):
    # Positive, so that no sum of gradients below is 0 (an optimizer applied twice to a sum
    # of 0 would go unseen), and small integers, so that every batch mean is exact.
    rng = np.random.default_rng(11)
    features = np.stack([rng.integers(0, 5, ROWS), rng.integers(1, 9, ROWS)], axis=1)
    return features.astype(np.float32), np.zeros(ROWS, np.float32)


def _two_scalars(features, labels, mode, params):
    with tf1.variable_scope("linear"):
        w = tf1.get_variable("w", [], initializer=tf1.zeros_initializer())
    with tf1.variable_scope("dnn"):
        v = tf1.get_variable("v", [], initializer=tf1.zeros_initializer())
    # d loss / d w and d loss / d v: the batch's mean of each feature.
    loss = (tf.reduce_mean(features[:, 0]) * w + tf.reduce_mean(features[:, 1]) * v
            + 0 * tf.reduce_mean(labels))
    if mode == sm.ModeKeys.TRAIN:
        dnn = tf1.train.MomentumOptimizer(LR_V, MOMENTUM) if params["dnn"] == "momentum" \
            else tf1.train.GradientDescentOptimizer(LR_V)
        linear = _ClipEachWorker if params.get("clip") else tf1.train.GradientDescentOptimizer
        optimizers = {"linear/": linear(LR_W), "dnn": dnn}
        return sm.ModelSpec(mode, loss=loss, optimizer={
            scope: optimizers[scope] for scope in params.get("scopes", optimizers)})
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={
        "w": (tf.identity(w), tf.no_op()), "v": (tf.identity(v), tf.no_op())})


class _ClipEachWorker(tf1.train.GradientDescentOptimizer):
    """Its own compute_gradients: each worker clips its gradient of w before the push."""

    def compute_gradients(self, *args, **kwargs):
        return [(tf.clip_by_value(g, -1.0, 1.0), v)
                for g, v in super().compute_gradients(*args, **kwargs)]


def _model(**params) -> sm.Model:
    return sm.Model(_two_scalars, _data, _data, params={"dnn": "momentum", **params})


def _batch_mean(worker: int, step: int) -> np.ndarray:
    """Worker `worker`'s batch mean of both features at `step`: its gradients of w and v."""
    features, labels = _data({})
    shard = Shard(features, labels, index=worker, num_workers=2, batch_size=BATCH, seed=SEED)
    return shard.batch(step)[0].mean(axis=0, dtype=np.float32)


def _expected_sync(applies_w: int = 1, applies_v: int = 1, clip: bool = False
                   ) -> tuple[np.float32, np.float32]:
    """(w, v) after STEPS updates of 2 workers, each update applying GradientDescent to w and
    Momentum to v `applies_*` times (once, as it should) on the mean of the two gradients
    (of w, with `clip`, each clipped to [-1, 1] by its worker)."""
    w = v = accumulation = np.float32(0)
    for step in range(STEPS):
        g = np.mean([_batch_mean(i, step) for i in range(2)], axis=0, dtype=np.float32)
        g_w = np.mean([np.clip(_batch_mean(i, step)[0], -1, 1) for i in range(2)],
                      dtype=np.float32) if clip else g[0]
        for _ in range(applies_w):
            w -= np.float32(LR_W) * g_w
        for _ in range(applies_v):
            accumulation = np.float32(MOMENTUM) * accumulation + g[1]
            v -= np.float32(LR_V) * accumulation
    return w, v


@pytest.mark.parametrize("clip", [False, True])
def test_each_update_applies_each_optimizer_once_to_the_mean_of_one_gradient_per_worker(clip):
    """With `clip`, w's optimizer has a compute_gradients of its own: each worker runs it on
    w alone, and v's gradient comes from v's (the stock one)."""
    # What an update that applied one optimizer twice, or skipped one, would give instead.
    expected = _expected_sync(clip=clip)
    for wrong in [(2, 1), (1, 2), (0, 1), (1, 0), (1, 1, not clip)]:
        w, v = _expected_sync(*wrong)
        assert w != expected[0] or v != expected[1], wrong
    run = run_cluster(2, _model(clip=clip), num_ps=2, train_steps=STEPS, batch_size=BATCH,
                      seed=SEED)
    chief = run.chief
    assert chief.synchronous is True, chief.verdict
    assert chief.verdict.startswith(f"synchronous: each of {STEPS} updates averaged exactly "
                                    "one gradient from each of 2 workers")
    assert (chief.global_step, chief.contributions, chief.pushed) == (
        STEPS, [STEPS, STEPS], [STEPS, STEPS])
    assert (chief.repeat_updates, chief.solo_updates) == (0, 0)
    assert (chief.test_metrics["w"], chief.test_metrics["v"]) == expected


def test_async_every_push_applies_each_optimizer_once_and_moves_global_step_once():
    """--mode async: each push of each worker is an update of its own, through both optimizers
    (plain gradient descent at two rates: the order of the pushes does not matter)."""
    run = run_cluster(2, _model(dnn="sgd"), train_steps=STEPS, batch_size=BATCH, seed=SEED,
                      mode="async")
    assert run.chief.global_step == 2 * STEPS  # not 4 x: ByScope moved it once per push
    assert run.chief.contributions == [STEPS, STEPS]
    # Each worker's batches follow its local step from where it joined (global_step then).
    pushed = np.sum([_batch_mean(i, worker.start_step + step) for i, worker in
                     enumerate(run.workers) for step in range(STEPS)], axis=0, dtype=np.float32)
    assert np.all(pushed > 0)
    assert run.chief.test_metrics["w"] == -np.float32(LR_W) * pushed[0]
    assert run.chief.test_metrics["v"] == -np.float32(LR_V) * pushed[1]


# ------------------------------------------------------------------------------ the contract


def _refused(model: sm.Model) -> str:
    """The line of the ContractError that building a worker's graph of `model` raises."""
    with pytest.raises(sm.ContractError) as raised:
        _built(model)
    assert isinstance(raised.value, ConfigError)  # bad input: exit 2
    return str(raised.value)


def _built(model: sm.Model, num_ps: int = 1):
    ps = tuple(f"p{p}:1" for p in range(num_ps))
    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(ps, ("w0:1", "w1:1")),
                        train=TrainConfig(train_steps=1, batch_size=BATCH))
    return prepared_graph(config, model)


def test_a_variable_under_no_scope_is_refused_naming_it_and_the_scopes():
    assert _refused(_model(scopes=["linear/"])) == (
        "ModelSpec: the trainable variable dnn/v is under none of the optimizer scopes "
        "(linear): every trainable variable needs exactly one")


def test_a_scope_with_no_variable_is_refused_naming_it():
    def model_fn(features, labels, mode, params):
        spec = _two_scalars(features, labels, mode, {"dnn": "sgd"})
        if mode != sm.ModeKeys.TRAIN:
            return spec
        return sm.ModelSpec(mode, loss=spec.loss, optimizer={
            **spec.optimizer, "wide": tf1.train.FtrlOptimizer(0.1)})

    assert _refused(sm.Model(model_fn, _data, _data)) == (
        "ModelSpec: the optimizer for scope 'wide' has no trainable variable under it "
        "(the scopes: dnn, linear, wide)")


@pytest.mark.parametrize("scopes", [("dnn", "dnn/hidden"), ("dnn/hidden/", "dnn"),
                                    ("dnn", "dnn/")])
def test_a_variable_under_two_scopes_is_refused_where_the_spec_is_made(scopes):
    """Scopes one inside another would give the inner one's variables two optimizers: refused
    on construction, naming both, before any variable exists."""
    with pytest.raises(sm.ContractError) as raised:
        sm.ModelSpec(sm.ModeKeys.TRAIN, loss=tf.constant(0.0), optimizer={
            s: tf1.train.GradientDescentOptimizer(0.1) for s in scopes})
    assert str(raised.value) == (
        f"ModelSpec: optimizer scopes {scopes[0]!r} and {scopes[1]!r} overlap: a variable "
        "under both would have two optimizers; give each variable one")


@pytest.mark.parametrize("optimizer, line", [
    ({}, "ModelSpec: optimizer is an empty dict: give one optimizer, or one per variable "
         "scope, or None for --optimizer"),
    ({"": tf1.train.GradientDescentOptimizer(0.1)},
     "ModelSpec: optimizer['']: a key must be a variable scope's name, such as 'linear' or "
     "'dnn/'"),
    ({"dnn": "adagrad"},
     "ModelSpec: optimizer['dnn'] must be a tf.compat.v1.train.Optimizer, got str"),
])
def test_a_malformed_dict_of_optimizers_is_refused(optimizer, line):
    with pytest.raises(sm.ContractError) as raised:
        sm.ModelSpec(sm.ModeKeys.TRAIN, loss=tf.constant(0.0), optimizer=optimizer)
    assert str(raised.value) == line


# ----------------------------------------------- the sparse path: FTRL on a table, Adagrad
# Each worker's batch is one id and one feature; the table's rows under FTRL, w under
# Adagrad, both from their defaults (initial accumulator 0.1, no regularisation).
IDS = np.array([[0], [1], [1], [2], [3], [3], [1], [0]], np.int64)  # row 4: never looked up
TABLE_ROWS, LR_TABLE, LR_DENSE = 5, 0.5, 0.25


def _ids_data(params):
    x = np.arange(len(IDS), dtype=np.float32)[:, None] - 3
    return {"ids": IDS, "x": x}, np.zeros(len(IDS), np.float32)


def _wide_and_deep(features, labels, mode, params):
    with tf1.variable_scope("linear"):
        table = tf1.get_variable("table", [TABLE_ROWS, 1], initializer=tf1.zeros_initializer())
    with tf1.variable_scope("dnn"):
        w = tf1.get_variable("w", [1], initializer=tf1.zeros_initializer())
    looked_up = tf.nn.embedding_lookup(table, tf.reshape(features["ids"], [-1]))
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"row": looked_up})
    # d loss / d row r: r's count in the batch over its size; d loss / d w: the mean x.
    loss = (tf.reduce_mean(looked_up) + tf.reduce_mean(features["x"][:, 0]) * w[0]
            + 0 * tf.reduce_mean(labels))
    return sm.ModelSpec(mode, loss=loss, optimizer={
        "linear": tf1.train.FtrlOptimizer(LR_TABLE), "dnn": tf1.train.AdagradOptimizer(LR_DENSE)})


WIDE_AND_DEEP = sm.Model(_wide_and_deep, _ids_data, _ids_data)


def _expected_wide_and_deep(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(table, w) after `steps` updates of 2 workers, batch 1: TensorFlow's FTRL (learning
    rate power -0.5, no l1 or l2) and Adagrad, on the mean of the two workers' gradients."""
    features, labels = _ids_data({})
    shards = [Shard(features, labels, index=i, num_workers=2, batch_size=1, seed=SEED)
              for i in range(2)]
    table, accum, linear = np.zeros(TABLE_ROWS), np.full(TABLE_ROWS, 0.1), np.zeros(TABLE_ROWS)
    w, w_accum = 0.0, 0.1
    for step in range(steps):
        batches = [shard.batch(step)[0] for shard in shards]
        g = np.bincount([b["ids"][0, 0] for b in batches], minlength=TABLE_ROWS) / 2.0
        new_accum = accum + g * g
        linear += g - (np.sqrt(new_accum) - np.sqrt(accum)) / LR_TABLE * table
        table, accum = -linear / (np.sqrt(new_accum) / LR_TABLE), new_accum
        g_w = np.mean([b["x"][0, 0] for b in batches])
        w_accum += g_w * g_w
        w -= LR_DENSE * g_w / np.sqrt(w_accum)
    return table, np.array([w])


def _exported(export_dir) -> dict[str, np.ndarray]:
    with tf.Graph().as_default(), tf1.Session() as sess:
        tf1.saved_model.loader.load(sess, [tf1.saved_model.SERVING], str(export_dir))
        return {v.op.name: sess.run(v) for v in tf1.global_variables()}


def test_ftrl_on_a_sparse_table_and_adagrad_resume_across_the_number_of_ps(tmp_path):
    """3 updates on 2 ps, the checkpoint resumed on 1 ps for 3 more: FTRL's two slots and
    Adagrad's accumulator were saved whole and restored, so the 6 are the formulas' 6."""
    logdir = tmp_path / "logdir"
    first = run_cluster(2, WIDE_AND_DEEP, num_ps=2, train_steps=3, batch_size=1, seed=SEED,
                        logdir=logdir, export_dir=tmp_path / "at_3")
    assert first.chief.synchronous is True, first.chief.verdict
    saved = {name for name, _ in tf.train.list_variables(str(logdir))}
    assert {"linear/table/Ftrl", "linear/table/Ftrl_1", "dnn/w/Adagrad"} <= saved
    resumed = run_cluster(2, WIDE_AND_DEEP, num_ps=1, train_steps=6, batch_size=1, seed=SEED,
                          logdir=logdir, export_dir=tmp_path / "at_6")
    assert resumed.chief.start_step == 3
    assert resumed.chief.synchronous is True, resumed.chief.verdict
    for steps, run in [(3, "at_3"), (6, "at_6")]:
        table, w = _expected_wide_and_deep(steps)
        values = _exported(tmp_path / run)
        # float32 against float64: Adagrad's rsqrt is not exactly 1 / sqrt.
        np.testing.assert_allclose(values["linear/table"][:, 0], table, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(values["dnn/w"], w, rtol=1e-5, atol=1e-7)
        assert values["linear/table"][4, 0] == 0.0  # never looked up: never touched


def test_each_slot_lives_beside_its_variable_on_its_ps():
    """Placement (placement.py) cuts the table over 2 ps; FTRL's slots of each slice and
    Adagrad's of w are made where that slice or w lives."""
    built = _built(WIDE_AND_DEEP, num_ps=2)
    optimizer = built.g.training.optimizer
    with built.graph.as_default():
        trainable = tf1.trainable_variables()
    slots = [(v, optimizer.get_slot(v, name)) for v in trainable
             for name in optimizer.get_slot_names()]
    placed = sorted((s.op.name, s.device) for v, s in slots if s is not None)
    assert [name for name, _ in placed] == [
        "dnn/w/Adagrad", "linear/table/part_0/Ftrl", "linear/table/part_0/Ftrl_1",
        "linear/table/part_1/Ftrl", "linear/table/part_1/Ftrl_1"]
    assert all(s.device == v.device for v, s in slots if s is not None)
    assert {v.device for v in trainable} == {"/job:ps/task:0", "/job:ps/task:1"}
