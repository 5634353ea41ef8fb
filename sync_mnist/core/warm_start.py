"""Warm start: a new run's model initialised from another run's checkpoint or SavedModel, as
the Estimator's `WarmStartSettings` did it (EasyRec's daily fine-tune: yesterday's model into
today's). `--warm-start-from PATH`, `--warm-start-vars REGEX` and `--warm-start-map NAME=PREV`
are its `ckpt_to_initialize_from`, `vars_to_warm_start` and `var_name_to_prev_var_name`.

Only the chief's graph is warm-started, and only when its run has no checkpoint of its own
(task/prepare.py decides): `tf.compat.v1.train.warm_start` rewrites the chosen variables'
initialisers to read the source, so they take its values exactly when the chief initialises
the model, and never when it restores its own checkpoint or finds the model on the ps.

Sync: each variable's initialiser runs where the variable lives, so each ps reads its own
slices from the source (RestoreV2 on its device), sliced as this run cuts them whatever the
number of ps the source was written with. PATH must be readable by every ps at that path, as
--logdir must be.

What is warm-started: the variables the model function makes (trainable, and its own state
such as batch norm's moving statistics), and the optimizer's state of the chosen ones where
the source holds it as this run has it: each one's slots (FTRL's accumulators, Adagrad's,
Adam's moments) and, with Adam's moments, Adam's beta powers. FTRL computes its weights from
its slots: started afresh, its first update all but erases a warm-started linear part (the
Estimator's warm start did so, as it left the slots out), so a slot the source lacks (a
SavedModel holds none) is named before training. Never global_step or the counters, which
belong to this run. Every check is made before training and is bad input (ConfigError, exit
2): a PATH that is no checkpoint or SavedModel, a regex that chooses nothing, a name the
source lacks, a shape or dtype that differs.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

import tensorflow as tf

from sync_mnist.core import placement
from sync_mnist.core.config import ConfigError, WarmStart, first_line

tf1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the chief's graph was set to warm-start."""

    given: str  # --warm-start-from as given
    source: str  # the checkpoint read (a prefix): the newest of a directory, a SavedModel's own
    names: dict[str, str]  # {this model's variable: its name in the source}, in model order
    state: dict[str, str] = dataclasses.field(default_factory=dict)  # the optimizer's, alike
    fresh: list[str] = dataclasses.field(default_factory=list)  # slots the source lacks


def warm_start(settings: WarmStart, model_variables: Sequence[str]) -> Plan:
    """Sets the initialisers of the chosen variables of the current graph to read `settings`'
    source; returns what it set.

    Args:
      settings: --warm-start-from and what goes with it.
      model_variables: the names of the variables the model function makes, as a checkpoint
        holds them (a variable cut over the ps is named whole): the ones that may be chosen.

    Raises:
      ConfigError: the source is no checkpoint or SavedModel, or cannot be read; the regexes
        choose nothing; a name of --warm-start-map is not chosen or not in the source; a chosen
        variable is not in the source, or has another shape or dtype there.
    """
    source = source_checkpoint(settings.source)
    try:
        reader = tf.train.load_checkpoint(source)
        dtypes = reader.get_variable_to_dtype_map()
        held = {name: (shape, dtypes[name])
                for name, shape in reader.get_variable_to_shape_map().items()}
    except (tf.errors.OpError, ValueError) as e:
        raise ConfigError(f"--warm-start-from {settings.source}: cannot read {source}: "
                          f"{first_line(e)}") from None
    wholes = placement.whole_variables(tf1.global_variables())
    names = _chosen(settings, [n for n in model_variables if n in wholes])
    for name, prev in names.items():
        _check_held(settings, name, prev, wholes[name], held)
    state, fresh = _optimizer_state(names, wholes, held, set(model_variables))
    # A complete name map: warm_start then takes the source as written by name (tf1 Saver,
    # Estimator, this package), as this module checked it.
    taken = {**names, **state}
    tf1.train.warm_start(source, vars_to_warm_start=[s for n in taken for s in wholes[n].slices],
                         var_name_to_prev_var_name=taken)
    return Plan(settings.source, source, names, state, fresh)


ADAM_POWERS = re.compile(r"(.*/)?beta[12]_power(_\d+)?$")  # Adam's, beside its first variable


def _optimizer_state(names: dict[str, str], wholes: dict, held: dict,
                     model: set[str]) -> tuple[dict[str, str], list[str]]:
    """({optimizer variable: its name in the source} to take, [slots the source lacks]).

    A slot of a chosen variable is named after it (`dense/kernel/Adam_1`, `linear/.../weights/
    Ftrl`); it is taken where the source holds it under the variable's name there with this
    shape and dtype. Adam's beta powers go with its moments: a moment taken with the powers
    started afresh would be corrected as if it had seen one step.
    """
    state, fresh = {}, []
    for name, whole in wholes.items():
        if name in model:
            continue
        primary = max((n for n in names if name.startswith(n + "/")), key=len, default=None)
        if primary is None:
            continue
        prev = names[primary] + name[len(primary):]
        if _fits(held.get(prev), whole):
            state[name] = prev
        else:
            fresh.append(name)
    if any(re.search(r"/Adam(_1)?$", name) for name in state):
        state.update((name, name) for name, whole in wholes.items()
                     if ADAM_POWERS.match(name) and _fits(held.get(name), whole))
    return state, fresh


