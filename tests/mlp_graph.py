"""Worker graphs as tests build them: the built-in MLP's, any model's as a worker prepares it,
and the MLP's model alone."""

from __future__ import annotations

import numpy as np

from sync_mnist import api
from sync_mnist.core import placement
from sync_mnist.models import mlp, registry
from sync_mnist.task import graph as graph_lib
from sync_mnist.task import inputs, prepare

# One batch's row, for the placeholders' dtypes and shapes: pixels as stored, a label.
EXAMPLE = (np.zeros([1, 784], np.uint8), np.zeros([1], np.int64))


def build_graph(config, **kwargs):
    """graph.build_graph of the MLP."""
    return graph_lib.build_graph(config, mlp.MODEL, EXAMPLE, **kwargs)


def prepared_graph(config, model=None) -> prepare.BuiltGraph:
    """A worker's graph as prepare.prepare builds it, from its own shard, with no server."""
    model = model or registry.resolve(config.train.model)
    shard, target, _ = inputs.load_shard(config, model)
    return prepare.make_graph(config, model, inputs.model_params(config, model),
                              shard.batch(0), target)


def variables(hidden_units=mlp.HIDDEN_UNITS, *, slices: int = 1):
    """The MLP's TRAIN spec in the current graph, its variables cut into `slices` as over that
    many ps, on no device (a plain session runs it)."""
    features, labels = placement.placeholders(*EXAMPLE)
    return placement.build(mlp.model_fn, features, labels, api.ModeKeys.TRAIN,
                           {**mlp.MODEL.params, "hidden_units": list(hidden_units)},
                           num_ps=slices, ps_job=None)
