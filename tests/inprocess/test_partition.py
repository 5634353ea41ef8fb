"""K ps share the model: a checkpoint restores with another number of ps, the export is the same
whatever the number, and --wire-dtype bfloat16 halves the bytes of every pull and push.

In-process clusters (procs.local_cluster), one chief worker each, its graph built by
build_graph and its session by sessions.monitored_session, as a task builds them; the
placement itself is checked without a cluster in test_model.py.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from procs import local_cluster
import mlp_graph
from sync_mnist.core.shard import Shard
from sync_mnist.models import data
from sync_mnist.task import evaluation, export
from sync_mnist.task.inputs import model_params
from sync_mnist.core import placement, checkpoints, sessions
from sync_mnist.models import mlp
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import TaskConfig, TrainConfig
from sync_mnist.bench.profiling import wire_bytes

tf1 = tf.compat.v1
TIMEOUT_MS = 30_000
MODEL_BYTES = 1_077_288  # 269,322 float32 parameters


class _Chief:
    """Worker 0 of a 1-worker cluster with `num_ps` ps, whose chief keeps `logdir`."""

    def __init__(self, num_ps: int, logdir=None, wire_dtype: str = "float32"):
        self.servers, spec = servers, _ = local_cluster(1, num_ps)
        hosts = spec.as_dict()
        layout = ClusterLayout(tuple(hosts["ps"]), tuple(hosts["worker"]))
        self.config = TaskConfig(role="worker", index=0, cluster=layout, train=TrainConfig(
            train_steps=100, params={"dataset": "synthetic"}, logdir=logdir,
            wire_dtype=wire_dtype))
        dataset = data.make_synthetic(0)
        self.shard = Shard(dataset.train_images, dataset.train_labels, index=0,
                                num_workers=1, batch_size=100, seed=0)
        self.graph = tf.Graph()
        self.status = sessions.SessionStatus()
        with self.graph.as_default():
            tf1.set_random_seed(num_ps)  # another start for each K: only a restore equals them
            self.g = mlp_graph.build_graph(self.config, target=100)
            self.kept = [v for v in tf1.global_variables()
                         if all(v is not t for t in self.g.transient)]
            if logdir:  # as prepare.make_graph checks it
                checkpoints.check_checkpoint(logdir, self.kept)
            self.sess = sessions.monitored_session(
                servers[0].target, is_chief=True, hooks=self.g.training.hooks,
                config=sessions.session_config(layout.device_filters("worker", 0)), timeout=30,
                checkpoint_dir=str(logdir) if logdir else None, save_steps=10**6,
                transient=self.g.transient, status=self.status)
        self.options = tf1.RunOptions(timeout_in_ms=TIMEOUT_MS)

    def step(self, options=None, run_metadata=None) -> int:
        token = int(self.sess.run(self.g.training.train_op, self._feed(),
                                  options=options or self.options, run_metadata=run_metadata))
        self.token = token
        return token

    def _feed(self):
        x, y = self.shard.batch(getattr(self, "token", 0))
        return self.g.feed(x, y)

    def values(self) -> dict[str, np.ndarray]:
        """Every checkpointed variable, whole: the model, Adam's slots, global_step."""
        wholes = placement.whole_variables(self.kept)
        read = self.sess.run({name: w.slices for name, w in wholes.items()},
                             options=self.options)
        return {name: parts[0] if len(parts) == 1 else np.concatenate(parts)
                for name, parts in read.items()}

    def export(self, export_dir) -> None:
        params = model_params(self.config, mlp.MODEL)
        export.write_saved_model(mlp.MODEL, params, mlp_graph.EXAMPLE, self.weights(), export_dir)

    def weights(self) -> dict[str, np.ndarray]:
        """The model's variables as the export reads them from the ps."""
        params = model_params(self.config, mlp.MODEL)
        return export.read_weights(
            lambda fetches: self.sess.run(fetches, options=self.options), self.graph,
            export.variable_names(mlp.MODEL, params, mlp_graph.EXAMPLE))

    def evaluate(self, x, y) -> float:
        """The chief's evaluation loss of the batch (evaluation.Evaluator)."""
        evaluator = evaluation.Evaluator(
            mlp.MODEL, model_params(self.config, mlp.MODEL), num_ps=self.config.cluster.num_ps, worker="/job:worker/task:0",
            target=self.servers[0].target,
            tf_config=sessions.session_config(self.config.cluster.device_filters("worker", 0)),
            ps_hosts=())
        try:
            return evaluator(x, y, self.options)[1]
        finally:
            evaluator.close()

    def close(self) -> None:
        self.sess.close()  # the chief's CheckpointSaverHook saves at the end


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """One logdir, three clusters in turn: 1 ps trains 3 updates; 2 ps resume and train 2 more;
    1 ps resumes again. What each saw, and the SavedModel of the first two at update 3."""
    tmp = tmp_path_factory.mktemp("resumed")
    logdir, run = tmp / "logdir", types.SimpleNamespace(exports=tmp)
    one = _Chief(1, logdir)
    try:
        run.first_model = one.status.model
        run.first_tokens = [one.step() for _ in range(3)]
        run.one_at_3 = one.values()
        one.export(tmp / "one_ps")
    finally:
        one.close()
    two = _Chief(2, logdir)
    try:
        run.two_model = two.status.model
        run.two_at_3 = two.values()
        two.export(tmp / "two_ps")
        run.two_tokens = [two.step() for _ in range(2)]
        run.two_at_5 = two.values()
    finally:
        two.close()
    again = _Chief(1, logdir)
    try:
        run.again_model = again.status.model
        run.again_at_5 = again.values()
        run.again_tokens = [again.step()]
    finally:
        again.close()
    return run


