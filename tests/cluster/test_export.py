"""The trained model: the chief's SavedModel, and `sync-mnist evaluate` / `predict` on it.

The SavedModel is always loaded in a separate, clean TensorFlow 2 process that never imports
sync_mnist, as a user would load it.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import mlp_graph
import sync_mnist.api as sm
from procs import ENV, ROOT, Processes, local_cluster, read_json
from sync_mnist.task import cli, export, options, preflight
from sync_mnist.tools import inference
from sync_mnist.core import placement
from sync_mnist.models import mlp
from sync_mnist.core.config import ConfigError

tf1 = tf.compat.v1

STEPS = 100  # half a pass over the training set: enough to test how well it learned
BOUND = 300  # seconds for a small cluster run or one TensorFlow process on a loaded machine

# A user's program: TensorFlow 2, eager, no sync_mnist. Classifies the images in IN (npz) with
# the model in DIR and writes probabilities and classes to OUT (npz).
CLEAN_TF2 = """
import sys
import numpy as np
import tensorflow as tf
model_dir, images_in, out = sys.argv[1:]
assert tf.executing_eagerly()
serve = tf.saved_model.load(model_dir).signatures["serving_default"]
images = np.load(images_in)["images"]
result = serve(images=tf.constant(images))
np.savez(out, probabilities=result["probabilities"].numpy(), classes=result["classes"].numpy(),
         probabilities_dtype=str(result["probabilities"].dtype.name),
         classes_dtype=str(result["classes"].dtype.name))
assert not any(m.startswith("sync_mnist") for m in sys.modules), "sync_mnist was imported"
"""


USER_ENV = {k: v for k, v in ENV.items() if k != "TF_USE_LEGACY_KERAS"}  # Keras as installed


def _clean_tf2(model_dir: Path, images: np.ndarray, tmp_path: Path) -> dict:
    np.savez(tmp_path / "in.npz", images=images)
    run = subprocess.run([sys.executable, "-c", CLEAN_TF2, str(model_dir),
                          str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         env=USER_ENV, cwd=tmp_path, capture_output=True, text=True, timeout=BOUND)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as out:
        return {k: out[k] for k in out.files}


def _sync_mnist(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sync_mnist", *map(str, args)], env=ENV,
                          cwd=ROOT, capture_output=True, text=True, timeout=BOUND)


def _write_png(path: Path, pixels: np.ndarray) -> Path:
    with tf.Graph().as_default(), tf1.Session() as sess:
        path.write_bytes(sess.run(tf.io.encode_png(pixels)))
    return path


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
    out = _clean_tf2(model_dir, probe, tmp_path)
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
    out = _clean_tf2(target, probe, tmp_path)
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
    good = _write_png(tmp_path / "good.png", probe[0][:, :, None])
    bad = {
        _write_png(tmp_path / "big.png", np.zeros((32, 30, 1), np.uint8)): "30x32 pixels, "
                                                                            "expected 28x28",
        _write_png(tmp_path / "rgb.png", np.zeros((28, 28, 3), np.uint8)): "RGB, expected "
                                                                           "grayscale",
        tmp_path / "text.png": "not a PNG file",
        tmp_path / "missing.png": "cannot be read",
    }
    (tmp_path / "text.png").write_text("not an image")
    run = _sync_mnist("predict", "--saved-model", model_dir, good, *bad)
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
    run = _sync_mnist(*command, "--saved-model", tmp_path / "nowhere")
    assert run.returncode == 2
    assert run.stderr.strip() == f"error: model directory {tmp_path / 'nowhere'} does not exist"
    run = _sync_mnist(*command, "--saved-model", tmp_path)
    assert run.returncode == 2
    assert f"error: {tmp_path} is not a SavedModel: it has no saved_model.pb" in run.stderr


# ----------------------------------------------------------- a real cluster on the real digits

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A cluster run on the shipped MNIST with --logdir; (model dir, cluster summary, output)."""
    out = tmp_path_factory.mktemp("trained")
    procs = Processes()
    try:
        launcher = procs.launcher("--base-port", "0", "--train-steps", str(STEPS),
                                  "--timeout", "60", "--logdir", str(out / "run"),
                                  "--summary-json", str(out / "cluster.json"))
        assert launcher.wait(BOUND) == 0, launcher.output
    finally:
        procs.kill_all()
    assert re.search(rf"\[worker 0\] saved the trained model to {out / 'run' / 'saved_model'}",
                     launcher.output)
    return out / "run" / "saved_model", read_json(out / "cluster.json"), launcher.output