def fresh_line(plan: Plan) -> str:
    """The warning for the slots the source lacks, which start afresh."""
    ftrl = [n for n in plan.fresh if re.search(r"/Ftrl(_1)?$", n)]
    why = (f"; FTRL computes its weights from its slots, so its first update moves "
           f"{ftrl[0].rsplit('/', 1)[0]} and the rest of its part far from the source's"
           if ftrl else "")
    return (f"--warm-start-from {plan.given} holds no {plan.fresh[0]}"
            + (f" nor {len(plan.fresh) - 1} more of the optimizer's slots"
               if len(plan.fresh) > 1 else "")
            + f" as this run has them: they start afresh{why}")


def _fits(there: tuple | None, whole: placement.Whole) -> bool:
    """Whether the source's (shape, dtype), if any, is `whole`'s."""
    return there is not None and list(there[0]) == whole.shape and \
        there[1].base_dtype == whole.slices[0].dtype.base_dtype


def source_checkpoint(given: str) -> str:
    """The checkpoint (its prefix) that --warm-start-from `given` names: itself, the newest of
    a directory's `checkpoint` file, or a SavedModel's DIR/variables/variables. A local path is
    made absolute: the ps tasks read it, each from its own working directory."""
    exists = tf.io.gfile.exists
    path = given if "://" in given else os.path.abspath(given)
    if exists(f"{path}.index"):
        return path
    if exists(os.path.join(path, "saved_model.pb")) or exists(
            os.path.join(path, "saved_model.pbtxt")):
        prefix = os.path.join(path, "variables", "variables")
        if not exists(f"{prefix}.index"):
            raise ConfigError(f"--warm-start-from {given} is a SavedModel without variables "
                              f"({prefix}.index does not exist)")
        return prefix
    if exists(os.path.join(path, "checkpoint")):
        try:
            state = tf.train.get_checkpoint_state(path)
        except ValueError:  # empty, or not a CheckpointState
            state = None
        newest = state.model_checkpoint_path if state else ""
        if not newest or not exists(f"{newest}.index"):
            raise ConfigError(f"--warm-start-from {given}: its checkpoint file names no "
                              f"checkpoint that exists ({newest or 'none'})")
        return newest
    if not exists(path):
        raise ConfigError(f"--warm-start-from {given} does not exist (nor does {given}.index)")
    raise ConfigError(f"--warm-start-from {given} is neither a checkpoint (no {given}.index), "
                      "a directory of checkpoints (no checkpoint file in it) nor a SavedModel "
                      "(no saved_model.pb in it)")


def _chosen(settings: WarmStart, candidates: list[str]) -> dict[str, str]:
    """{variable: its name in the source} for the candidates a regex matches, in order."""
    chosen = [n for n in candidates if any(re.match(r, n) for r in settings.variables)]
    if not chosen:
        raise ConfigError(f"--warm-start-vars {' '.join(settings.variables)} matches none of "
                          f"the model's {len(candidates)} variables ("
                          + ", ".join(candidates[:3]) + (", ..." if len(candidates) > 3 else "")
                          + ")")
    for name, prev in settings.prev_names:
        if name not in chosen:
            why = ("is not among the variables --warm-start-vars chooses" if name in candidates
                   else "is not a variable of the model")
            raise ConfigError(f"--warm-start-map {name}={prev}: {name} {why}")
    prev_names = dict(settings.prev_names)
    return {n: prev_names.get(n, n) for n in chosen}


def _check_held(settings: WarmStart, name: str, prev: str, whole: placement.Whole,
                held: dict) -> None:
    """Raises ConfigError unless the source holds `prev` as `whole`'s shape and dtype."""
    mapped = f"--warm-start-map {name}={prev}: " if prev != name else ""
    if prev not in held:
        raise ConfigError(
            f"{mapped}--warm-start-from {settings.source} has no variable {prev}" + (
                "" if mapped else f" (shape {whole.shape} here): leave it out with "
                                  f"--warm-start-vars, or name it there with --warm-start-map "
                                  f"{name}=PREV_NAME"))
    shape, dtype = held[prev]
    here = whole.slices[0].dtype.base_dtype
    there = f"{prev} has" if mapped else f"{name} has"
    if list(shape) != whole.shape:
        raise ConfigError(f"{mapped}--warm-start-from {settings.source}: {there} shape "
                          f"{list(shape)} there, {whole.shape} here")
    if dtype.base_dtype != here:
        raise ConfigError(f"{mapped}--warm-start-from {settings.source}: {there} dtype "
                          f"{dtype.base_dtype.name} there, {here.name} here")


def unreadable(plan: Plan | None, error: tf.errors.OpError) -> ConfigError | None:
    """The ConfigError for a warm start whose source a ps could not read, as the chief
    initialised the model (it was read where the chief checked it); None for any other error."""
    if plan is None:
        return None
    if isinstance(error, (tf.errors.OutOfRangeError, tf.errors.DataLossError)) and \
            "checkpoint_initializer" in error.message:  # warm_start's readers: the data
        return ConfigError(f"--warm-start-from {plan.given}: {plan.source} is damaged: its "
                           f"index lists values its data does not hold whole "
                           f"({_tensorflow_reason(error)}); a checkpoint cut short as it was "
                           "copied or written?")
    if plan.source not in str(error):
        return None
    return ConfigError(f"--warm-start-from {plan.given}: a ps could not read {plan.source} "
                       f"({first_line(error)}): each ps reads its own variables' values from "
                       "it, so it must be at that path on every ps's host")


def _tensorflow_reason(error: tf.errors.OpError) -> str:
    """TensorFlow's own words in `error`: the line before the node it names."""
    lines = [line.strip() for line in error.message.splitlines()]
    at = next((k for k, line in enumerate(lines) if line.startswith("[[{{node")), len(lines))
    return next((line for line in reversed(lines[:at]) if line), first_line(error))