def _assert_same(restored: dict, saved: dict) -> None:
    assert sorted(restored) == sorted(saved)
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_a_checkpoint_of_one_ps_restores_into_two(resumed):
    assert (resumed.first_model, resumed.first_tokens) == ("initialised", [1, 2, 3])
    assert resumed.two_model == "restored"
    # Each sliced variable restored whole from the unsliced one, slots and all, and trains on.
    assert {"layer0/weights", "layer0/weights/Adam", "beta1_power", "global_step"} <= set(
        resumed.one_at_3)
    _assert_same(resumed.two_at_3, resumed.one_at_3)
    assert resumed.two_tokens == [4, 5]


def test_a_checkpoint_of_two_ps_restores_into_one(resumed):
    assert resumed.again_model == "restored"
    _assert_same(resumed.again_at_5, resumed.two_at_5)
    assert not np.array_equal(resumed.two_at_5["layer0/weights"],
                              resumed.one_at_3["layer0/weights"])  # it did train in between
    assert resumed.again_tokens == [6]


def test_the_export_is_the_same_whatever_the_number_of_ps(resumed):
    one, two = resumed.exports / "one_ps", resumed.exports / "two_ps"
    assert (one / "saved_model.pb").read_bytes() == (two / "saved_model.pb").read_bytes()
    names = sorted(name for name, _ in tf.train.list_variables(str(one / "variables" /
                                                                   "variables")))
    assert names == sorted(export.variable_names(mlp.MODEL, mlp.MODEL.params,
                                                 mlp_graph.EXAMPLE))  # whole: no part_0, _1
    for name in names:
        values = [tf.train.load_variable(str(d / "variables" / "variables"), name)
                  for d in (one, two)]
        np.testing.assert_array_equal(values[0], values[1], err_msg=name)
        np.testing.assert_array_equal(values[0], resumed.one_at_3[name], err_msg=name)


TRACED_STEPS = 6  # wire_bytes takes each tensor's size from any run that recorded it


WIRE_DTYPES = ("float32", "bfloat16")


