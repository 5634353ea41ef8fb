"""A model of the user's own, in a file outside the repository, through the real command line:
the Estimator-era example after its documented change, a model with Keras 3's layers, and every
way a model can be bad input (exit 2, one line, the user's traceback below it). The example's
model file runs as the TFJob's pods in tests/container/test_tf_config_cluster.py, and with a
worker killed and restarted in tests/recovery/test_model_file_restarts.py.

The model file is the documented example (examples/your_model/my_model.py), copied to the
test's temporary directory as a user would keep it; the Keras model's is written there.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from procs import ROOT, YOUR_MODEL, read_json, run_task_process, your_model_file
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import EXIT_OK, EXIT_USAGE

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine


def _changed_lines(before: list[str], after: list[str]) -> int:
    """Lines of `before` that `after` removes or replaces, plus lines it adds beyond them."""
    import difflib

    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
               if tag != "equal")


def test_an_estimator_era_model_fn_trains_verified_after_the_documented_change(
        processes, tmp_path):
    original = (YOUR_MODEL.parent / "estimator_tf1.py").read_text().splitlines()
    migrated = (YOUR_MODEL.parent / "estimator_migrated.py").read_text().splitlines()
    start = original.index("import numpy as np")  # after the docstrings, which differ
    end = original.index("def make_data(rows, seed):")
    # docs/your-model.md: 11 lines of the imports and the model function, 9 of the rest.
    assert _changed_lines(original[start:end], migrated[migrated.index("import numpy as np"):
                                                        migrated.index("def make_data(rows, "
                                                                       "seed):")]) == 11
    assert _changed_lines(original[end:], migrated[migrated.index("def make_data(rows, "
                                                                  "seed):"):]) == 9
    path = tmp_path / "estimator_migrated.py"
    shutil.copy(YOUR_MODEL.parent / "estimator_migrated.py", path)
    steps = 60
    # tf-keras, the `layers` extra, as `make install` keeps it: apart from every other test.
    layers = ROOT / ".venv" / "layers"
    assert (layers / "tf_keras").is_dir(), f"no tf-keras in {layers}: run make install"
    launcher = processes.start(
        ["env", "TF_USE_LEGACY_KERAS=1", f"PYTHONPATH={layers}",
         str(ROOT / "bin" / "sync-mnist-cluster"), "--model",
         f"{path}:MODEL", "--base-port", "0", "--isolate", "off", "--workers", "2",
         "--train-steps", str(steps), "--logdir", str(tmp_path / "logdir"),
         "--summary-json", str(tmp_path / "cluster.json")], "launcher")
    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    summary = read_json(tmp_path / "cluster.json")
    assert summary["synchronous"] is True and summary["contributions"] == [steps, steps]
    assert summary["test_accuracy"] > 0.9
    # tf.layers' batch norm: its moving statistics moved, once per update (audit.py).
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(tmp_path / "logdir"))
    assert reader.get_tensor("global_step") == steps
    assert reader.get_tensor("batch_normalization/moving_mean").any()


# A user's model with Keras 3's layers, as TensorFlow 2.16+ code is written.
KERAS_MODEL = """
import numpy as np
import tensorflow as tf

import sync_mnist.api as sm


def model_fn(features, labels, mode, params):
    layers = tf.keras.layers
    embedded = tf.reduce_mean(layers.Embedding(50, 4)(features["ids"]), axis=1)
    x = layers.BatchNormalization()(features["x"], training=mode == sm.ModeKeys.TRAIN)
    logits = layers.Dense(2)(layers.Dense(16, activation="relu")(tf.concat([embedded, x], 1)))
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    if mode == sm.ModeKeys.TRAIN:
        return sm.ModelSpec(mode, loss=loss, optimizer=tf.compat.v1.train.AdagradOptimizer(0.1))
    return sm.ModelSpec(mode, loss=loss)


def _data(rows, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, size=(rows, 3))
    x = rng.normal(loc=3.0, size=(rows, 2)).astype(np.float32)
    return {"ids": ids, "x": x}, (ids[:, 0] % 2).astype(np.int64)


