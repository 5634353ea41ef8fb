"""The census wide & deep program (examples/census/census.py's feature columns and canned model,
with v1's loss: the sum over the batch, the canned default) trained synchronously by 2 workers
ends where one plain process ends that makes the same updates: each the mean of the 2 workers'
batch sums, over the same batches, by the same model function and optimizers (FTRL for the
wide part, Adagrad for the deep), from the same start. That is what SyncReplicasOptimizer
promised over an Estimator.

The data: census rows with a planted truth (write_census.py), in memory, so that each worker's
batches are a Shard's, which the plain process draws too. The start: the plain process's
initial variables, which the cluster warm-starts from. The batch mean (TensorFlow 2's
reduction) ends elsewhere by more than the bound, so the comparison tells the two apart.
"""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
import sync_mnist.canned as canned
from inprocess_cluster import run_cluster
from procs import ROOT
from sync_mnist.core.config import WarmStart
from sync_mnist.core.shard import Shard
from sync_mnist.task.evaluation import EVAL_BATCH

tf1 = tf.compat.v1
EXAMPLE = ROOT / "examples" / "census"
WORKERS, BATCH, STEPS, SEED = 2, 40, 400, 0
BOUND = 0.01  # the issue's: accuracy and AUC within this of the plain process's


def _census():
    spec = importlib.util.spec_from_file_location("census_as_one_process", EXAMPLE / "census.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CENSUS = _census()


def _rows(path) -> tuple[dict, np.ndarray]:
    """A census file as numpy columns, typed as the program's CSV defaults type them, and its
    labels as the program makes them (">50K" is True)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    columns = {}
    for k, (name, default) in enumerate(zip(CENSUS._CSV_COLUMNS, CENSUS._CSV_COLUMN_DEFAULTS)):
        values = [row[k] for row in rows]
        columns[name] = (np.array(values, np.int32) if isinstance(default[0], int)
                         else np.array(values, object))
    return columns, columns.pop("income_bracket") == ">50K"


def _model(train, test, reduction) -> sm.Model:
    wide, deep = CENSUS.build_model_columns()
    return canned.DNNLinearCombinedClassifier(
        linear_feature_columns=wide, dnn_feature_columns=deep,
        dnn_hidden_units=[100, 75, 50, 25], loss_reduction=reduction,
        train_input_fn=lambda params: train, eval_input_fn=lambda params: test)


def _placeholders(features: dict):
    return {k: tf1.placeholder(tf.string if v.dtype == object else tf.as_dtype(v.dtype), [None])
            for k, v in features.items()}


def _plain_process(model, shards, start, end, scale) -> None:
    """One process, no cluster: STEPS updates, update t of the loss of the workers' batches t
    together times `scale` (1 / WORKERS: the mean of their batch sums), each part by its own
    optimizer. Saves its initial variables at `start`, its trained ones at `end`."""
    first, _ = shards[0].batch(0)
    with tf.Graph().as_default(), tf1.Session() as sess:
        tf1.set_random_seed(SEED)
        features, labels = _placeholders(first), tf1.placeholder(tf.bool, [None])
        tf1.train.get_or_create_global_step()
        spec = model.model_fn(features, labels, sm.ModeKeys.TRAIN, {})
        loss = spec.loss * scale
        updates = []
        for scope, optimizer in spec.optimizer.items():
            variables = [v for v in tf1.trainable_variables()
                         if v.op.name.startswith(scope + "/")]
            updates.append(optimizer.apply_gradients(
                zip(tf1.gradients(loss, variables), variables)))
        saver = tf1.train.Saver()
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.tables_initializer())
        saver.save(sess, start, write_meta_graph=False)
        for step in range(STEPS):
            batches = [shard.batch(step) for shard in shards]
            feed = {features[k]: np.concatenate([b[k] for b, _ in batches])
                    for k in features}
            feed[labels] = np.concatenate([y for _, y in batches])
            sess.run(updates, feed)
        saver.save(sess, end, write_meta_graph=False)


def _evaluate(model, checkpoint, test) -> dict:
    """The model's metrics at `checkpoint` over the evaluation rows, EVAL_BATCH at a time, as
    the chief evaluates."""
    features, labels = test
    with tf.Graph().as_default(), tf1.Session() as sess:
        inputs, truth = _placeholders(features), tf1.placeholder(tf.bool, [None])
        spec = model.model_fn(inputs, truth, sm.ModeKeys.EVAL, {})
        tf1.train.Saver(tf1.global_variables()).restore(sess, checkpoint)
        sess.run([tf1.local_variables_initializer(), tf1.tables_initializer()])
        for start in range(0, len(labels), EVAL_BATCH):
            rows = slice(start, start + EVAL_BATCH)
            feed = {inputs[k]: v[rows] for k, v in features.items()}
            feed[truth] = labels[rows]
            sess.run([update for _, update in spec.eval_metric_ops.values()], feed)
        return sess.run({k: value for k, (value, _) in spec.eval_metric_ops.items()})


def test_two_workers_end_where_one_process_of_the_same_updates_ends(tmp_path):
    data = tmp_path / "census_data"
    subprocess.run([sys.executable, str(EXAMPLE / "write_census.py"), str(data),
                    "--eval-rows", "4000"], check=True, capture_output=True, timeout=60)
    train, test = _rows(data / CENSUS.TRAINING_FILE), _rows(data / CENSUS.EVAL_FILE)
    shards = [Shard(*train, index=i, num_workers=WORKERS, batch_size=BATCH, seed=SEED)
              for i in range(WORKERS)]
    model = _model(train, test, canned.REDUCTION.SUM)
    start, plain = str(tmp_path / "start" / "model.ckpt"), {}
    for name, scale in [("sum", 1 / WORKERS), ("mean", 1 / (WORKERS * BATCH))]:
        _plain_process(model, shards, start, str(tmp_path / name / "model.ckpt"), scale)
        plain[name] = _evaluate(model, str(tmp_path / name / "model.ckpt"), test)

    run = run_cluster(WORKERS, model, train_steps=STEPS, batch_size=BATCH, seed=SEED,
                      warm_start=WarmStart(start), logdir=tmp_path / "logdir")
    chief = run.chief
    assert chief.verdict.startswith(f"synchronous: each of {STEPS} updates averaged exactly "
                                    f"one gradient from each of {WORKERS} workers"), chief.verdict
    metrics = {k: chief.test_metrics[k] for k in ("accuracy", "auc")}
    print("census after", STEPS, "updates: 2 workers", metrics, "one process:",
          {name: {k: round(float(m[k]), 4) for k in metrics} for name, m in plain.items()})
    for k, value in metrics.items():
        assert value == pytest.approx(plain["sum"][k], abs=BOUND), (k, metrics, plain)
    # The batch means' updates end elsewhere: the bound tells the reductions apart.
    assert max(abs(plain["mean"][k] - plain["sum"][k]) for k in metrics) > 2 * BOUND, plain