@pytest.fixture(scope="module")
def traced():
    """{wire dtype: RunMetadata of TRACED_STEPS steps of worker 0 of a 2-ps cluster, each with
    FULL_TRACE and its partition graphs}, after one untraced step (it registers the graphs)."""
    runs = {}
    for wire_dtype in WIRE_DTYPES:
        chief = _Chief(2, wire_dtype=wire_dtype)
        try:
            chief.step()
            runs[wire_dtype] = []
            for _ in range(TRACED_STEPS):
                runs[wire_dtype].append(tf1.RunMetadata())
                chief.step(tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE,
                                          output_partition_graphs=True,
                                          timeout_in_ms=TIMEOUT_MS), runs[wire_dtype][-1])
        finally:
            chief.close()
    return runs


def test_bfloat16_halves_the_bytes_of_every_pull_and_push_and_nothing_else(traced):
    pushed, pulled = {}, {}
    for wire_dtype, runs in traced.items():
        moved = wire_bytes(runs)
        pushed[wire_dtype] = [moved[("worker 0", f"ps {p}")] for p in range(2)]
        pulled[wire_dtype] = [moved[(f"ps {p}", "worker 0")] for p in range(2)]
    # float32: the whole gradient, and a few int64 scalars (the local step the accumulators
    # judge staleness by, the push's step for the counts); the pull: every weight and the token.
    assert MODEL_BYTES <= sum(pushed["float32"]) <= MODEL_BYTES + 64, pushed
    assert MODEL_BYTES <= sum(pulled["float32"]) <= MODEL_BYTES + 64, pulled
    # bfloat16: exactly half the model's bytes fewer each way; the scalars as they were.
    assert sum(pushed["float32"]) - sum(pushed["bfloat16"]) == MODEL_BYTES // 2, pushed
    assert sum(pulled["float32"]) - sum(pulled["bfloat16"]) == MODEL_BYTES // 2, pulled
    for traffic in (*pushed.values(), *pulled.values()):  # half of it to or from each ps
        assert abs(traffic[0] - traffic[1]) <= 0.02 * sum(traffic) / 2, (pushed, pulled)


def test_with_bfloat16_the_layers_train_on_rounded_weights_and_the_chief_evaluates_exact_ones():
    chief = _Chief(2, wire_dtype="bfloat16")
    try:
        for _ in range(3):
            chief.step()
        weights = chief.weights()
        feed = chief._feed()
        trained = chief.sess.run(chief.g.spec.loss, feed, options=chief.options)
        evaluated = chief.evaluate(feed[chief.g.features], feed[chief.g.labels])
    finally:
        chief.close()

    def loss(rounded: bool) -> float:  # the MLP in numpy, from the ps's float32 variables
        x = feed[chief.g.features].astype(np.float32) / 255
        for layer in range(3):
            w, b = (weights[f"layer{layer}/{n}"] for n in ("weights", "biases"))
            if rounded:
                w, b = (v.astype(tf.bfloat16.as_numpy_dtype).astype(np.float32) for v in (w, b))
            x = x @ w + b
            x = np.maximum(x, 0) if layer < 2 else x
        shifted = x - x.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(-log_p[np.arange(len(x)), feed[chief.g.labels]].mean())

    exact, rounded = loss(False), loss(True)
    assert abs(exact - rounded) > 1e-4 * abs(exact)  # the rounding is visible in the loss
    assert evaluated == pytest.approx(exact, rel=1e-5)
    assert trained == pytest.approx(rounded, rel=1e-5)


