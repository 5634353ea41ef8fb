"""The built-in MLP with a chief hook that holds the chief once, before its step AT: its
update step for that update is then already waiting on every ps, and its own gradient not yet
pushed. A test holds the chief so to fault it at that point, which a fault at a random time
catches only now and then (tests/network/test_zombie_update.py).

The hold is taken once: where the file named by $HELD_CHIEF_FLAG exists, the hook renames it to
<name>.held (what the test waits for) and waits; a restarted chief finds no flag and trains on.
The wait ends with the process, or at the hook's bound (--timeout).
"""

from __future__ import annotations

import dataclasses
import os
import threading

import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.models import mlp

AT = 21


class _HoldOnce(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self._calls = 0

    def before_run(self, run_context):
        self._calls += 1
        flag = os.environ["HELD_CHIEF_FLAG"]
        if self._calls == AT and os.path.exists(flag):
            os.rename(flag, flag + ".held")
            threading.Event().wait()


def model_fn(features, labels, mode, params):
    spec = mlp.model_fn(features, labels, mode, params)
    return dataclasses.replace(spec, training_chief_hooks=[_HoldOnce()]) if mode == sm.ModeKeys.TRAIN \
        else spec


MODEL = dataclasses.replace(mlp.MODEL, model_fn=model_fn)
