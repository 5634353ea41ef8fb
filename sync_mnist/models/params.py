"""`--param KEY=VALUE`: the one door from the command line to a model's `params`.

A model's own `params` (sync_mnist.api.Model) name the options it takes, and their defaults
their types: a value on the command line is read as its default's type (a bool, an int, a
float, a string, or a list of one of these, comma-separated), so that "3" reaches a model
as 3 where its default is 2. A key the model does not have is refused, never ignored, and so
is a value its type cannot read. The options SPELLED (the built-in models' data: --dataset,
--data-dir, --train-files, --eval-files) are the same door: each reaches the model's param of
its name, and a model without that param refuses it.

This module imports only the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from sync_mnist.core.config import ConfigError

# What a bool param reads, as argparse's own choices would be written.
_BOOLEANS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
_SCALARS = (bool, int, float, str)
# The params the package sets itself, with the option that sets them.
OWN = {"seed": "--seed"}
# The params the command line also spells as options of their own, and those options: the
# built-in models' data (mlp's and cnn's dataset and data_dir, ctr's data_dir or files). A
# value of one is named by its option in an error, however it was given.
SPELLED = {"dataset": "--dataset", "data_dir": "--data-dir", "train_files": "--train-files",
           "eval_files": "--eval-files"}


def add_spelled_options(g) -> None:
    """The options SPELLED, in an argparse group of the command line: each a param of the
    built-in models' data under its own name (--data-dir DIR is --param data_dir=DIR)."""
    g.add_argument(SPELLED["dataset"], default=None, choices=("mnist", "synthetic"),
                   help="for the built-in mlp and cnn: mnist, the complete MNIST (60,000 "
                        "train / 10,000 test digits); synthetic: generated, not digits, "
                        "for tests; --param dataset=NAME (default: mnist)")
    g.add_argument(SPELLED["data_dir"], type=Path, default=None,
                   help="for the built-in mlp and cnn: a directory with your own MNIST: "
                        "the four IDX files (raw or .gz) or mnist.npz; for ctr: a click "
                        "log written by sync-mnist-clicks (its train-* and eval-* files); "
                        "--param data_dir=DIR, for any model that has it (default: none: the "
                        "MNIST that ships with sync_mnist; ctr generates its clicks)")
    g.add_argument(SPELLED["train_files"], default=None, metavar="PATTERN",
                   help="for ctr: the click log to train on, comma-separated globs of "
                        "Criteo TSV files (a label, 13 integer, 26 hexadecimal columns; "
                        ".gz too) or TFRecord files (.tfrecord, .tfrecord.gz); with "
                        "--eval-files (default: none)")
    g.add_argument(SPELLED["eval_files"], default=None, metavar="PATTERN",
                   help="for ctr: the clicks to evaluate on, as --train-files (default: "
                        "none)")


def parse(text: str) -> tuple[str, str]:
    """(KEY, VALUE) of `--param KEY=VALUE`; ConfigError naming the text otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise ConfigError(f"--param {text!r}: not KEY=VALUE with KEY a Python name "
                          "(--param hidden_units=512,512, say)")
    if key in OWN:
        raise ConfigError(f"--param {text!r}: {key} is {OWN[key]}'s, not a param of the "
                          "model's")
    return key, value


def given(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """{KEY: VALUE} of the --param pairs, in order; a KEY given twice is refused."""
    seen: dict[str, str] = {}
    for key, value in pairs:
        if key in seen:
            raise ConfigError(f"--param {key} is given twice ({key}={seen[key]} and "
                              f"{key}={value}): give it once")
        seen[key] = value
    return seen


def of(model, train) -> dict[str, Any]:
    """The params the functions of `model` (a sync_mnist.api.Model) are given in a run of
    `train` (a TrainConfig): the model's defaults, the values given (train.params) typed by
    them, and the seed.

    Raises:
      ConfigError: as `typed`.
    """
    return {**model.params, **typed(model.params, train.params, train.model),
            "seed": train.seed}


def typed(defaults: Mapping[str, Any], values: Mapping[str, str],
          spec: str) -> dict[str, Any]:
    """`values` ({KEY: text}) read as the types of the model's `defaults`.

    Raises:
      ConfigError: a KEY the model has no param of, or a text its default's type cannot read;
        the message names the option (--param KEY=, or one of SPELLED), the value and the
        model.
    """
    typed_values = {}
    for key, text in values.items():
        shown = f"{SPELLED[key]} {text}" if key in SPELLED else f"--param {key}={text}"
        if key not in defaults:
            names = ", ".join(sorted(k for k in defaults if k not in OWN)) or "none"
            raise ConfigError(f"{shown}: --model {spec} has no param {key!r}, so it would be "
                              f"ignored (its params: {names})")
        typed_values[key] = _read(shown, text, defaults[key], spec)
    return typed_values


def _read(shown: str, text: str, default: Any, spec: str) -> Any:
    if default is None or isinstance(default, str):
        return text
    if isinstance(default, (bool, int, float)):
        return _scalar(shown, text, type(default), default)
    if isinstance(default, (list, tuple)) and default and \
            len({type(v) for v in default}) == 1 and type(default[0]) in _SCALARS:
        kind = type(default[0])
        items = [_scalar(shown, part.strip(), kind, default) for part in text.split(",")]
        return type(default)(items)
    raise ConfigError(f"{shown}: --model {spec}'s default for it is {default!r}, a "
                      f"{type(default).__name__} --param cannot write; set it in the model's "
                      "params")


def _scalar(shown: str, text: str, kind: type, default: Any) -> Any:
    try:
        if kind is bool:
            return _BOOLEANS[text.lower()]
        return kind(text)
    except (KeyError, ValueError):
        name = {bool: "true or false", int: "a whole number", float: "a number",
                str: "text"}[kind]
        raise ConfigError(f"{shown}: {text!r} is not {name}, as the model's default "
                          f"{default!r} is") from None