def _counts_wait_for_every_gradient(partition_graphs) -> tuple[int, dict]:
    """(gradient transfers worker -> ps, {count op: those it does not wait for}), followed
    across the partitions: a _Recv waits for its _Send on the other task."""
    def task(device):
        spec = tf.DeviceSpec.from_string(device)
        return spec.job, spec.task

    nodes, sends = {}, {}
    for graph in partition_graphs:
        for n in graph.node:
            nodes[task(n.device), n.name] = n
            if n.op == "_Send":
                sends[n.attr["tensor_name"].s.decode(), task(n.attr["recv_device"].s.decode())] = (
                    task(n.device), n.name)

    def inputs(key):
        found = [(key[0], i.lstrip("^").split(":")[0]) for i in nodes[key].input]
        if nodes[key].op == "_Recv":  # a fed tensor (images, labels) has no _Send
            found.append(sends.get((nodes[key].attr["tensor_name"].s.decode(), key[0])))
        return [k for k in found if k in nodes]

    def waits_for(key):
        seen, todo = set(), [key]
        while todo:
            for k in inputs(todo.pop()):
                if k not in seen:
                    seen.add(k)
                    todo.append(k)
        return seen

    def carries_data(recv):
        send = nodes[sends[recv[1].attr["tensor_name"].s.decode(), recv[0][0]]]  # from a worker
        source = nodes.get((task(send.device), send.input[0].lstrip("^").split(":")[0]))
        return not (source is not None and source.op == "Const" and "/ctrl_" in source.name)

    gradients = [k for k, n in nodes.items() if n.op == "_Recv" and k[0][0] == "ps"
                 and task(n.attr["send_device"].s.decode())[0] == "worker"
                 and n.attr["tensor_type"].type in (tf.float32.as_datatype_enum,
                                                    tf.bfloat16.as_datatype_enum)
                 and carries_data((k, n))]
    # The counts: pushed, the who-accumulator's push, last_push (sync.build_train_op).
    counts = [k for k, n in nodes.items() if n.op in ("ResourceScatterAdd", "ResourceScatterUpdate")
              or (n.op == "ResourceAccumulatorApplyGradient" and "sync_replicas" not in n.name)]
    assert len(counts) == 3, counts
    return len(gradients), {c: [g for g in gradients if g not in waits_for(c)] for c in counts}


@pytest.mark.parametrize("wire_dtype", WIRE_DTYPES)
def test_the_counts_wait_for_the_whole_gradient_to_reach_the_ps(traced, wire_dtype):
    """What lets a restarted worker trust pushed and last_push: in the partitions TensorFlow
    ran (after Grappler's rewrites), every count on ps 0 waits for every slice of the
    gradient to have arrived at its ps. A cast back fused into the copy broke it once."""
    transfers, missed = _counts_wait_for_every_gradient(traced[wire_dtype][0].partition_graphs)
    assert transfers == 2  # one packed gradient for each ps (sync.to_ps)
    assert missed == {c: [] for c in missed}


def test_a_chief_refuses_to_initialise_a_model_one_ps_of_which_kept_its_share():
    """ps 1 restarted empty while ps 0 kept its variables and the sync state beside them (the
    accumulators, the token queues): a chief started then, as a fresh process, once
    initialised over it, and the old pushes left on ps 0 joined the first update (chaos found
    one averaging two gradients of one worker). With no checkpoint it is ModelLost."""
    servers, spec = local_cluster(1, 2)
    hosts = spec.as_dict()
    layout = ClusterLayout(tuple(hosts["ps"]), tuple(hosts["worker"]))
    config = TaskConfig(role="worker", index=0, cluster=layout,
                        train=TrainConfig(train_steps=10, params={"dataset": "synthetic"}))
    graph = tf.Graph()
    with graph.as_default():
        g = mlp_graph.build_graph(config, target=10)
        on_ps0 = [v for v in tf1.global_variables() if v.device == "/job:ps/task:0"]
        assert 0 < len(on_ps0) < len(tf1.global_variables())
        with tf1.Session(servers[0].target) as sess:  # what ps 0 kept
            sess.run([v.initializer for v in on_ps0], options=tf1.RunOptions(
                timeout_in_ms=TIMEOUT_MS))
        with pytest.raises(sessions.ModelLost) as lost:
            sessions.monitored_session(
                servers[0].target, is_chief=True, hooks=g.training.hooks,
                config=sessions.session_config(layout.device_filters("worker", 0)), timeout=30,
                transient=g.transient, status=sessions.SessionStatus())
    assert str(lost.value).startswith("the ps was restarted and has lost the model, and there "
                                      "is no checkpoint to restore it from (give the chief "
                                      "--logdir); ")
    assert " variables are missing, such as layer0/weights/part_1" in str(lost.value)
