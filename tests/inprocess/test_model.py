"""The pure graph builders: shapes, dtypes, initial scale, and that the model learns.

Each test builds in a fresh tf.Graph() with no cluster (graph mode is on: see conftest.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.core import optimizers
from sync_mnist.models import mlp, mnist

import mlp_graph
from mlp_graph import EXAMPLE

tf1 = tf.compat.v1

LAYER_SHAPES = [[784, 256], [256], [256, 256], [256], [256, 10], [10]]


class _Outputs(NamedTuple):
    logits: tf.Tensor
    loss: tf.Tensor
    accuracy: tf.Tensor


def _build(seed: int = 0):
    """The MLP's logits, and its TRAIN spec's loss and accuracy, on uint8 pixels."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.uint8, [None, mnist.IMAGE_PIXELS])
        labels = tf1.placeholder(tf.int64, [None])
        logits = mlp.logits(mnist.pixels(images))
        spec = mnist.classify(logits, labels, sm.ModeKeys.TRAIN, sm)
    return graph, images, labels, _Outputs(logits, spec.loss, spec.train_metrics["accuracy"])


def _batch(size: int = 20):
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, (size, mnist.IMAGE_PIXELS)).astype(np.uint8)
    labels = (np.arange(size) % mnist.NUM_CLASSES).astype(np.int64)
    return images, labels


def test_outputs_have_the_documented_shapes_and_dtypes():
    _, _, _, outputs = _build()
    assert outputs.logits.shape.as_list() == [None, 10]
    assert outputs.logits.dtype == tf.float32
    for scalar in (outputs.loss, outputs.accuracy):
        assert scalar.shape.as_list() == []
        assert scalar.dtype == tf.float32


def test_model_has_three_layers_of_weights_and_biases():
    graph, _, _, _ = _build()
    with graph.as_default():
        variables = tf1.trainable_variables()
    assert [v.shape.as_list() for v in variables] == LAYER_SHAPES
    assert [v.op.name for v in variables] == [
        f"layer{i}/{kind}" for i in range(3) for kind in ("weights", "biases")]


def test_glorot_init_keeps_weights_small_and_biases_zero():
    graph, _, _, _ = _build()
    with graph.as_default():
        variables = tf1.trainable_variables()
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        values = sess.run(variables)
    for weights, (fan_in, fan_out) in zip(values[0::2], [(784, 256), (256, 256), (256, 10)]):
        # Glorot uniform: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)), so std = a / sqrt(3).
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        assert np.abs(weights).max() <= limit
        assert weights.std() == pytest.approx(limit / np.sqrt(3.0), rel=0.1)
        assert weights.std() < 0.2  # far below the question's random_normal(stddev=1)
    for biases in values[1::2]:
        assert not biases.any()


