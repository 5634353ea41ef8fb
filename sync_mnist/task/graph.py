"""A worker's graph: the model's variables on the ps tasks, its step on this worker, and the
synchronous update, counters and stop around them (sync.py, membership.py, early_stop.py).

Lines that exist only because training is distributed and synchronous carry a `# Sync:` tag.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import tensorflow as tf

from sync_mnist import api
from sync_mnist.core import (audit, early_stop, growing, membership, optimizers, placement,
                             protocol, stream, sync)
from sync_mnist.core.config import ConfigError, TaskConfig
from sync_mnist.task import inputs

tf1 = tf.compat.v1
log = logging.getLogger(__name__)


class WorkerGraph(NamedTuple):
    """What build_graph makes: the ops every phase of a worker's run uses."""

    features: object  # placeholders: one, or a dict of them, as the shard holds the features
    labels: tf.Tensor
    spec: api.ModelSpec  # the model function's TRAIN spec: its loss and train_metrics
    model_settings: dict  # Sync: the model's params and variables, compared with the chief's
    state: sync.SharedState
    training: sync.SyncTraining
    members: membership.Membership  # Sync: published settings, last pushes, the finish barrier
    report_done: tf.Operation  # Sync: one entry in every ps's done-queue
    stop_vars: early_stop.StopVars  # on ps 0: the update the cluster stops on, if any
    stop: early_stop.StopOps  # Sync: the stop's read after each token, and its requests
    # The model function's variables, trainable or not, named as a checkpoint holds them
    # (a variable cut over the ps, whole): what --warm-start-from may initialise.
    model_variables: tuple[str, ...] = ()
    example_uses: tf.Variable | None = None  # --count-examples: each id's uses (sync.py)
    example_pass: tf.Tensor | None = None  # --count-examples: the batch's pass, fed (from 0)
    positions: stream.PositionVars | None = None  # each worker's saved input positions

    @property
    def transient(self) -> list[tf.Variable]:
        """Variables on the ps that checkpoints leave out."""
        return self.members.transient + self.stop_vars.transient

    def feed(self, features, labels, passed: int = 0) -> dict:
        """The feed_dict of one batch, of pass `passed` (from 0)."""
        feed = {**placement.feed(self.features, features), self.labels: labels}
        if self.example_pass is not None:
            feed[self.example_pass] = passed
        return feed


def build_graph(config: TaskConfig, model: api.Model, example: tuple, num_tokens: int = 0,
                target: int | None = None, input_cut: str | None = None) -> WorkerGraph:
    """This worker's graph: variables on the ps tasks, computation on this worker.

    `example` is a batch (features, labels) of the shard, for the placeholders' dtypes and
    shapes. num_tokens is 0 for the fixed setup; question.py passes -1, the stock default.
    The model's params and variables, and how the input is cut (`input_cut`), are published by
    the chief and compared by the others.
    `target` (the run's length: updates in sync mode, local steps per worker in async mode)
    sets how long the learning rate takes to decay with --lr-decay cosine.
    """
    n, i = config.cluster.num_workers, config.index
    train, params = config.train, inputs.model_params(config, model)
    features, labels = placement.placeholders(*example)
    recorded = placement.record(model.model_fn, features, labels, api.ModeKeys.TRAIN, params)
    model_settings = membership.model_settings(params, placement.fingerprint(recorded),
                                               input_cut)
    shared = protocol.build_shared(config, model_settings)  # Sync: first, as all tasks
    # Sync: between-graph replication. Variables go onto the ps tasks (the model's, cut into
    # one slice per ps: placement.py); every other op stays on this worker.
    setter = tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{i}",
                                             cluster=config.cluster.spec())
    # global_step counts updates in sync mode, and every worker's local steps in async mode.
    decay_steps = None if train.lr_decay == "none" or not target or \
        target == stream.UNTIL_INPUT_ENDS else (
        target * n if train.mode == "async" else target)
    with tf1.device(setter):
        built = placement.build(model.model_fn, features, labels, api.ModeKeys.TRAIN, params,
                                num_ps=config.cluster.num_ps, wire_dtype=train.wire_dtype,
                                recorded=recorded)
        spec = built.spec
        if not tf1.trainable_variables():
            raise api.ContractError("the model function made no trainable variables: nothing "
                                    "to train")
        # Sync: the proof holds for any model: its step writes nothing, and its updates
        # (moving statistics) are averaged over the workers once per update (audit.py).
        audit.check_step([spec.loss, *spec.train_metrics.values()], built.ops)
        state_deltas = _state_deltas(built, config.is_chief)
        uses, passed = _example_uses(train, features, config.train.aggregate(n), state_deltas)
        optimizer = spec.optimizer or _command_line_optimizer(train, decay_steps, target,
                                                              shared.state.global_step)
        # Sync: each update may latch the stop, asked for by --target-accuracy or a preempted
        # task (early_stop.py).
        latch = (lambda new_step: early_stop.latch(shared.stop, new_step, target)) \
            if train.mode == "sync" and target else None
        training = sync.build_train_op(
            spec.loss, shared.state, optimizer,
            worker_index=i, num_workers=n, replicas_to_aggregate=config.train.aggregate(n),
            is_chief=config.is_chief, mode=config.train.mode, num_tokens=num_tokens,
            last_push=shared.members.last_push, proof=config.train.proof, after_update=latch,
            wire_dtype=train.wire_dtype, state_deltas=state_deltas,
            tables=growing.tables())
        _check_growing_tables(train, training)
        stop = early_stop.build_stop_ops(shared.stop, training.token_on_ps,
                                         shared.state.global_step, train.mode)
    report_done = tf.group(*[q.enqueue(i) for q in shared.done_queues])
    return WorkerGraph(features, labels, spec, model_settings, shared.state, training,
                       shared.members, report_done, shared.stop, stop,
                       tuple(r.name for r in recorded), uses, passed, stream.build_position_vars(n))


