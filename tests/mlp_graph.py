"""The built-in MLP's graphs as tests build them: a worker's, and the model alone."""

from __future__ import annotations

import numpy as np

from sync_mnist import api
from sync_mnist.core import placement
from sync_mnist.task import worker
from sync_mnist.models import mlp

# One batch's row, for the placeholders' dtypes and shapes: pixels as stored, a label.
EXAMPLE = (np.zeros([1, 784], np.uint8), np.zeros([1], np.int64))


def build_graph(config, **kwargs):
    """worker.build_graph of the MLP."""
    return worker.build_graph(config, mlp.MODEL, EXAMPLE, **kwargs)


def variables(hidden_units=mlp.HIDDEN_UNITS, *, slices: int = 1):
    """The MLP's TRAIN spec in the current graph, its variables cut into `slices` as over that
    many ps, on no device (a plain session runs it)."""
    features, labels = placement.placeholders(*EXAMPLE)
    return placement.build(mlp.model_fn, features, labels, api.ModeKeys.TRAIN,
                           {**mlp.MODEL.params, "hidden_units": list(hidden_units)},
                           num_ps=slices, ps_job=None)
