"""What a model may write in a training step, so that the proof holds for any model.

The proof says each update averaged exactly one gradient from each worker. That stays a
checkable claim only if nothing else of the model changes in a step: every variable write a
worker's step runs must be one the package made (the pushes, the counters, the tokens). A
model's own writes come in one form the package accepts, its UPDATE_OPS (batch norm's moving
statistics, say: state outside the gradient), and those it does not run in the step.

Sync: an UPDATE_OPS write `s -= d` (or `s += d`, or `s = v`, as `s -= s - v`) becomes a push
of `d` beside the gradients, through an accumulator of its own. The chief's update then applies
the average of the workers' `d` once: `s -= mean(d)`. For batch norm's moving mean with decay
m, `d = (s - batch_mean) * (1 - m)`, so each update moves it once, towards the mean of the N
workers' batch means, as one batch N times larger would. A moving variance moves towards the
mean of the workers' batch variances. The statistics are then the same whichever worker
computed them, counted like the gradients, and they do not race.

Keras layers put no update in UPDATE_OPS: Keras 3's BatchNormalization, called with
training=True, makes its two writes (`moving_mean = moving_mean * m + batch_mean * (1 - m)`)
and leaves them in the graph, run by nothing; tf_keras's makes them too (its `layer.updates`).
Such writes are the model's updates all the same (layer_updates): every write the model
function made, and nothing runs, of a float non-trainable global variable made as tf.Variable
(a Keras layer's; get_variable's go through UPDATE_OPS) is taken as if in UPDATE_OPS.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import tensorflow as tf

from sync_mnist.api import ContractError

tf1 = tf.compat.v1

_SUBTRACT = ("AssignSubVariableOp", "AssignSub")
_ADD = ("AssignAddVariableOp", "AssignAdd")
_SET = ("AssignVariableOp", "Assign")
_WRITE_PREFIXES = ("ResourceScatter", "Scatter", "ResourceApply", "Apply", "ResourceSparseApply",
                   "SparseApply",
                   # A hash table's rows change as a variable's do (growing.py's index).
                   "LookupTableInsert", "LookupTableRemove", "LookupTableImport")


def is_write(op: tf.Operation) -> bool:
    """Whether `op` writes a variable or a hash table: its first input is one (a reference or a
    resource handle). tf.scatter_nd (ScatterNd) makes a new tensor and writes nothing."""
    if not (op.type in _SUBTRACT + _ADD + _SET or op.type.startswith(_WRITE_PREFIXES)):
        return False
    first = op.inputs[0].dtype if op.inputs else None
    return first is not None and (first == tf.resource or first._is_ref_dtype)


def written(op: tf.Operation) -> str:
    """The name of the variable (or hash table) a write op writes (its first input's
    source)."""
    source = op.inputs[0].op
    while source.type == "Identity" and source.inputs:
        source = source.inputs[0].op
    return source.name


def closure(fetches: Iterable) -> list[tf.Operation]:
    """Every op that running `fetches` runs: their inputs and control inputs, transitively."""
    seen: dict[str, tf.Operation] = {}
    todo = [f if isinstance(f, tf.Operation) else f.op for f in fetches]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen[op.name] = op
            todo += [t.op for t in op.inputs] + list(op.control_inputs)
    return list(seen.values())


def layer_updates(update_ops: Sequence, model_ops: set[str], variables: dict[str, tf.Variable],
                  made_alone: frozenset[str]) -> list[tf.Operation]:
    """The writes of Keras layers' state that nothing runs, in the order they were made: each
    write the model function made of a float non-trainable global variable made as tf.Variable,
    but its initialiser and those UPDATE_OPS holds already (so that none is applied twice).

    Args:
      update_ops: what the model function added to UPDATE_OPS.
      model_ops: names of the ops the model function made.
      variables: the model's non-trainable variables by name.
      made_alone: the names of the model's variables made as tf.Variable, not by get_variable.
    """
    graph = tf1.get_default_graph()
    layers = {v.op.name: v for v in tf1.global_variables()
              if v.op.name in variables and v.op.name in made_alone and v.dtype.is_floating}
    initializers = {v.initializer.name for v in layers.values()}
    queued = {op.name for op in closure(update_ops)}
    return [op for op in graph.get_operations()
            if op.name in model_ops and is_write(op) and written(op) in layers
            and op.name not in initializers and op.name not in queued]


def state_deltas(update_ops: Sequence, model_ops: set[str],
                 variables: dict[str, tf.Variable]) -> list[tuple[tf.Tensor, tf.Variable]]:
    """(d, s) for each write of the model's UPDATE_OPS, to push and average as `s -= mean(d)`.

    Args:
      update_ops: what the model function added to UPDATE_OPS, and its layer_updates.
      model_ops: names of the ops the model function made (its writes are among them).
      variables: the model's non-trainable variables by name, the only ones it may update.

    Raises:
      ContractError: naming an update that writes anything else, or in another way.
    """
    deltas = []
    for op in closure(update_ops):
        if op.name not in model_ops or not is_write(op):
            continue
        name = written(op)
        state = variables.get(name)
        if state is None:
            raise ContractError(f"UPDATE_OPS op {op.name} ({op.type}) writes {name}, which is "
                                "not a non-trainable variable of the model: only model state "
                                "(batch norm's moving statistics, say) may be updated there")
        if op.type in _SUBTRACT:
            delta = op.inputs[1]
        elif op.type in _ADD:
            delta = -op.inputs[1]
        elif op.type in _SET:
            delta = state.read_value() - op.inputs[1]
        else:
            raise ContractError(f"the model's update op {op.name} ({op.type}; in UPDATE_OPS, or a "
                                f"Keras layer's) writes {name} in a way sync_mnist cannot "
                                "average over the workers: use assign, assign_add or assign_sub")
        deltas.append((tf.identity(delta, name=f"{op.name}/sync_delta"), state))
    return deltas


MOVING_STATISTIC = re.compile(r"(^|/)moving_(mean|variance)(_\d+)?$")  # a batch norm's


def frozen_statistics(model_ops: set[str], deltas: Sequence) -> str | None:
    """The warning for the batch norm moving statistics of the model that nothing in training
    writes (None: there are none): they keep their start all the run, and the evaluation and
    the SavedModel normalise by them. A Keras BatchNormalization called with training=False
    in training writes none. A warning, not a refusal: statistics frozen on purpose (a
    fine-tune's) are frozen so too."""
    written = {s.op.name for _, s in deltas}
    frozen = [v.op.name for v in tf1.global_variables()
              if v.op.name in model_ops and not v.trainable
              and MOVING_STATISTIC.search(v.op.name) and v.op.name not in written]
    if not frozen:
        return None
    more = f" (and {len(frozen) - 1} more)" if len(frozen) > 1 else ""
    return (f"the model's batch norm statistic {frozen[0]}{more} is never updated in training: "
            "nothing writes it (no UPDATE_OPS op, no Keras layer's update), so it keeps its "
            "start all the run. Unless frozen on purpose, call the layer with "
            "training=(mode == ModeKeys.TRAIN)")


def check_step(fetches: Iterable, model_ops: set[str]) -> None:
    """Raises ContractError if a worker's step runs a write that the model function made.

    Such a write (an UPDATE_OPS op put under the loss's control dependencies, as TF1 code puts
    it under the train op's, or any assign) would change the model outside the aggregated
    update, on every worker, unaveraged and uncounted.
    """
    for op in closure(fetches):
        if op.name in model_ops and is_write(op):
            raise ContractError(
                f"the training step writes {written(op)} outside the aggregated update (op "
                f"{op.name}, {op.type}): leave UPDATE_OPS out of the loss's dependencies; "
                "sync_mnist averages them over the workers, once per update")


def check_update_only(fetches: Iterable, names: set[str], what: str) -> None:
    """Raises RuntimeError if running `fetches` (a worker's step) writes one of `names`: state
    that only the chief's update may write, once for all workers (a growing table's rows, ids
    and index: growing.py). A package defect, not the model's."""
    for op in closure(fetches):
        if is_write(op) and written(op) in names:
            raise RuntimeError(f"a worker's step writes {written(op)} ({op.name}, {op.type}), "
                               f"which only the update may write: {what}")
