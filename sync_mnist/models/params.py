"""`--param KEY=VALUE`: the one door from the command line to a model's `params`.

A model's own `params` (sync_mnist.api.Model) name the options it takes, and their defaults
their types: a value on the command line is read as its default's type (a bool, an int, a
float, a string, or a list of one of these, comma-separated), so that "3" reaches a model
as 3 where its default is 2. A key the model does not have is refused, never ignored, and so
is a value its type cannot read. The data options (--dataset, --data-dir, --train-files,
--eval-files) are the same door: each reaches the model's param of its name, and a model
without that param refuses it.

This module imports only the standard library.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sync_mnist.core.config import ConfigError

# What a bool param reads, as argparse's own choices would be written.
_BOOLEANS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
_SCALARS = (bool, int, float, str)
# The params the package sets itself, with the option that sets them.
OWN = {"seed": "--seed"}


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


def typed(defaults: Mapping[str, Any], values: Mapping[str, str], spec: str,
          flags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`values` ({KEY: text}) read as the types of the model's `defaults`.

    flags: {KEY: the option that gave it} for a value not given as --param KEY=... (the data
    options), named in the errors instead.

    Raises:
      ConfigError: a KEY the model has no param of, or a text its default's type cannot read;
        the message names the option, the value and the model.
    """
    flags = flags or {}
    typed_values = {}
    for key, text in values.items():
        option = flags.get(key, f"--param {key}=")
        shown = f"{option} {text}" if key in flags else f"{option}{text}"
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
