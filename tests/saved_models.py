"""A trained model's SavedModel as its users meet it: loaded by a clean TensorFlow 2 process
that never imports sync_mnist, and through `sync-mnist evaluate` and `predict` (for
tests/cluster/test_export.py and tests/convergence/test_trained_mnist.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

from procs import ENV, ROOT

tf1 = tf.compat.v1

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


def clean_tf2(model_dir: Path, images: np.ndarray, tmp_path: Path) -> dict:
    np.savez(tmp_path / "in.npz", images=images)
    run = subprocess.run([sys.executable, "-c", CLEAN_TF2, str(model_dir),
                          str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         env=USER_ENV, cwd=tmp_path, capture_output=True, text=True, timeout=BOUND)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as out:
        return {k: out[k] for k in out.files}


def sync_mnist(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sync_mnist", *map(str, args)], env=ENV,
                          cwd=ROOT, capture_output=True, text=True, timeout=BOUND)


def write_png(path: Path, pixels: np.ndarray) -> Path:
    with tf.Graph().as_default(), tf1.Session() as sess:
        path.write_bytes(sess.run(tf.io.encode_png(pixels)))
    return path
