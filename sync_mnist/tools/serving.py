"""Any model's SavedModel, answering examples: `sync-mnist predict` on JSON lines or TFRecords.

This runs in TensorFlow 2's eager mode and calls one signature of the SavedModel that
tf.saved_model.load gives, as a TensorFlow Serving client calls it by name. What an example is
depends on the signature's inputs:
  - a signature that takes serialized tf.train.Examples (one string input [None] named
    "inputs" or "examples", as api.parsing_serving_input_fn and the Estimator's parsing
    receiver made it): each TFRecord is one serialized Example; each JSON line an object of
    the Example's features, {"age": 39.0, "color": ["red", "blue"]}: a number or a string, or a
    flat list of them (numbers with a decimal point make a float_list, whole numbers an
    int64_list, strings a bytes_list);
  - any other signature: each JSON line an object {input name: value}, one example's value of
    every input ({"ids": [3, 1, 4, 1, 5, 9, 2, 6]}).
Each example's answer is one JSON line, {output name: value}.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import tensorflow as tf

from sync_mnist.core.config import ConfigError
from sync_mnist.task import preflight

BATCH = 256  # examples per call of the signature
EXAMPLE_INPUTS = ("inputs", "examples")  # classify/regress's input, and the parsing receiver's
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")
TFRECORD_FRAMING = 16  # bytes around each record: its length (8), and two checksums (4 each)

Row = tuple[str, dict]  # (where it came from: "FILE line N", {input name: one example's value})


class ModelError(Exception):
    """The model directory is missing, holds no SavedModel, or not the signature asked for."""


class InputError(Exception):
    """An input file or one of its examples is not what the signature takes; names it."""


def load(model_dir: Path):
    """The SavedModel in `model_dir`, loaded with tf.saved_model.load; ModelError otherwise."""
    model_dir = Path(model_dir)
    try:
        preflight.check_model_dir(model_dir)
    except ConfigError as e:
        raise ModelError(str(e)) from None
    try:
        return tf.saved_model.load(str(model_dir))
    except (OSError, ValueError, tf.errors.OpError) as e:
        raise ModelError(f"{model_dir}: the SavedModel cannot be loaded: "
                         f"{str(e).strip().splitlines()[0]}") from None


@dataclasses.dataclass(frozen=True)
class Signature:
    """One signature of a loaded SavedModel: its name, its function and its inputs."""

    name: str
    function: Callable
    inputs: dict  # {input name: tf.TensorSpec}, batch first
    loaded: Any  # the SavedModel, which owns the variables the function reads

    @property
    def takes_examples(self) -> bool:
        (name, spec), *others = self.inputs.items()
        return not others and name in EXAMPLE_INPUTS and spec.dtype == tf.string and \
            spec.shape.rank == 1

    def describe(self) -> str:
        """'ids (int64 [None, 8]), ...': what the signature takes."""
        return ", ".join(f"{name} ({spec.dtype.name} {spec.shape.as_list()})"
                         for name, spec in self.inputs.items())


def signature(model_dir: Path, name: str) -> Signature:
    """The signature `name` of the SavedModel in model_dir; ModelError naming the ones it has."""
    loaded = load(model_dir)
    function = loaded.signatures.get(name)
    if function is None:
        raise ModelError(f"{model_dir}: no signature {name!r}; it has "
                         f"{', '.join(sorted(loaded.signatures)) or 'none'}")
    inputs = dict(sorted(function.structured_input_signature[1].items()))
    if not inputs:
        raise ModelError(f"{model_dir}: signature {name!r} takes no input")
    for key, spec in inputs.items():
        if spec.shape.rank == 0:
            raise ModelError(f"{model_dir}: signature {name!r}: input {key!r} is a scalar: "
                             "predict feeds examples in batches, one row each")
    return Signature(name, function, inputs, loaded)


def input_format(path: Path) -> str:
    """A file's format from its name: .png, a TFRecord suffix (then maybe .gz), else JSON
    lines (and "-", standard input)."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    if suffixes[-1:] == [".png"]:
        return "png"
    return "tfrecord" if suffixes[-1:] and suffixes[-1] in TFRECORD_SUFFIXES else "jsonl"


