"""The trained model: the chief's SavedModel, and `sync-mnist evaluate` / `predict` on it.

The SavedModel is always loaded in a separate, clean TensorFlow 2 process that never imports
sync_mnist, as a user would load it (saved_models.py). A model trained on the complete MNIST
by a real cluster, and what its SavedModel scores, evaluates and predicts, is
tests/convergence/test_trained_mnist.py.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import mlp_graph
import sync_mnist.api as sm
from procs import local_cluster
from saved_models import clean_tf2, sync_mnist, write_png
from sync_mnist.task import cli, export, options, preflight
from sync_mnist.tools import inference
from sync_mnist.core import placement
from sync_mnist.models import mlp
from sync_mnist.core.config import ConfigError

tf1 = tf.compat.v1


# ------------------------------------------------------------------ export without a cluster

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A model trained a few steps with its variables on a ps, exported by the chief's code.

    Returns (model dir, probe images uint8 [8, 28, 28], the training graph's probabilities).
    """
    out = tmp_path_factory.mktemp("exported")
    (worker,), cluster = local_cluster(1)
    rng = np.random.default_rng(0)
    probe = rng.integers(0, 256, (8, 28, 28), dtype=np.uint8)
    with tf.Graph().as_default() as graph:
        with tf1.device(tf1.train.replica_device_setter(worker_device="/job:worker/task:0",
                                                        cluster=cluster)):
            images, labels = placement.placeholders(*mlp_graph.EXAMPLE)
            spec = placement.build(mlp.model_fn, images, labels, sm.ModeKeys.TRAIN,
                                   mlp.MODEL.params, num_ps=1).spec
            step = tf1.train.AdamOptimizer(0.01).minimize(spec.loss)
            with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
                probabilities = mlp.model_fn(images, None, sm.ModeKeys.PREDICT,
                                             mlp.MODEL.params).predictions["probabilities"]
        with tf1.Session(worker.target) as sess:
            sess.run(tf1.global_variables_initializer())
            for _ in range(5):
                sess.run(step, {images: rng.integers(0, 256, (20, 784), np.uint8),
                                labels: rng.integers(0, 10, 20)})
            weights = export.read_weights(sess.run, graph, _names())
            expected = sess.run(probabilities, {images: probe.reshape(8, -1)})
    # The variables really were on the ps: what the export must leave behind.
    assert all(v.device.startswith("/job:ps") for v in graph.get_collection("variables"))
    _write(weights, out / "model")
    return out / "model", probe, expected


def _names() -> list[str]:
    return export.variable_names(mlp.MODEL, mlp.MODEL.params, mlp_graph.EXAMPLE)


def _write(weights, export_dir) -> None:
    export.write_saved_model(mlp.MODEL, mlp.MODEL.params, mlp_graph.EXAMPLE, weights, export_dir)


def test_saved_model_holds_the_inference_graph_only_with_no_devices(exported):
    model_dir, _, _ = exported
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    (meta,) = saved.meta_graphs
    assert [n.device for n in meta.graph_def.node if n.device] == []
    ops = {n.op for n in meta.graph_def.node}
    assert not ops & {"ApplyAdam", "ResourceApplyAdam", "FIFOQueueV2", "QueueDequeueV2",
                      "ConditionalAccumulator", "SparseSoftmaxCrossEntropyWithLogits"}
    names = {name for name, _ in tf.train.list_variables(str(model_dir / "variables" /
                                                             "variables"))}
    assert names == set(_names())  # no slots, no global_step, no counters
    signature = meta.signature_def["serving_default"]
    assert set(signature.inputs) == {"images"} and set(signature.outputs) == {"probabilities",
                                                                              "classes"}
    dims = [d.size for d in signature.inputs["images"].tensor_shape.dim]
    assert dims == [-1, 28, 28]
    assert signature.inputs["images"].dtype == tf.uint8.as_datatype_enum