MODEL = sm.Model(model_fn, lambda params: _data(2000, 1), lambda params: _data(500, 2))
"""


def test_a_model_with_keras_3_layers_trains_verified_through_the_launcher(processes,
                                                                          tmp_path):
    # The environment of a user who set no TF_USE_LEGACY_KERAS: the launcher sets it at its
    # start-up, as every task does (tfcompat.defer_keras); its tasks took it for the user's,
    # and the model failed with "Keras cannot be imported".
    path = tmp_path / "keras_model.py"
    path.write_text(KERAS_MODEL)
    steps = 30
    launcher = processes.start(
        ["env", "-u", "TF_USE_LEGACY_KERAS", str(ROOT / "bin" / "sync-mnist-cluster"),
         "--model", f"{path}:MODEL", "--base-port", "0", "--isolate", "off", "--workers", "2",
         "--ps", "2", "--train-steps", str(steps), "--logdir", str(tmp_path / "logdir"),
         "--summary-json", str(tmp_path / "cluster.json")], "launcher")
    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    summary = read_json(tmp_path / "cluster.json")
    assert summary["synchronous"] is True and summary["contributions"] == [steps, steps]
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(tmp_path / "logdir"))
    # Keras 3's batch norm: its moving mean moved from 0 towards x's mean, 3 (audit.py), by
    # 1 - 0.99 ** 30 of the way (momentum 0.99), within the batches' noise.
    np.testing.assert_allclose(reader.get_tensor("batch_normalization/moving_mean"),
                               3 * (1 - 0.99 ** steps), atol=0.05)


def _worker_alone(tmp_path, model: str) -> tuple[int, list[str]]:
    """A worker of a cluster that does not exist: it fails on the model before it waits for
    anyone. (exit code, its stderr lines)."""
    ps, w0, w1 = free_ports(3)
    code, _, err, _ = run_task_process(
        ["--role", "worker", "--index", "1", "--ps-hosts", f"127.0.0.1:{ps}", "--worker-hosts",
         f"127.0.0.1:{w0},127.0.0.1:{w1}", "--model", model, "--train-steps", "5",
         "--timeout", "5"], timeout=120)
    return code, err.strip().splitlines()


def test_a_model_function_that_raises_is_bad_input_with_its_traceback(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(YOUR_MODEL.read_text().replace(
        '    logits = tf.matmul(features, weights) + biases',
        '    logits = tf.matmul(features, weights) + biases\n'
        '    scale = params["scale"]'))
    code, lines = _worker_alone(tmp_path, f"{path}:MODEL")
    assert code == EXIT_USAGE, lines
    # The one line, then the user's traceback below it, and nothing after.
    at = lines.index("error: the model function raised KeyError in mode 'train': 'scale'")
    assert lines[at + 1] == "Traceback (most recent call last):"
    assert f'File "{path}", line ' in "\n".join(lines[at:]) and lines[-1] == "KeyError: 'scale'"
    assert "placement.py" not in "\n".join(lines[at:])


# Each a change to the example file, and the one line its worker exits 2 with (every case, with
# its exact line, is in tests/inprocess/test_model_contract.py).
BROKEN = {
    "a loss that is no scalar": (
        "loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)",
        "loss = tf.reduce_sum(logits, axis=1)",
        "error: ModelSpec: loss must be a float scalar, got float32 of shape (None,)"),
    "its own train op": (
        "return sm.ModelSpec(mode, loss=loss,\n",
        "return sm.ModelSpec(mode, loss=loss, train_op=tf.no_op(),\n",
        "error: ModelSpec: train_op is refused: return the base optimizer as optimizer=... (or "
        "none, for --optimizer); sync_mnist wraps it in SyncReplicasOptimizer and builds the "
        "train op itself"),
    "uneven input": (
        "return _data(params, 3000, seed=1)",
        "return _data(params, 3000, seed=1)[0], _data(params, 2999, seed=1)[1]",
        "error: train_input_fn returned 3000 rows of features but 2999 labels"),
    "its own data error": (
        "return _data(params, 3000, seed=1)",
        'raise sm.DataError(f"no training data for {params[\'classes\']} classes")',
        "error: no training data for 4 classes"),
    "no model of that name": ("MODEL = sm.Model(", "OTHER = sm.Model(", None),
}


@pytest.mark.parametrize("change", BROKEN.values(), ids=BROKEN.keys())
def test_a_model_that_breaks_the_contract_is_exit_2_with_one_line(tmp_path, change):
    old, new, line = change
    path = tmp_path / "broken.py"
    text = YOUR_MODEL.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    code, lines = _worker_alone(tmp_path, f"{path}:MODEL")
    assert code == EXIT_USAGE, lines
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [line or f"error: --model '{path}:MODEL': {path} has no name 'MODEL'"]
    assert lines[-1] == errors[0]  # nothing after it: no traceback of the package's own


def test_the_task_command_imports_a_module_beside_the_model_file(tmp_path):
    # The helper's value reaches the task: its labels are one row short, which the task names
    # (exit 2, before it waits for anyone); without the helper, ModuleNotFoundError instead.
    # The task starts in the repository (procs.py), not in the file's directory.
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "label_rows.py").write_text("LABEL_ROWS = 2999\n")
    path = tmp_path / "models" / "my_model.py"
    text = YOUR_MODEL.read_text()
    for old, new in (("import sync_mnist.api as sm\n",
                      "import sync_mnist.api as sm\nfrom label_rows import LABEL_ROWS\n"),
                     ("return _data(params, 3000, seed=1)",
                      "return _data(params, 3000, seed=1)[0], _data(params, LABEL_ROWS, "
                      "seed=1)[1]")):
        assert old in text
        text = text.replace(old, new, 1)
    path.write_text(text)
    code, lines = _worker_alone(tmp_path, f"{path}:MODEL")
    assert code == EXIT_USAGE, lines
    assert [line for line in lines if line.startswith("error:")] == [
        "error: train_input_fn returned 3000 rows of features but 2999 labels"], lines


def test_a_worker_with_another_version_of_the_model_exits_2_naming_the_difference(
        processes, tmp_path):
    first = your_model_file(tmp_path)
    other = tmp_path / "other" / "my_model.py"
    other.parent.mkdir()
    other.write_text(YOUR_MODEL.read_text().replace('"classes": 4', '"classes": 5'))
    ports = free_ports(3)
    hosts = ["--ps-hosts", f"127.0.0.1:{ports[0]}", "--worker-hosts",
             f"127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}", "--train-steps", "1000",
             "--timeout", "30"]
    processes.task("ps", 0, *hosts, "--model", first)
    processes.task("worker", 0, *hosts, "--model", first)
    stranger = processes.task("worker", 1, *hosts, "--model", f"{other}:MODEL")
    assert stranger.wait(BOUND) == EXIT_USAGE, stranger.output
    error = stranger.wait_for_line(r"error: .*", 1).string
    digests = [hashlib.sha256(p.read_bytes()).hexdigest()[:16]
               for p in (other, Path(first.rpartition(":")[0]))]
    assert (f"worker 1 has --model MODEL from a file of sha256 {digests[0]} but the chief has "
            f"MODEL from a file of sha256 {digests[1]}") in error
    assert "worker 1 has model params {" in error and '"classes": 5' in error
    assert error.endswith("worker 1 has another model than the chief (--model file or "
                          "version): worker 1 has variable biases [5] float32; the chief has "
                          "variable biases [4] float32"), error


def test_the_launcher_refuses_a_model_file_that_does_not_exist_before_starting_tasks(
        processes, tmp_path):
    launcher = processes.launcher("--model", f"{tmp_path}/nope.py:MODEL", "--base-port", "0",
                                  "--isolate", "off")
    assert launcher.wait(60) == EXIT_USAGE, launcher.output
    assert launcher.lines[-1] == (f"error: --model '{tmp_path}/nope.py:MODEL': no such file "
                                  f"{tmp_path}/nope.py"), launcher.output
    assert not [line for line in launcher.lines if "started" in line]