def rows(path: Path, kind: str, sig: Signature) -> Iterator[Row]:
    """The examples of one input file, as the signature takes them."""
    if kind == "tfrecord":
        return _tfrecord_rows(Path(path), sig)
    return _json_rows(Path(path), sig)


def _json_rows(path: Path, sig: Signature) -> Iterator[Row]:
    with _open_text(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                example = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: not JSON: {e.msg}") from None
            if not isinstance(example, dict):
                raise InputError(f"{where}: not a JSON object but {type(example).__name__}")
            if sig.takes_examples:
                yield where, {next(iter(sig.inputs)): _string(example_bytes(example, where))}
            else:
                yield where, _input_values(example, sig, where)


def _open_text(path: Path):
    if str(path) == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8")
    try:
        return open(path, encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot be read: {e.strerror or e}") from None


def example_bytes(features: dict, where: str) -> bytes:
    """A serialized tf.train.Example of a JSON object's features."""
    feature = {}
    for key, value in features.items():
        values = value if isinstance(value, list) else [value]
        if all(isinstance(v, str) for v in values):
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[v.encode() for v in values]))
        elif not all(isinstance(v, (int, float)) for v in values):
            raise InputError(f"{where}: feature {key!r}: a feature is a number, a string, or a "
                             f"flat list of one of them, not {json.dumps(value)[:80]}")
        elif any(isinstance(v, float) for v in values):
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        else:
            try:
                feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            except ValueError:
                raise InputError(f"{where}: feature {key!r}: {value} is not a 64-bit "
                                 "integer") from None
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _string(value: bytes) -> np.ndarray:
    """A string as numpy holds it for TensorFlow: an object array keeps every byte, where
    numpy's own bytes type drops trailing zero bytes (a serialized Example may end in one)."""
    return np.asarray(value, dtype=object)


def _input_values(example: dict, sig: Signature, where: str) -> dict:
    unknown = sorted(set(example) - set(sig.inputs))
    missing = sorted(set(sig.inputs) - set(example))
    if unknown or missing:
        what = f"no input {missing[0]!r}" if missing else f"{unknown[0]!r} is no input"
        raise InputError(f"{where}: {what}: signature {sig.name!r} takes {sig.describe()}")
    values = {}
    for name, spec in sig.inputs.items():
        try:
            value = np.asarray(example[name], dtype=spec.dtype.as_numpy_dtype)
            if spec.dtype == tf.string and not all(isinstance(v, str) for v in value.flat):
                raise TypeError("not all of it is strings")
            _exact(np.asarray(example[name], dtype=object), spec.dtype)
        except (ValueError, TypeError, OverflowError) as e:
            raise InputError(f"{where}: input {name!r} is not {spec.dtype.name}: {e}") from None
        if spec.shape.rank is not None and not spec.shape[1:].is_compatible_with(value.shape):
            raise InputError(f"{where}: input {name!r} has shape {list(value.shape)}; one "
                             f"example of {spec.shape.as_list()} has {spec.shape[1:].as_list()}")
        values[name] = value
    return values


def _exact(given: np.ndarray, dtype: tf.DType) -> None:
    """Raises TypeError for a JSON value numpy would convert to `dtype` with a loss: true or
    false for a number, a fraction for an integer (np.asarray takes 1.9999 as 1)."""
    for v in given.flat:
        if isinstance(v, bool) and dtype != tf.bool:
            raise TypeError(f"{json.dumps(v)} is not a number")
        if dtype.is_integer and not isinstance(v, int):
            raise TypeError(f"{json.dumps(v)} is not a whole number")