def test_clean_tf2_process_computes_what_the_training_graph_computed(exported, tmp_path):
    model_dir, probe, expected = exported
    out = clean_tf2(model_dir, probe, tmp_path)
    assert out["probabilities"].shape == (8, 10) and str(out["probabilities_dtype"]) == "float32"
    assert out["classes"].shape == (8,) and str(out["classes_dtype"]) == "int64"
    np.testing.assert_allclose(out["probabilities"], expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(out["classes"], expected.argmax(axis=1))


def test_a_second_export_replaces_the_first(exported, tmp_path):
    model_dir, probe, expected = exported
    weights = {name: np.zeros(shape, np.float32) for name, shape in
               tf.train.list_variables(str(model_dir / "variables" / "variables"))}
    target = tmp_path / "model"
    _write(weights, target)
    _write(dict(weights, **{"layer2/biases": np.arange(10, dtype=np.float32)}), target)
    out = clean_tf2(target, probe, tmp_path)
    assert list(out["classes"]) == [9] * 8  # only the second model's biases say 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "model", "out.npz"]


def test_export_dir_is_checked_before_training(tmp_path):
    preflight.check_export_dir(tmp_path / "new" / "model")  # will be created: fine
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"--export-dir .*file is a file"):
        preflight.check_export_dir(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"--export-dir .*other holds other files"):
        preflight.check_export_dir(tmp_path / "other")


@pytest.mark.parametrize("argv, expected", [
    (["--logdir", "L"], Path("L/saved_model")),
    (["--logdir", "L", "--export-dir", "E"], Path("E")),
    (["--export-dir", "E"], Path("E")),
    ([], None),
])
def test_export_dir_defaults_to_logdir_saved_model(argv, expected):
    args = cli.task_parser().parse_args(["--role", "worker", "--index", "0", *argv])
    assert options.train_config(args).export_dir == expected


# ----------------------------------------------------------------- predict and evaluate: errors

def test_predict_names_every_file_that_is_not_a_28x28_grayscale_png(exported, tmp_path):
    model_dir, probe, _ = exported
    good = write_png(tmp_path / "good.png", probe[0][:, :, None])
    bad = {
        write_png(tmp_path / "big.png", np.zeros((32, 30, 1), np.uint8)): "30x32 pixels, "
                                                                            "expected 28x28",
        write_png(tmp_path / "rgb.png", np.zeros((28, 28, 3), np.uint8)): "RGB, expected "
                                                                           "grayscale",
        tmp_path / "text.png": "not a PNG file",
        tmp_path / "missing.png": "cannot be read",
    }
    (tmp_path / "text.png").write_text("not an image")
    run = sync_mnist("predict", "--saved-model", model_dir, good, *bad)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""  # nothing classified when any file is bad
    errors = run.stderr.strip().splitlines()
    assert len(errors) == len(bad), run.stderr
    for line, (path, reason) in zip(errors, bad.items()):
        assert line.startswith(f"error: {path}: ") and reason in line, line


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return (struct.pack(">I", len(body)) + kind + body +
            struct.pack(">I", zlib.crc32(kind + body)))


def test_predict_refuses_a_png_by_its_header_before_decoding_it(tmp_path, monkeypatch):
    # 50,000 x 50,000 grayscale pixels in a few hundred bytes: decoding allocates 2.5 GB
    # before it reads a row. Before, read_png decoded first and checked the size after.
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 50_000, 50_000, 8, 0, 0, 0, 0))
                     + _png_chunk(b"IDAT", zlib.compress(bytes(50_001 * 8)))
                     + _png_chunk(b"IEND", b""))

    def decode_png(*args, **kwargs):
        raise AssertionError("decoded before its header was checked")

    monkeypatch.setattr(tf.io, "decode_png", decode_png)
    with pytest.raises(inference.ImageError) as raised:
        inference.read_png(bomb)
    assert str(raised.value) == f"{bomb}: 50000x50000 pixels, expected 28x28"


@pytest.mark.parametrize("command", [["evaluate"], ["predict", "x.png"]])
def test_a_missing_or_non_model_dir_is_named(command, tmp_path):
    run = sync_mnist(*command, "--saved-model", tmp_path / "nowhere")
    assert run.returncode == 2
    assert run.stderr.strip() == f"error: model directory {tmp_path / 'nowhere'} does not exist"
    run = sync_mnist(*command, "--saved-model", tmp_path)
    assert run.returncode == 2
    assert f"error: {tmp_path} is not a SavedModel: it has no saved_model.pb" in run.stderr
