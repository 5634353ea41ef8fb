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
such as batch norm's moving statistics), never global_step, the counters or the optimizer's
slots, which belong to this run. Every check is made before training and is bad input
(ConfigError, exit 2): a PATH that is no checkpoint or SavedModel, a regex that chooses
nothing, a name the source lacks, a shape or dtype that differs.
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
    # A complete name map: warm_start then takes the source as written by name (tf1 Saver,
    # Estimator, this package), as this module checked it.
    tf1.train.warm_start(source, vars_to_warm_start=[s for n in names for s in wholes[n].slices],
                         var_name_to_prev_var_name=names)
    return Plan(settings.source, source, names)


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
    if plan is None or plan.source not in str(error):
        return None
    return ConfigError(f"--warm-start-from {plan.given}: a ps could not read {plan.source} "
                       f"({first_line(error)}): each ps reads its own variables' values from "
                       "it, so it must be at that path on every ps's host")
