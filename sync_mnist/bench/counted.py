"""The click model (models/ctr.py) with each training click's number as a feature, `example`:
what the bench's sync-count row trains with --count-examples example, to price the counting."""

from __future__ import annotations

import dataclasses

import numpy as np

from sync_mnist.models import ctr


def train_input_fn(params):
    features, labels = ctr.train_input_fn(params)
    return {**features, "example": np.arange(len(labels), dtype=np.int64)}, labels


CTR = dataclasses.replace(ctr.MODEL, train_input_fn=train_input_fn)
