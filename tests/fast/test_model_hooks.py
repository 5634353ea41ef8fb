"""A model's hooks (task/hooks.py), each call bounded and its errors the model's: a hook that
raises is a ContractError naming it (exit 2, its traceback below), one that does not return a
TaskTimeout naming it, one that asks to stop refused; ModelSpec checks what it is given."""

from __future__ import annotations

import threading

import pytest
import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.core.config import ConfigError, TaskTimeout
from sync_mnist.task import hooks

tf1 = tf.compat.v1


class _Hook(tf1.train.SessionRunHook):
    def __init__(self, after_run=None):
        self._after_run = after_run

    def after_run(self, run_context, run_values):
        if self._after_run:
            self._after_run(run_context)


def _after_run(hook: hooks.Bounded) -> None:
    context = tf1.train.SessionRunContext(tf1.train.SessionRunArgs([]), session=None)
    hook.after_run(context, tf1.train.SessionRunValues([], None, None))


def test_a_hook_that_raises_is_the_models_error_naming_it():
    def fails(context):
        raise ValueError("no such tensor: logits")

    [hook] = hooks.bounded([_Hook(fails)], "training", timeout=5.0)
    with pytest.raises(sm.ContractError) as raised:
        _after_run(hook)
    assert isinstance(raised.value, ConfigError)  # exit 2
    assert str(raised.value) == ("the model's training hook _Hook.after_run raised ValueError: "
                                 "no such tensor: logits")
    assert "in fails" in raised.value.details  # the user's traceback, shown below the line


def test_a_hook_that_does_not_return_ends_within_its_bound_naming_it():
    release = threading.Event()
    [hook] = hooks.bounded([_Hook(lambda context: release.wait(30))], "evaluation",
                           timeout=0.3)
    try:
        with pytest.raises(TaskTimeout) as raised:
            _after_run(hook)
        raised.value.handled()
    finally:
        release.set()
    assert str(raised.value) == ("the model's evaluation hook _Hook.after_run did not return "
                                 "in 0.3 s; it did not answer")


def test_a_hook_may_not_stop_one_worker_alone():
    [hook] = hooks.bounded([_Hook(lambda context: context.request_stop())], "training chief",
                           timeout=5.0)
    with pytest.raises(sm.ContractError, match=r"^the model's training chief hook _Hook asked "
                       r"to stop \(run_context.request_stop\(\)\): in synchronous training a "
                       "worker cannot stop alone"):
        _after_run(hook)


def test_an_evaluation_runs_what_its_hooks_ask_for_with_each_batch():
    seen = []

    class Asks(tf1.train.SessionRunHook):
        def before_run(self, run_context):
            return tf1.train.SessionRunArgs(doubled, feed_dict={extra: 3.0})

        def after_run(self, run_context, run_values):
            seen.append(run_values.results)

    with tf.Graph().as_default():
        x, extra = tf1.placeholder(tf.float32, []), tf1.placeholder(tf.float32, [])
        doubled = 2 * x + extra
        evaluation = hooks.Evaluation(hooks.bounded([Asks()], "evaluation", timeout=5.0))
        with tf1.Session() as sess:
            assert evaluation.run(sess, x + 1, {x: 1.0}, None) == 2.0
            assert evaluation.run(sess, x + 1, {x: 5.0}, None) == 6.0
    assert seen == [5.0, 13.0]  # the hook's fetch, with the batch's feed and its own


@pytest.mark.parametrize("field", ["training_hooks", "training_chief_hooks",
                                   "evaluation_hooks"])
def test_a_model_spec_takes_a_list_of_hooks_only(field):
    with tf.Graph().as_default():
        loss = tf.constant(0.0)
        assert getattr(sm.ModelSpec("train", loss=loss, **{field: [_Hook()]}), field)
        with pytest.raises(sm.ContractError, match=rf"^ModelSpec: {field}\[1\] must be a "
                           r"tf.compat.v1.train.SessionRunHook, got function$"):
            sm.ModelSpec("train", loss=loss, **{field: [_Hook(), lambda: None]})
        with pytest.raises(sm.ContractError, match=rf"^ModelSpec: {field} must be a list of "
                           "SessionRunHooks, got _Hook$"):
            sm.ModelSpec("train", loss=loss, **{field: _Hook()})