def test_a_few_sgd_steps_on_a_fixed_batch_reduce_the_loss():
    graph, images, labels, outputs = _build()
    with graph.as_default():
        train = optimizers.make_optimizer("sgd", 0.05).minimize(outputs.loss)
        init = tf1.global_variables_initializer()
    feed = dict(zip((images, labels), _batch()))
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        first_loss, first_accuracy = sess.run([outputs.loss, outputs.accuracy], feed)
        losses = [first_loss]
        for _ in range(12):
            sess.run(train, feed)
            losses.append(sess.run(outputs.loss, feed))
        last_accuracy = sess.run(outputs.accuracy, feed)
    # 10 classes at random: the loss starts near ln 10 ~ 2.3, then 20 examples are memorised.
    assert first_loss == pytest.approx(np.log(10.0), abs=0.5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.5 * first_loss
    assert first_accuracy < 0.5
    assert last_accuracy == 1.0


def test_loss_and_accuracy_are_the_batch_means():
    graph, images, labels, outputs = _build()
    x, y = _batch(7)
    with graph.as_default():
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        logits, loss, accuracy = sess.run(outputs, {images: x, labels: y})
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    assert loss == pytest.approx(-log_softmax[np.arange(7), y].mean(), rel=1e-5)
    assert accuracy == pytest.approx((logits.argmax(axis=1) == y).mean())


# Two steps on x = 0 with the constant gradient 2 and learning rate 0.5:
#   sgd:      x -= 0.5 * 2 twice                                  -> -2.0
#   momentum: v = 2, x = -1; then v = 0.9 * 2 + 2 = 3.8, x -= 1.9 -> -2.9
#   adam:     a constant gradient normalises to 1, so x -= 0.5 twice -> -1.0
@pytest.mark.parametrize("name, cls, after_two_steps", [
    ("sgd", tf1.train.GradientDescentOptimizer, -2.0),
    ("momentum", tf1.train.MomentumOptimizer, -2.9),
    ("adam", tf1.train.AdamOptimizer, -1.0),
])
def test_make_optimizer_builds_the_named_optimizer(name, cls, after_two_steps):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.get_variable("x", initializer=0.0)
        optimizer = optimizers.make_optimizer(name, 0.5)
        step = optimizer.minimize(2.0 * x)
        init = tf1.global_variables_initializer()
    assert isinstance(optimizer, cls)
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(step)
        sess.run(step)
        assert sess.run(x) == pytest.approx(after_two_steps, abs=1e-5)


def test_make_optimizer_rejects_an_unknown_name():
    with pytest.raises(ValueError) as raised:
        optimizers.make_optimizer("rmsprop", 0.1)
    assert str(raised.value) == "unknown optimizer 'rmsprop'"


def test_cosine_decay_falls_from_the_rate_to_zero_over_the_run():
    # SGD on x with the constant gradient 2, rate 0.5, decayed over 4 global steps: the steps
    # use 0.5 * (1 + cos(pi * k / 4)) / 2 for k = 0..3, then 0 from k = 4 on.
    rates = [0.5 * (1 + np.cos(np.pi * k / 4)) / 2 for k in range(4)]
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.get_variable("x", initializer=0.0)
        global_step = tf1.train.get_or_create_global_step()
        step = optimizers.make_optimizer("sgd", 0.5, decay_steps=4, global_step=global_step
                                    ).minimize(2.0 * x, global_step=global_step)
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for k in range(6):
            sess.run(step)
            assert sess.run(x) == pytest.approx(-2 * sum(rates[:k + 1]), abs=1e-6), k


MODEL_BYTES = 4 * sum(int(np.prod(shape)) for shape in LAYER_SHAPES)  # 1,077,288


def _placement(num_ps: int, index: int) -> dict[str, tuple[str, int]]:
    """{variable: (device, bytes)} in worker `index`'s graph of a cluster with num_ps ps."""
    from sync_mnist.core.cluster import ClusterLayout
    from sync_mnist.core.config import TaskConfig, TrainConfig

    config = TaskConfig(role="worker", index=index,
                        cluster=ClusterLayout(tuple(f"p{p}:1" for p in range(num_ps)),
                                              ("w0:1", "w1:1", "w2:1")),
                        train=TrainConfig(train_steps=1))
    with tf.Graph().as_default():
        mlp_graph.build_graph(config)
        return {v.op.name: (v.device, v.shape.num_elements() * v.dtype.size)
                for v in tf1.global_variables()}


@pytest.mark.parametrize("num_ps", [2, 3, 4, 8])
def test_the_ps_tasks_share_the_models_bytes_evenly(num_ps):
    chief = _placement(num_ps, 0)
    trainable = {name: (device, size) for name, (device, size) in chief.items()
                 if name.startswith("layer") and "/Adam" not in name}
    per_ps = [0] * num_ps
    for device, size in trainable.values():
        per_ps[tf.DeviceSpec.from_string(device).task] += size
    # Every byte of the model once, and what each worker pulls from and pushes to each ps
    # within 2% of an even share (round-robin over whole variables: 1,075,200 + 2,088 at 2 ps).
    assert sum(per_ps) == MODEL_BYTES
    even = MODEL_BYTES / num_ps
    assert max(abs(b - even) for b in per_ps) <= 0.02 * even, per_ps
    # Adam's slots stay with their slice, so the update is split as evenly.
    for name, (device, _) in chief.items():
        if "/Adam" in name:
            assert device == chief[name.split("/Adam")[0]][0], name
    # Deterministic: another worker's graph places every variable where the chief's does.
    assert _placement(num_ps, 2) == chief




def test_the_update_runs_on_the_ps_alone_and_the_sync_state_on_ps_0():
    from sync_mnist.core.cluster import ClusterLayout
    from sync_mnist.core.config import TaskConfig, TrainConfig

    config = TaskConfig(role="worker", index=0,
                        cluster=ClusterLayout(("p0:1", "p1:1"), ("w0:1", "w1:1")),
                        train=TrainConfig(train_steps=10))
    with tf.Graph().as_default():
        g = mlp_graph.build_graph(config, target=10)
        shared = {v.op.name: v.device for v in tf1.global_variables()
                  if v.op.name == "global_step" or v.op.name.startswith("sync_")}
        (update,) = g.training.optimizer.get_chief_queue_runner().enqueue_ops
    # Everything the counting, the progress lines and the finish read is on one ps, so none of
    # it costs a run on each ps; a round-robin dealt the counters over both.
    # (14 since the stop's fifth scalar, input_ended_at: core/stream.py; 15 with the workers'
    # reading plans, membership.py; 16 with their input positions, stream.py.)
    assert len(shared) == 16 and set(shared.values()) == {"/job:ps/task:0"}, shared
    # The chief's update (with the cosine rate) needs nothing from the chief's own device.
    on_workers = {op.name for op in _ancestors(update) if "/job:worker" in op.device}
    assert on_workers == set(), sorted(on_workers)


def _worker_graph(num_ps: int):
    """(graph, the chief's update op) of worker 0 of 2 workers and num_ps ps."""
    from sync_mnist.core.cluster import ClusterLayout
    from sync_mnist.core.config import TaskConfig, TrainConfig

    config = TaskConfig(role="worker", index=0, train=TrainConfig(train_steps=10),
                        cluster=ClusterLayout(tuple(f"p{p}:1" for p in range(num_ps)),
                                              ("w0:1", "w1:1")))
    graph = tf.Graph()
    with graph.as_default():
        g = mlp_graph.build_graph(config, target=10)
        (update,) = g.training.optimizer.get_chief_queue_runner().enqueue_ops
    return graph, update


def _task(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.job} {spec.task}"


@pytest.mark.parametrize("num_ps", [1, 2, 4])
def test_a_step_moves_one_tensor_of_the_model_each_way_between_the_worker_and_each_ps(num_ps):
    """Every transfer costs both tasks an RPC: each ps packs its slices into one pull, and the
    worker its gradients into one push for each ps (a step made 6 of each per ps)."""
    graph, _ = _worker_graph(num_ps)
    crossing = {}  # (sender, receiver): float tensors made on one task and used on the other
    for op in graph.get_operations():
        for t in op.inputs:
            if t.dtype in (tf.float32, tf.bfloat16) and op.device and t.op.device \
                    and _task(t.op.device) != _task(op.device):
                crossing.setdefault((_task(t.op.device), _task(op.device)), set()).add(t.name)
    pushes = {f"ps {p}": len(crossing.get(("worker 0", f"ps {p}"), ())) for p in range(num_ps)}
    pulls = {f"ps {p}": len(crossing.get((f"ps {p}", "worker 0"), ())) for p in range(num_ps)}
    assert pushes == pulls == {f"ps {p}": 1 for p in range(num_ps)}, crossing


@pytest.mark.parametrize("num_ps", [2, 4])
def test_an_update_sends_each_other_ps_one_tensor_from_ps_0(num_ps):
    """Adam's beta powers and the decaying rate live on ps 0 (beside global_step). The stock
    update sent each other ps six tensors from there in every update (the two powers, the
    rate, beta1, beta2, epsilon), each an RPC of its own; and before the powers were read
    once, twelve more."""
    graph, update = _worker_graph(num_ps)

    def placed(op: tf.Operation) -> str:
        # A colocated op has no device of its own, nor has a read of a resource variable:
        # the placer puts each with its colocation group, or its resource.
        while not op.device:
            (group,) = op.colocation_groups()
            target = graph.get_operation_by_name(group.decode()[len("loc:@"):])
            if target is op:
                assert op.type == "ReadVariableOp", f"{op.name} ({op.type}) is not placed"
                target = op.inputs[0].op
            op = target
        return _task(op.device)

    sent, witnessed = {}, {}  # ps: the tensors made on ps 0 that the update uses there
    for op in _ancestors(update) | {update}:
        for t in op.inputs:
            if placed(t.op) == "ps 0" and placed(op) != "ps 0":
                # Besides, each ps's part waits for ps 0's new step (sync._witnesses).
                into = witnessed if op.name.startswith("update_witness") else sent
                into.setdefault(placed(op), set()).add(t.name)
    assert {ps: len(names) for ps, names in sent.items()} == {
        f"ps {p}": 1 for p in range(1, num_ps)}, sent
    assert {ps: len(names) for ps, names in witnessed.items()} == {
        f"ps {p}": 1 for p in range(1, num_ps)}, witnessed


def _ancestors(op: tf.Operation) -> set[tf.Operation]:
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def test_the_cnns_moving_statistics_move_in_the_update_and_not_in_a_step():
    from sync_mnist.core import audit
    from sync_mnist.core.cluster import ClusterLayout
    from sync_mnist.core.config import TaskConfig, TrainConfig
    from sync_mnist.models import cnn

    config = TaskConfig(role="worker", index=0, train=TrainConfig(train_steps=10),
                        cluster=ClusterLayout(("p0:1", "p1:1"), ("w0:1", "w1:1")))
    with tf.Graph().as_default() as graph:
        g = worker_graph(config, cnn.MODEL)
        (update,) = g.training.optimizer.get_chief_queue_runner().enqueue_ops
        moving = {v.op.name for v in tf1.global_variables() if "moving_" in v.op.name}
        step_writes = {audit.written(op) for op in audit.closure([g.training.train_op])
                       if audit.is_write(op)}
        update_writes = {audit.written(op) for op in audit.closure([update])
                         if audit.is_write(op)}
        deltas = [op for op in graph.get_operations() if op.name.endswith("/sync_delta")]
    # Three batch norms (two convolutions, the dense layer), a mean and a variance each.
    assert len(moving) == 6 and len(deltas) == 6
    assert moving <= update_writes  # the chief's update moves them, once
    assert not moving & step_writes  # a worker's step never does


def worker_graph(config, model):
    from sync_mnist.task.graph import build_graph

    return build_graph(config, model, EXAMPLE, target=10)


@pytest.mark.parametrize("own_optimizer", [False, True])
def test_the_cosine_warning_of_a_run_of_unknown_length_is_for_the_command_line_s_optimizer(
        own_optimizer, caplog):
    """--lr-decay cosine over a stream with --epochs: the optimizer the flags make cannot decay
    (the length is unknown), and says so; a model's own optimizer the flags never touch."""
    import dataclasses

    from sync_mnist.core import stream
    from sync_mnist.core.cluster import ClusterLayout
    from sync_mnist.core.config import TaskConfig, TrainConfig
    from sync_mnist.task.graph import build_graph

    def model_fn(features, labels, mode, params):
        spec = mlp.MODEL.model_fn(features, labels, mode, params)
        return dataclasses.replace(spec, optimizer=tf1.train.AdamOptimizer(0.001)) \
            if own_optimizer else spec

    config = TaskConfig(role="worker", index=0, train=TrainConfig(epochs=1, lr_decay="cosine"),
                        cluster=ClusterLayout(("p0:1",), ("w0:1", "w1:1")))
    with tf.Graph().as_default():
        build_graph(config, dataclasses.replace(mlp.MODEL, model_fn=model_fn), EXAMPLE,
                    target=stream.UNTIL_INPUT_ENDS)
    warned = [r for r in caplog.records if "--lr-decay cosine needs the run's length" in
              r.getMessage()]
    assert len(warned) == (0 if own_optimizer else 1)


def test_count_examples_of_a_feature_the_data_has_not_names_what_it_has():
    from sync_mnist.core.cluster import ClusterLayout
    from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig
    from sync_mnist.task.graph import build_graph

    config = TaskConfig(role="worker", index=0, train=TrainConfig(epochs=1, count_examples="id"),
                        cluster=ClusterLayout(("p0:1",), ("w0:1", "w1:1")))
    with tf.Graph().as_default(), pytest.raises(ConfigError) as raised:
        build_graph(config, mlp.MODEL, EXAMPLE, target=10)
    assert str(raised.value) == ("--count-examples id: the training data has no feature 'id' "
                                 "(its features: one array, unnamed)")