def _tfrecord_rows(path: Path, sig: Signature) -> Iterator[Row]:
    if not sig.takes_examples:
        raise InputError(f"{path}: TFRecords of tf.train.Example need a signature that takes "
                         f"serialized Examples; signature {sig.name!r} takes {sig.describe()}: "
                         "give it JSON lines")
    if not path.is_file():
        raise InputError(f"{path}: cannot be read: no such file")
    records = tf.data.TFRecordDataset(str(path), compression_type="GZIP" if
                                      path.suffix.lower() == ".gz" else "")
    name, read, count = next(iter(sig.inputs)), 0, 0
    try:
        for number, record in enumerate(records.as_numpy_iterator(), 1):
            where = f"{path} record {number}"
            try:
                tf.train.Example.FromString(record)
            except Exception:  # protobuf's DecodeError, whose module varies by version
                raise InputError(f"{where}: not a serialized tf.train.Example") from None
            read, count = read + len(record) + TFRECORD_FRAMING, number
            yield where, {name: _string(record)}
    except tf.errors.DataLossError as e:  # a gzip or a record cut short, or damaged
        if count:
            raise InputError(f"{path}: damaged or cut short after its {count} whole records: "
                             f"{reason(e)}") from None
        raise InputError(f"{path}: not a TFRecord file: {reason(e)}") from None
    except tf.errors.OpError as e:
        raise InputError(f"{path}: not a TFRecord file: {reason(e)}") from None
    # TensorFlow's reader takes a file too short for one more record as its end: so an
    # uncompressed file that is not TFRecords at all reads as none.
    if path.suffix.lower() != ".gz" and read != path.stat().st_size:
        raise InputError(f"{path}: not a TFRecord file: {path.stat().st_size - read} bytes "
                         f"after its {count} records are no whole record")


def predict(sig: Signature, examples: Iterable[Row]) -> Iterator[dict]:
    """Each example's outputs, {output name: numpy value}, in order, BATCH at a time."""
    batch = []
    for row in examples:
        batch.append(row)
        if len(batch) == BATCH:
            yield from _answer(sig, batch)
            batch = []
    if batch:
        yield from _answer(sig, batch)


def _answer(sig: Signature, batch: list[Row]) -> list[dict]:
    try:
        outputs = _call(sig, batch)
    except tf.errors.InvalidArgumentError:
        for row in batch:  # which example the model refused, to name it
            try:
                _call(sig, [row])
            except tf.errors.InvalidArgumentError as e:
                raise InputError(f"{row[0]}: the model refused it: {reason(e)}") from None
        raise
    for name, value in outputs.items():
        if value.ndim == 0 or len(value) != len(batch):
            raise ModelError(f"signature {sig.name!r}: output {name!r} has shape "
                             f"{list(value.shape)}, not one row per example ({len(batch)})")
    return [{name: value[i] for name, value in outputs.items()} for i in range(len(batch))]


def reason(error: tf.errors.OpError) -> str:
    """What TensorFlow's error says about the input, in one line: the last line of its
    message, without the traceback of where the op was defined and the op's name after it."""
    lines = [line.strip() for line in error.message.splitlines()]
    lines = [line for line in lines if line and not line.startswith("[[")]
    said = (lines[-1] if lines else "no message").removeprefix("Name: <unknown>, ")
    # An eager op's error carries the function and the op around its words.
    said = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", said)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", said) or "no message"


def _call(sig: Signature, batch: list[Row]) -> dict[str, np.ndarray]:
    feed = {name: tf.constant(np.stack([values[name] for _, values in batch]), spec.dtype)
            for name, spec in sig.inputs.items()}
    return {name: value.numpy() for name, value in sorted(sig.function(**feed).items())}


def json_line(outputs: dict) -> str:
    """One example's outputs as a line of JSON: floats as short as their dtype holds them,
    bytes as text (or {"b64": ...} if they are not UTF-8)."""
    return json.dumps({name: _plain(value) for name, value in outputs.items()})


def _plain(value):
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, np.floating):
        return float(str(value))  # float32 0.1 is 0.1, not 0.10000000149011612
    return value.item() if isinstance(value, np.generic) else value
