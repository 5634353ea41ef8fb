"""The click log's format: what its writer (models/clickwriter.py, the command
`sync-mnist-clicks`) and its reader (models/clicklog.py) agree on: the columns, the files'
names, a TFRecord's blocks, clicks.json. This module imports only the standard library.

    sync-mnist-clicks DIR                          # 600,000 + 50,000 clicks of --model ctr, TSV
    sync-mnist-clicks DIR --format tfrecord --gzip
    sync-mnist-clicks DIR --model sync_mnist.models.ctr:SMALL --train-files 6
    sync-mnist-cluster --model ctr --data-dir DIR  # trains on DIR/train-*, evaluates on DIR/eval-*

The formats:
- **Criteo's** (its Kaggle and Terabyte logs): one click a line, 40 tab-separated fields: the
  label (0 or 1), 13 integer columns I1-I13, 26 categorical columns C1-C26 of 8 hexadecimal
  digits; any field but the label may be empty. Plain or gzipped (a name ending in .gz).
- **TFRecord** files of tf.train.Example (.tfrecord, .tfrecord.gz for GZIP), each record a
  block of up to BLOCK (128) consecutive clicks: "label" int64 [n] and "ids" int64 [26 n],
  each click's C1-C26 in turn (the 32-bit value the line's 8 hexadecimal digits spell: the
  number, not its text), -1 where a field is empty (a list has no absent element). A file's
  last record may hold fewer; a record never spans files. A tf.train.Example costs TensorFlow
  about as much to parse as the clicks it holds, so one a click cost reading twice what the
  same clicks cost from memory, and a block of them about what memory costs; the ids in one
  list cost a worker less CPU than a list a column (docs/sparse.md, "Click files"). The
  integer columns I1-I13 are not written: nothing reads them (the model has no dense input),
  they would cost a third of the bytes and their parse, and -1 could not mark their empty
  values (I2 is -1 in Criteo's log). Files of the formats before 6 December 2026 (a list a
  column, C1-C26; or a click a record) are refused, naming the first record: write them
  again.

Beside them, clicks.json: the planted model (seed, fields, vocabulary, Zipf exponent, weight
scale, bias, the empty id of each field), the files and their counts, and the evaluation
clicks' planted log-loss. The format has no column for the planted probability; a run computes
it from the ids and this description (`planted_probability`, which the click model's evaluation
compares against). A real log has no clicks.json, and a run of it prints no planted figures.
"""

from __future__ import annotations

import os

INTEGERS, CATEGORIES = 13, 26
COLUMNS = 1 + INTEGERS + CATEGORIES
INTEGER_NAMES = tuple(f"I{k}" for k in range(1, INTEGERS + 1))
CATEGORY_NAMES = tuple(f"C{k}" for k in range(1, CATEGORIES + 1))
COLUMN_NAMES = ("label", *INTEGER_NAMES, *CATEGORY_NAMES)
MANIFEST = "clicks.json"
TRAIN, EVAL = "train", "eval"  # the files' prefixes in a directory written here
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")
# A Criteo line, checked whole by one RE2 match (a few hundred bytes: cheaper than a check a
# field): the label, 13 integers, 26 categories of 8 hexadecimal digits; all but the label may
# be empty.
LABEL_RE, INTEGER_RE, CATEGORY_RE = "[01]", "(-?[0-9]+)?", "([0-9a-fA-F]{8})?"
LINE_RE = LABEL_RE + f"(\t{INTEGER_RE}){{{INTEGERS}}}" + f"(\t{CATEGORY_RE}){{{CATEGORIES}}}"
# Clicks a TFRecord holds (a file's last record fewer): 128 makes a record's cost a small part
# of a click's (tf.train.Example's framing, once a block). Larger records would save little
# more, and a record's clicks are read together.
BLOCK = 128

RECORD_KEYS = ("label", "ids")  # a TFRecord's features: no integer columns


def file_format(path: str) -> tuple[str, str]:
    """("tsv" or "tfrecord", "GZIP" or ""), from the file's name."""
    name = os.path.basename(path)
    compression = "GZIP" if name.endswith(".gz") else ""
    stem = name[:-3] if compression else name
    return ("tfrecord" if stem.endswith(TFRECORD_SUFFIXES) else "tsv"), compression


def file_names(part: str, files: int, kind: str, compress: bool) -> list[str]:
    suffix = (".tfrecord" if kind == "tfrecord" else ".tsv") + (".gz" if compress else "")
    return [f"{part}-{k:05d}-of-{files:05d}{suffix}" for k in range(files)]


# The click models whose clicks sync-mnist-clicks writes, by the names --model gives them.
MODELS = {"ctr": "sync_mnist.models.ctr:MODEL", "sync_mnist.models.ctr:MODEL":
          "sync_mnist.models.ctr:MODEL", "sync_mnist.models.ctr:SMALL":
          "sync_mnist.models.ctr:SMALL"}


def empty_ids(fields: int, vocabulary: int) -> list[int]:
    """The id each field writes empty: rank f in field f."""
    return [min(f, vocabulary - 1) for f in range(fields)]


# planted_model's keys that reading needs (clicklog._planted_probability and the empty ids).
PLANTED_KEYS = ("fields", "vocabulary", "weight_scale", "bias", "seed", "empty_ids")


def planted_model(params: dict, model: str) -> dict:
    """clicks.json's "planted": what reading needs to compute the planted probability."""
    keys = ("fields", "vocabulary", "zipf", "weight_scale", "bias", "seed")
    return {"model": model, **{k: params[k] for k in keys},
            "empty_ids": empty_ids(params["fields"], params["vocabulary"])}
