"""A worker's input: the params a model's functions are given, their data checked, and this
worker's shard of it: numpy arrays cut in memory (core/shard.py), or a tf.data.Dataset streamed
(core/stream.py)."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import tensorflow as tf

from sync_mnist import api
from sync_mnist.core import stream as stream_lib
from sync_mnist.core.config import TaskConfig
from sync_mnist.core.shard import Shard
from sync_mnist.models import params as model_params_lib
from sync_mnist.models import registry

tf1 = tf.compat.v1
log = logging.getLogger(__name__)


def model_params(config: TaskConfig, model: api.Model) -> dict:
    """The params a model's functions are given: its defaults, --param's values (and the
    options that spell one, --data-dir's say) typed by them, and the seed (models/params.py:
    a model that has no such param refuses it, ConfigError)."""
    return model_params_lib.of(model, config.train)


# The params that name a model's data, first to last in the order a run's lines name it by:
# the built-in mlp's and cnn's "dataset", the click model's files, a directory.
DATA_NAMES = ("dataset", "train_files", "data_dir")


def data_name(params: dict) -> str | None:
    """The data a model reads, as its params name it: the first of DATA_NAMES set to text;
    None where none is (ctr's generated clicks; a model that names its data otherwise)."""
    return next((params[k] for k in DATA_NAMES if isinstance(params.get(k), str)), None)


def takes_input_context(input_fn) -> bool:
    """Whether input_fn(params, input_context) cuts its own share of the data."""
    try:
        return "input_context" in inspect.signature(input_fn).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return False


def call_input_fn(what: str, input_fn, params: dict, context=None):
    """input_fn(params), or input_fn(params, input_context=context) where it takes one. What it
    raises is the model's error (api.ContractError, with the user's traceback), but for bad
    input it names itself (api.DataError, api.ConfigError): that, as it is."""
    if context is not None and takes_input_context(input_fn):
        return registry.call(what, input_fn, dict(params), input_context=context)
    return registry.call(what, input_fn, dict(params))


def input_data(what: str, input_fn, params: dict) -> tuple:
    """input_fn(params), checked: (features, labels), numpy arrays of one length (features an
    array or a dict of them). Raises api.ContractError naming what is wrong."""
    return check_arrays(what, call_input_fn(what, input_fn, params))


def check_arrays(what: str, value) -> tuple:
    """`value`, checked: (features, labels), numpy arrays of one length."""
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


def load_eval(model: api.Model, params: dict, seed: int):
    """The model's evaluation data: numpy arrays (features, labels), or a stream.WholeInput
    where eval_input_fn returns a tf.data.Dataset (read whole at each evaluation)."""
    from sync_mnist.task.evaluation import EVAL_BATCH

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        value = call_input_fn("eval_input_fn", model.eval_input_fn, params)
    if stream_lib.is_dataset(value):
        return stream_lib.WholeInput(graph, value, batch_size=EVAL_BATCH, what="eval_input_fn")
    return check_arrays("eval_input_fn", value)


def load_shard(config: TaskConfig, model: api.Model):
    """This worker's shard of the model's training data (a Shard, or a Stream where the input
    function returns a tf.data.Dataset), the steps to train (--train-steps, or --epochs passes
    over the shard: with a stream, until the first worker's input ends), and a line that
    describes the data.

    Only the shard is kept: data in memory is dropped once it is cut.
    """
    train, n, i = config.train, config.cluster.num_workers, config.index
    params = model_params(config, model)
    graph = tf.Graph()  # the stream's, where the input function builds its dataset
    with graph.as_default():
        tf1.set_random_seed(train.seed)  # Sync: the input's shuffles draw the same on a rerun
        context = tf.distribute.InputContext(num_input_pipelines=n, input_pipeline_id=i,
                                             num_replicas_in_sync=n)
        value = call_input_fn("train_input_fn", model.train_input_fn, params, context)
    source = data_name(params) or train.model
    if stream_lib.is_dataset(value):
        stream = stream_lib.Stream(graph, value, index=i, num_workers=n,
                                   batch_size=train.batch_size, epochs=train.epochs,
                                   sharded=takes_input_context(model.train_input_fn),
                                   what="train_input_fn")
        log.info("dataset %s: streamed, sharded %s; %s", source, stream.sharding,
                 f"up to {train.epochs} pass(es) over my shard, until the first worker's "
                 "input ends" if train.epochs else "repeated for --train-steps")
        return (stream, train.train_steps or stream_lib.UNTIL_INPUT_ENDS,
                f"{source}: streamed")
    features, labels = check_arrays("train_input_fn", value)
    # Sync: a disjoint shard per worker, equal in length, so every worker runs as many batches.
    shard = Shard(features, labels, index=i, num_workers=n, batch_size=train.batch_size,
                  seed=train.seed)
    description = f"{source}: {len(labels):,} training examples"
    log.info("dataset %s; this worker's shard: %s examples", description, f"{shard.size:,}")
    return shard, train.train_steps or train.epochs * shard.batches_per_epoch, description
