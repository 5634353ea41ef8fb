"""A model's own SessionRunHooks (ModelSpec's training_hooks, training_chief_hooks and
evaluation_hooks) run where the Estimator ran them: the training hooks around every step of
every worker, the chief's on the chief only, the evaluation hooks around each batch of the
chief's evaluation; what their before_run asks for is run in that step or batch.

One in-process cluster of 2 workers; the hooks count their calls, and the values their fetches
returned, in a list the model's params carry (every task is a thread of this process).
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

import sync_mnist.api as sm
from inprocess_cluster import run_cluster

tf1 = tf.compat.v1
ROWS, EVAL_ROWS, BATCH, STEPS = 32, 2500, 2, 5


class _Counting(tf1.train.SessionRunHook):
    """Records (kind, call) of each call, and, after each run, the value its fetch returned."""

    def __init__(self, kind: str, calls: list, fetch):
        self.kind, self.calls, self.fetch = kind, calls, fetch

    def begin(self):
        self.calls.append((self.kind, "begin"))

    def after_create_session(self, session, coord):
        self.calls.append((self.kind, "after_create_session"))

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs(self.fetch)

    def after_run(self, run_context, run_values):
        self.calls.append((self.kind, "after_run", int(run_values.results)))

    def end(self, session):
        self.calls.append((self.kind, "end"))


def _data(params, rows=ROWS):
    return np.ones((rows, 1), np.float32), np.zeros(rows, np.float32)


def _model_fn(features, labels, mode, params):
    w = tf1.get_variable("w", [], initializer=tf1.zeros_initializer())
    loss = tf.reduce_mean(features[:, 0]) * w + 0 * tf.reduce_mean(labels)
    calls = params["calls"]
    if mode == sm.ModeKeys.TRAIN:
        step = tf1.train.get_global_step()
        return sm.ModelSpec(
            mode, loss=loss, optimizer=tf1.train.GradientDescentOptimizer(1.0),
            training_hooks=[_Counting("training", calls, step)],
            training_chief_hooks=[_Counting("chief", calls, step)])
    # What an evaluation batch's fetch sees: the examples of the batch.
    examples = tf.size(labels)
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": (tf.constant(1.0), tf.no_op())},
        evaluation_hooks=[_Counting("evaluation", calls, examples)])


def test_the_hooks_run_where_the_estimator_ran_them():
    calls: list = []
    model = sm.Model(_model_fn, _data, lambda params: _data(params, EVAL_ROWS),
                     params={"calls": calls})
    run = run_cluster(2, model, train_steps=STEPS, batch_size=BATCH, seed=1)
    assert run.chief.synchronous is True, run.chief.verdict
    by = collections.Counter(call[:2] for call in calls)
    # Every worker's session: begin, after_create_session and end once, after_run each step.
    assert [by["training", c] for c in ("begin", "after_create_session", "end")] == [2, 2, 2]
    assert by["training", "after_run"] == 2 * STEPS
    # The chief's: on the chief alone.
    assert [by["chief", c] for c in ("begin", "after_create_session", "end")] == [1, 1, 1]
    assert by["chief", "after_run"] == STEPS
    # Each step's fetch came back from that step: global_step as the step read it.
    chief_steps = [call[2] for call in calls if call[:2] == ("chief", "after_run")]
    assert chief_steps == sorted(chief_steps) and len(set(chief_steps)) == STEPS
    # The evaluation's: one after_run per batch of the final evaluation (1000, 1000, 500),
    # each fetch run with its batch.
    assert [call[2] for call in calls if call[:2] == ("evaluation", "after_run")] == [
        1000, 1000, 500]
    assert [by["evaluation", c] for c in ("begin", "after_create_session", "end")] == [1, 1, 1]
