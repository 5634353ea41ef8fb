"""The complete MNIST through the real command line: the shipped copy, a damaged copy, the
user's own files, and one short training run on the real digits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from procs import ROOT
from sync_mnist.models import data


def _launch_with_package(package_root, *args, timeout=120):
    """Runs `sync-mnist-cluster ARGS` importing sync_mnist from `package_root`."""
    env = {**os.environ, "PYTHONPATH": str(package_root), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from sync_mnist.launcher.cli import main; "
         "sys.exit(main())", *args],
        env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        cwd=package_root,  # not the checkout: `python -c` imports from its working directory
        start_new_session=True)


def test_a_damaged_shipped_file_is_exit_2_naming_it_before_any_task_starts(tmp_path):
    # A copy of the installed package with one byte of one data file flipped.
    package = tmp_path / "site"
    shutil.copytree(ROOT / "sync_mnist", package / "sync_mnist",
                    ignore=shutil.ignore_patterns("__pycache__"))
    damaged = package / "sync_mnist" / "models" / "mnist_files" / "train-labels-idx1-ubyte.gz"
    body = bytearray(damaged.read_bytes())
    body[100] ^= 0x40
    damaged.write_bytes(bytes(body))
    done = _launch_with_package(package, "--base-port", "0", "--isolate", "off",
                                "--train-steps", "5")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: {damaged}: the shipped MNIST file is damaged: SHA-256 "
        f"{done.stderr.split('SHA-256 ')[1].split(',')[0]}, expected "
        f"{data.SHIPPED_SHA256[damaged.name]}; reinstall sync_mnist"]
    assert "[worker" not in done.stderr + done.stdout  # no task was started


def test_a_data_dir_without_mnist_is_exit_2_naming_it(tmp_path):
    done = _launch_with_package(ROOT, "--data-dir", str(tmp_path), "--train-steps", "5")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: no MNIST in --data-dir {tmp_path}: looked for ")


def _as_idx(directory, ds, gz):
    directory.mkdir()
    arrays = (ds.train_images.reshape(-1, 28, 28), ds.train_labels.astype(np.uint8),
              ds.test_images.reshape(-1, 28, 28), ds.test_labels.astype(np.uint8))
    for name, array in zip(data.MNIST_FILES, arrays):
        data.write_idx(directory / (name if gz else name.removesuffix(".gz")), array)


def _as_npz(directory, ds):
    directory.mkdir()
    np.savez(directory / "mnist.npz", x_train=ds.train_images.reshape(-1, 28, 28),
             y_train=ds.train_labels.astype(np.uint8), x_test=ds.test_images.reshape(-1, 28, 28),
             y_test=ds.test_labels.astype(np.uint8))


@pytest.mark.parametrize("fmt", ["idx-gz", "idx-raw", "npz"])
def test_data_dir_in_each_format_loads_the_same_digits(tmp_path, fmt):
    shipped = data.load_dataset("mnist")
    small = data.Dataset("mnist", shipped.train_images[:3000], shipped.train_labels[:3000],
                         shipped.test_images[:500], shipped.test_labels[:500], "")
    directory = tmp_path / fmt
    if fmt == "npz":
        _as_npz(directory, small)
    else:
        _as_idx(directory, small, gz=fmt == "idx-gz")
    data.check_source("mnist", directory)
    loaded = data.load_dataset("mnist", directory)
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(loaded, field), getattr(small, field))
    assert loaded.description == (f"mnist: MNIST from {directory} "
                                  f"({'mnist.npz' if fmt == 'npz' else 'train-images-idx3-ubyte'}"
                                  f"{'.gz' if fmt == 'idx-gz' else ''}"
                                  f"{'' if fmt == 'npz' else ', ...'}) "
                                  "(3,000 train / 500 test digits)")
