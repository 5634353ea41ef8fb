"""Every canned model (sync_mnist/canned.py) trained synchronously on 2 workers, in one process,
on data with a planted truth: verified, the chief's record carrying the Estimator's metric
names, and each model near that truth. Wide & deep's classifier then resumes its checkpoint of
2 ps on 1. How each computes (the binary head against numpy, wide & deep's two optimizers):
tests/inprocess/test_canned.py; their graphs: tests/fast/test_canned_graph.py.

The truth: x ~ N(0, 1) in 2 dimensions and a colour of three; the score
s = x0 - x1 + (1 if red). Binary label s > 0.3; three classes by s below -0.7, up to 0.7,
above; the regressors' label 2 s + N(0, 0.1^2), so the best average loss is 0.01. The
classifiers' labels hold no noise: the truth's accuracy is 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.canned as canned
from inprocess_cluster import run_cluster

tf1 = tf.compat.v1
fc = tf1.feature_column

ROWS, EVAL_ROWS, BATCH, STEPS = 4000, 1000, 50, 300
NOISE = 0.1

BINARY = ["accuracy", "accuracy_baseline", "auc", "auc_precision_recall", "average_loss",
          "label/mean", "loss", "precision", "prediction/mean", "recall"]
MULTI_CLASS = ["accuracy", "average_loss", "loss"]
REGRESSION = ["average_loss", "label/mean", "loss", "prediction/mean"]


def _features(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    features = {"x": rng.normal(size=(rows, 2)).astype(np.float32),
                "color": rng.choice(["red", "green", "blue"], (rows, 1))}
    score = features["x"][:, 0] - features["x"][:, 1] + (features["color"][:, 0] == "red")
    return features, score, rng


def _binary(rows, seed):
    features, score, _ = _features(rows, seed)
    return features, (score > 0.3).astype(np.int64)


def _three_classes(rows, seed):
    features, score, _ = _features(rows, seed)
    return features, np.digitize(score, [-0.7, 0.7]).astype(np.int64)


def _regression(rows, seed):
    features, score, rng = _features(rows, seed)
    return features, (2 * score + rng.normal(0, NOISE, rows))[:, None].astype(np.float32)


X = fc.numeric_column("x", shape=[2])
COLOR = fc.categorical_column_with_vocabulary_list("color", ["red", "green", "blue"])
DEEP = [X, fc.embedding_column(COLOR, 3)]
WIDE = [X, COLOR]


def _inputs(data):
    return dict(train_input_fn=lambda params: data(ROWS, 1),
                eval_input_fn=lambda params: data(EVAL_ROWS, 2))


# Each model: (how it is made, its metric names, the metric it is judged by, and its bound).
MODELS = {
    "DNNClassifier (3 classes)": (
        lambda: canned.DNNClassifier([16, 8], DEEP, n_classes=3, **_inputs(_three_classes)),
        MULTI_CLASS, "accuracy", 0.85),
    "LinearClassifier": (
        lambda: canned.LinearClassifier(WIDE, **_inputs(_binary)), BINARY, "accuracy", 0.9),
    "DNNLinearCombinedClassifier": (
        lambda: canned.DNNLinearCombinedClassifier(
            linear_feature_columns=WIDE, dnn_feature_columns=DEEP, dnn_hidden_units=[16, 8],
            **_inputs(_binary)), BINARY, "accuracy", 0.85),  # the Estimator's small rates
    "DNNRegressor": (
        lambda: canned.DNNRegressor([16, 8], DEEP, **_inputs(_regression)),
        REGRESSION, "average_loss", -0.25),
    "LinearRegressor": (
        lambda: canned.LinearRegressor(WIDE, **_inputs(_regression)),
        REGRESSION, "average_loss", -0.25),
    "DNNLinearCombinedRegressor": (
        lambda: canned.DNNLinearCombinedRegressor(
            linear_feature_columns=WIDE, dnn_feature_columns=DEEP, dnn_hidden_units=[16, 8],
            dnn_optimizer="Adam", **_inputs(_regression)),
        REGRESSION, "average_loss", -0.25),
}


@pytest.mark.parametrize("name", MODELS)
def test_each_canned_model_trains_verified_near_its_planted_truth(name, tmp_path):
    make, names, judged_by, bound = MODELS[name]
    run = run_cluster(2, make(), num_ps=2, train_steps=STEPS, batch_size=BATCH)
    chief = run.chief
    assert chief.verdict.startswith(f"synchronous: each of {STEPS} updates averaged exactly "
                                    "one gradient from each of 2 workers"), chief.verdict
    assert chief.contributions == [STEPS, STEPS]
    metrics = chief.test_metrics
    assert sorted(metrics) == names
    # `loss` is the trained loss, v1's batch sum, over one evaluation batch of all EVAL_ROWS;
    # test_loss is per example.
    assert metrics["loss"] == pytest.approx(chief.test_loss * EVAL_ROWS, rel=1e-5)
    # A positive bound is a floor (accuracy); a negative one, -f, caps the average loss at the
    # fraction f of the labels' variance (predicting their mean scores 1.0; the truth 0.01/20).
    if bound > 0:
        assert metrics[judged_by] >= bound, metrics
    else:
        variance = float(np.var(_regression(EVAL_ROWS, 2)[1]))
        assert metrics[judged_by] <= -bound * variance, (metrics, variance)


def test_wide_and_deep_resumes_its_checkpoint_of_two_ps_on_one(tmp_path):
    logdir = tmp_path / "logdir"
    make = MODELS["DNNLinearCombinedClassifier"][0]
    first = run_cluster(2, make(), num_ps=2, train_steps=STEPS // 2, batch_size=BATCH,
                        logdir=logdir)
    assert first.chief.synchronous, first.chief.verdict
    saved = tf.train.load_checkpoint(str(logdir))
    at_first = {name: saved.get_tensor(name) for name in saved.get_variable_to_shape_map()}
    assert not [name for name in at_first if "part_" in name]  # each variable whole
    second = run_cluster(2, make(), num_ps=1, train_steps=STEPS, batch_size=BATCH,
                         logdir=logdir)
    chief = second.chief
    assert chief.synchronous, chief.verdict
    assert chief.contributions == [STEPS, STEPS]  # the counters resumed with the model
    # Every worker went on from the checkpoint's update, not from 0.
    assert [(w.start_step, w.global_step) for w in second.workers] == [(STEPS // 2, STEPS)] * 2
    resumed = tf.train.load_checkpoint(str(logdir))
    assert set(resumed.get_variable_to_shape_map()) == set(at_first)
    # Both parts went on from where the 2 ps left them: each optimizer's slots moved further.
    for slot in ["linear/linear_model/x/weights/Ftrl", "dnn/hiddenlayer_0/kernel/Adagrad"]:
        assert (resumed.get_tensor(slot) > at_first[slot]).any(), slot
    assert chief.test_metrics["accuracy"] >= MODELS["DNNLinearCombinedClassifier"][3]
