"""A worker's first phase, before it meets the cluster: its shard of the data, its server, its
graph, and the checkpoint the chief will restore. What it returns (`Worker`) is what every
later phase reads (join.py, lockstep.py, chief.py, finish.py)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import NamedTuple

import tensorflow as tf

from sync_mnist import api
from sync_mnist.core import checkpoints, sessions, warm_start
from sync_mnist.core.config import TaskConfig
from sync_mnist.core.shard import Shard, check_ids
from sync_mnist.core.stream import Stream
from sync_mnist.task import evaluation, inputs, progress_log
from sync_mnist.task.graph import WorkerGraph, build_graph

tf1 = tf.compat.v1
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Worker:
    """One worker, prepared: what its phases read. Set once here; only the chief's `shard`
    changes, to None once trained, to make room for the evaluation data."""

    config: TaskConfig
    model: api.Model
    params: dict  # what the model's functions are given (inputs.model_params)
    shard: Shard | Stream | None
    example: tuple  # a batch of the shard: what the graph's placeholders were shaped by
    target: int  # updates to train (sync), or local steps (async); stream.UNTIL_INPUT_ENDS
    description: str  # the training data, in a line
    started: float  # time.monotonic() at the start of the run
    server: object  # this task's tf.distribute.Server
    tf_config: tf1.ConfigProto
    graph: tf.Graph
    g: WorkerGraph
    restore: checkpoints.Restorable | None  # the checkpoint the chief restores, if any
    writer: progress_log.EventsWriter | None  # the chief's TensorBoard events, with --logdir
    warm: warm_start.Plan | None  # the chief: what it initialises from --warm-start-from
    plan: str = ""  # what it reads of its input, JSON (coverage.Plan): kept past the shard's end

    @property
    def logdir(self) -> Path | None:
        """Only the chief writes checkpoints and summaries (preflight.py has checked where)."""
        return self.config.train.logdir if self.config.is_chief else None

    @property
    def export_dir(self) -> Path | None:
        return self.config.train.export_dir if self.config.is_chief else None

    @property
    def bounded(self) -> tf1.RunOptions:
        """Every call on the ps waits at most --timeout."""
        return tf1.RunOptions(timeout_in_ms=int(self.config.train.timeout * 1000))

    @property
    def aggregate(self) -> int:
        return self.config.train.aggregate(self.config.cluster.num_workers)


def prepare(config: TaskConfig, model: api.Model, server=None) -> Worker:
    """Loads the shard, then starts the server (tests pass one) and builds the graph.

    The data comes first: loading briefly holds the whole training set, and that peak should
    not add to the memory the server and the session take. While it trains, even the chief
    holds only its shard: it reads the evaluation data when it first evaluates (chief.py).
    """
    started = time.monotonic()
    params = inputs.model_params(config, model)
    shard, target, description = inputs.load_shard(config, model)
    example = shard.batch(0)
    if config.train.count_examples:  # the first batch's ids, before meeting the cluster
        check_ids(example[0][config.train.count_examples], config.train.count_examples,
                  config.train.count_examples_ids, f"batch 0 of worker {config.index}")
    if server is None:
        server = config.cluster.server("worker", config.index)
    tf_config = sessions.session_config(config.cluster.device_filters("worker", config.index))
    built = make_graph(config, model, params, example, target, shard.plan.cut)
    return Worker(config, model, params, shard, example, target, description, started, server,
                  tf_config, *built, plan=shard.plan.to_json())


class BuiltGraph(NamedTuple):
    graph: tf.Graph
    g: WorkerGraph
    restore: checkpoints.Restorable | None  # the checkpoint the chief restores, if any
    writer: progress_log.EventsWriter | None  # the chief's, with --logdir
    warm: warm_start.Plan | None  # the chief's initialisers set to read --warm-start-from


def make_graph(config: TaskConfig, model: api.Model, params: dict, example: tuple,
               target: int, input_cut: str | None = None) -> BuiltGraph:
    """The worker's graph, and what the chief's --logdir gives it (no server needed).
    `input_cut`: how the worker's input is cut (the shard's plan), compared with the chief's."""
    train = config.train
    logdir = train.logdir if config.is_chief else None
    if config.is_chief and not train.logdir:
        log.info("no --logdir: nothing is saved, so a preemption (SIGTERM) or a lost ps "
                 "loses the training done so far")
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(train.seed)
        g = build_graph(config, model, example, target=target, input_cut=input_cut)
        if train.eval_every:
            evaluation.check_accuracy_metric(model, params, example)
        restore = None
        if logdir:
            # A checkpoint of another model (say, of a cluster with another number of
            # workers) would fail mid-restore with a long error: name the variable instead.
            # In sync mode global_step counts updates, so a checkpoint past the plan
            # has nothing left to train (in async mode, each worker's local steps count).
            # A damaged newest checkpoint is passed over: the chief restores the one chosen.
            transient = g.transient
            restore = checkpoints.check_checkpoint(logdir, [
                v for v in tf1.global_variables() if all(v is not t for t in transient)],
                planned=target if train.mode == "sync" else None)
        warm = _warm_start(config, g, restore)
        # The writer CheckpointSaverHook also uses (one cache per logdir): one events file.
        writer = progress_log.EventsWriter(str(logdir)) if logdir else None
    return BuiltGraph(graph, g, restore, writer, warm)


def _warm_start(config: TaskConfig, g: WorkerGraph,
                restore: checkpoints.Restorable | None) -> warm_start.Plan | None:
    """The chief's model set to start from --warm-start-from, unless its run has a checkpoint:
    a restarted chief resumes that, and never warm-starts twice."""
    settings = config.train.warm_start
    if settings is None or not config.is_chief:
        return None  # only the chief initialises the model
    if restore is not None:
        log.info("--logdir %s holds a checkpoint of this run (%s): resuming it, not warm-"
                 "starting from %s", config.train.logdir, Path(restore.path).name,
                 settings.source)
        return None
    return warm_start.warm_start(settings, g.model_variables)