def _check_growing_tables(train, training: sync.SyncTraining) -> None:
    """Refuses a warm start of a growing table; checks that a step writes none of its state."""
    for table in growing.tables():
        if train.warm_start is not None:
            # Its index (id -> row) is a hash table, which warm_start.py does not read: the
            # rows would come without the ids that find them.
            raise ConfigError(f"--warm-start-from: the growing table {table.settings.name} "
                              "cannot be warm-started yet")
        # Sync: a growing table changes in the update alone, the same for every worker.
        audit.check_update_only([training.train_op], table.state_names,
                                f"the growing table {table.settings.name}")


def _state_deltas(built: placement.Built, is_chief: bool) -> list:
    """(d, s) for each of the model's updates (audit.state_deltas): its UPDATE_OPS, and the
    writes its Keras layers leave for nothing to run (audit.layer_updates). The chief names
    the batch norm statistics that nothing writes (audit.frozen_statistics)."""
    updates = [*built.update_ops, *audit.layer_updates(built.update_ops, built.ops,
                                                       built.state, built.made_alone)]
    deltas = audit.state_deltas(updates, built.ops, built.state)
    frozen = audit.frozen_statistics(built.ops, deltas)
    if frozen and is_chief:
        log.warning(frozen)
    return deltas


def _command_line_optimizer(train, decay_steps: int | None, target: int | None,
                            global_step: tf.Variable) -> tf1.train.Optimizer:
    """The optimizer --optimizer, --learning-rate and --lr-decay make, for a model function
    that brings none of its own (a model's own optimizer the flags never touch)."""
    if train.lr_decay == "cosine" and target == stream.UNTIL_INPUT_ENDS:
        log.warning("--lr-decay cosine needs the run's length, which with --epochs over a "
                    "streamed input is known only when the input ends: the optimizer the "
                    "command line makes keeps --learning-rate (give --train-steps to decay)")
    return optimizers.make_optimizer(train.optimizer, train.learning_rate,
                                     decay_steps=decay_steps, global_step=global_step)


def _example_uses(train, features, replicas: int,
                  state_deltas: list) -> tuple[tf.Variable | None, tf.Tensor | None]:
    """--count-examples: each id's uses, counted by the updates themselves (sync.py), its
    delta appended to `state_deltas`, and the placeholder of the batch's pass; Nones without
    the option."""
    if not train.count_examples:
        return None, None
    uses = sync.build_example_uses(train.count_examples_ids)
    passed = tf1.placeholder(tf.int32, [], name="example_pass")
    state_deltas.append(sync.example_uses_delta(_ids(features, train.count_examples), passed,
                                                uses, replicas))
    return uses, passed


def _ids(features, name: str) -> tf.Tensor:
    """The batch's --count-examples feature: integers, one an example. Raises ConfigError
    naming the features there are, or the feature's dtype and shape."""
    columns = features if isinstance(features, dict) else {}
    if name not in columns:
        raise ConfigError(f"--count-examples {name}: the training data has no feature {name!r} "
                          f"(its features: {', '.join(sorted(map(str, columns))) or 'one array, unnamed'})")
    ids = columns[name]
    if isinstance(ids, tf.SparseTensor) or not ids.dtype.is_integer or \
            ids.shape[1:].num_elements() != 1:
        raise ConfigError(f"--count-examples {name}: the feature is {ids.dtype.name} of shape "
                          f"{ids.shape}: give an integer id, one an example")
    return ids
