"""A worker's input: the params a model's functions are given, their data checked, and this
worker's shard of it (core/shard.py)."""

from __future__ import annotations

import logging

import numpy as np

from sync_mnist import api, models
from sync_mnist.core.config import TaskConfig
from sync_mnist.core.shard import Shard
from sync_mnist.models import registry

log = logging.getLogger(__name__)


def model_params(config: TaskConfig, model: api.Model) -> dict:
    """The params a model's functions are given: its defaults, the data options it reads (the
    built-in models that read files: models.data_params), and the seed."""
    train = config.train
    return {**model.params, **models.data_params(train.model, train.data_options),
            "seed": train.seed}


def input_data(what: str, input_fn, params: dict) -> tuple:
    """input_fn(params), checked: (features, labels), numpy arrays of one length (features an
    array or a dict of them). Raises api.ContractError naming what is wrong."""
    try:
        value = input_fn(dict(params))
    except Exception as e:
        raise api.ContractError(f"{what} raised {type(e).__name__}: "
                                f"{' '.join(str(e).split()) or '-'}",
                                registry.user_traceback(e)) from None
    if not (isinstance(value, tuple) and len(value) == 2):
        raise api.ContractError(f"{what} returned {type(value).__name__}, not a pair "
                                "(features, labels) of numpy arrays")
    features, labels = value
    columns = features if isinstance(features, dict) else {"": features}
    for name, column in [*columns.items(), ("labels", labels)]:
        where = "labels" if name == "labels" else f"features[{name!r}]" if name else "features"
        if not isinstance(column, np.ndarray) or column.ndim < 1:
            raise api.ContractError(f"{what} returned {where} as {type(column).__name__}"
                                    f"{f' of shape {column.shape}' if hasattr(column, 'shape') else ''}"
                                    ", not a numpy array with a first axis of examples")
        if len(column) != len(labels):
            raise api.ContractError(f"{what} returned {len(column)} rows of {where} but "
                                    f"{len(labels)} labels")
    if len(labels) == 0:
        raise api.ContractError(f"{what} returned no examples")
    return features, labels


def load_shard(config: TaskConfig, model: api.Model) -> tuple[Shard, int, str]:
    """This worker's shard of the model's training data, the steps to train (--train-steps,
    or --epochs passes over the shard), and a line that describes the data.

    Only the shard is kept: the whole training set is dropped once it is cut.
    """
    train = config.train
    features, labels = input_data("train_input_fn", model.train_input_fn,
                                  model_params(config, model))
    # Sync: a disjoint shard per worker, equal in length, so every worker runs as many batches.
    shard = Shard(features, labels, index=config.index,
                       num_workers=config.cluster.num_workers, batch_size=train.batch_size,
                       seed=train.seed)
    source = models.data_name(train.model, train.data_options) or train.model
    description = f"{source}: {len(labels):,} training examples"
    log.info("dataset %s; this worker's shard: %s examples", description, f"{shard.size:,}")
    return shard, train.train_steps or train.epochs * shard.batches_per_epoch, description
