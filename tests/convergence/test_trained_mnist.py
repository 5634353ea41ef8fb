"""A model trained on the complete MNIST by a real cluster, and its SavedModel as a user meets
it: loaded in a clean TensorFlow 2 process it scores the 10,000 test digits as the cluster's
own evaluation did, `sync-mnist evaluate` reports that accuracy with its confusion matrix, and
`sync-mnist predict` classifies real digits as PNG files. How the SavedModel is written, and
`predict`'s errors, without a cluster: tests/cluster/test_export.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from procs import Processes, read_json
from saved_models import BOUND, clean_tf2, sync_mnist, write_png
from sync_mnist.tools import inference

STEPS = 100  # half a pass over the training set: enough to test how well it learned


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
    return clean_tf2(trained[0], images, tmp_path_factory.mktemp("trained_in_tf2"))


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
    run = sync_mnist("evaluate", "--saved-model", model_dir)
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
    paths = [write_png(tmp_path / f"digit{i}.png", images[i][:, :, None]) for i in range(10)]
    run = sync_mnist("predict", "--saved-model", model_dir, *paths)
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