@pytest.fixture(scope="module")
def trained_in_tf2(trained, tmp_path_factory):
    """The trained model's classes and probabilities for the 10,000 test digits, from a clean
    TensorFlow 2 process (one, for the tests below: each costs a TensorFlow start-up)."""
    images, _, _ = inference.test_digits()
    return _clean_tf2(trained[0], images, tmp_path_factory.mktemp("trained_in_tf2"))


def test_saved_model_scores_what_the_cluster_scored(trained, trained_in_tf2):
    _, summary, _ = trained
    _, labels, _ = inference.test_digits()
    assert len(labels) == 10_000
    out = trained_in_tf2
    correct = int(np.sum(out["classes"] == labels))
    # The cluster's own evaluation, of the same weights on the same digits.
    assert correct == round(summary["test_accuracy"] * len(labels))
    assert correct > 0.8 * len(labels)  # trained: chance is 10%


def test_evaluate_reports_accuracy_loss_and_confusion_matrix(trained):
    model_dir, summary, _ = trained
    run = _sync_mnist("evaluate", "--saved-model", model_dir)
    assert run.returncode == 0, run.stderr
    _, labels, _ = inference.test_digits()
    head = re.search(r"examples=(\d+) accuracy=([\d.]+) loss=([\d.]+)", run.stdout)
    assert int(head.group(1)) == 10_000
    assert head.group(2) == f"{summary['test_accuracy']:.4f}"
    assert 0 < float(head.group(3)) < 1.0  # a trained model's cross-entropy; chance: 2.3
    rows = [list(map(int, line.split()))
            for line in run.stdout.splitlines() if re.fullmatch(r"(\s+\d+){11}", line)]
    matrix = np.array(rows)[:, 1:]
    assert matrix.shape == (10, 10)
    np.testing.assert_array_equal(matrix.sum(axis=1), np.bincount(labels, minlength=10))
    assert np.trace(matrix) == round(summary["test_accuracy"] * 10_000)


def test_predict_classifies_real_digit_pngs(trained, trained_in_tf2, tmp_path):
    model_dir, _, _ = trained
    images, labels, _ = inference.test_digits()
    paths = [_write_png(tmp_path / f"digit{i}.png", images[i][:, :, None]) for i in range(10)]
    run = _sync_mnist("predict", "--saved-model", model_dir, *paths)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    out = trained_in_tf2  # the first 10 of its rows are these 10 digits
    assert len(lines) == 10
    for i, line in enumerate(lines):
        match = re.fullmatch(rf"{re.escape(str(paths[i]))}: (\d) \(probability ([\d.]+)\)", line)
        assert match, line
        assert int(match.group(1)) == out["classes"][i]
        assert float(match.group(2)) == pytest.approx(
            out["probabilities"][i][out["classes"][i]], abs=1e-4)
    assert sum(int(line.split(": ")[1][0]) == labels[i] for i, line in enumerate(lines)) >= 8


def test_a_short_run_on_the_complete_mnist_is_synchronous_and_learns(trained):
    _, summary, output = trained
    assert summary["synchronous"] is True
    assert summary["contributions"] == [STEPS] * 3
    assert summary["dataset"] == "mnist"
    assert summary["dataset_description"] == "mnist: 60,000 training examples"
    assert summary["test_accuracy"] >= 0.88  # chance is 0.10; a broken input pipeline stays low
    assert 0 < summary["test_loss"] < 0.5
    assert all(t["peak_rss_mb"] > 100 for t in summary["tasks"])
    assert "this worker's shard: 20,000 examples" in output
