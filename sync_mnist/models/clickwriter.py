"""The click model's generated clicks written as a click log (its formats and clicks.json:
models/clickformat.py); `sync-mnist-clicks` (models/write_clicks.py) is its command.

What is written: exactly ctr.generate's clicks of the same seed (the planted model's), in
order, cut into --train-files and --eval-files files of consecutive clicks. Field f's id k is
written as k in 8 hexadecimal digits (as k in a TFRecord), except one id per field, rank f
(field 0's most frequent, field 25's 26th), written empty: a missing value that is a value of
the planted model, at a rate from 22% (C1) to under 1% (C26), as real logs have columns often
empty and columns never. The
TSV's integer columns are noise (drawn apart, not read by the model), empty at Criteo's rates.
A model with fewer fields (SMALL: 8) fills C1-C8 and leaves the rest empty. Writing is streamed,
a chunk of clicks at a time: files of any size, never whole in memory.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np

from sync_mnist.core.shard import DataError
from sync_mnist.models import clicks as clicks_lib
from sync_mnist.models.clickformat import (
    BLOCK, CATEGORIES, COLUMNS, EVAL, INTEGERS, MANIFEST, RECORD_KEYS, TRAIN, empty_ids,
    file_names, planted_model)

log = logging.getLogger(__name__)

CHUNK = 65_536  # clicks generated and written at a time
# The integer columns' noise: each column's chance to be empty (about the Kaggle log's) and
# the parameter of its geometric law.
INTEGER_EMPTY = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
INTEGER_P = (0.3, 0.01, 0.05, 0.1, 1e-4, 0.003, 0.03, 0.05, 0.01, 0.5, 0.2, 0.5, 0.05)


class _Columns:
    """A chunk of clicks as the log's 40 columns: labels, integer noise, hexadecimal ids."""

    def __init__(self, params: dict, part: int):
        self.fields, vocabulary = params["fields"], params["vocabulary"]
        self.hexes = []
        for f, empty in enumerate(empty_ids(self.fields, vocabulary)):
            words = np.array([f"{k:08x}" for k in range(vocabulary)], dtype=object)
            words[empty] = ""
            self.hexes.append(words)
        self.noise = np.random.default_rng([params["seed"], 3, part])

    def integers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(values int64 [n, 13], empty bool [n, 13]): noise the model does not read."""
        values = self.noise.geometric(INTEGER_P, (n, INTEGERS)) - 1
        values[:, 1] -= 1  # I2, as in the real log, is sometimes -1
        return values, self.noise.random((n, INTEGERS)) < INTEGER_EMPTY

    def categories(self, ids: np.ndarray) -> list[np.ndarray]:
        """Each field's column of hexadecimal strings ('' where empty), 26 of them."""
        n = len(ids)
        return [self.hexes[f][ids[:, f]] if f < self.fields else np.full(n, "", object)
                for f in range(CATEGORIES)]


def _tsv_chunk(columns: _Columns, clicks) -> bytes:
    n = len(clicks.labels)
    values, empty = columns.integers(n)
    table = np.empty((n, COLUMNS), dtype=object)
    table[:, 0] = np.where(clicks.labels > 0, "1", "0")
    text = values.astype(str).astype(object)
    text[empty] = ""
    table[:, 1:1 + INTEGERS] = text
    for f, column in enumerate(columns.categories(clicks.ids)):
        table[:, 1 + INTEGERS + f] = column
    return "".join("\t".join(row) + "\n" for row in table.tolist()).encode()


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 as protobuf writes it: ten bytes
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes uint8, ends int64 [n]): int64 `values` as protobuf's varints, one after another
    (a negative one in ten bytes, as protobuf writes an int64), and where each ends."""
    u = values.astype(np.int64).view(np.uint64)
    size = np.ones(len(u), np.int64)
    for k in range(1, 10):
        size += u >= np.uint64(1 << 7 * k)
    ends = np.cumsum(size)
    starts = ends - size
    out = np.empty(int(ends[-1]) if len(u) else 0, np.uint8)
    for j in range(10):
        more = size > j
        if not more.any():
            break
        byte = (u[more] >> np.uint64(7 * j)) & np.uint64(0x7F)
        out[starts[more] + j] = byte.astype(np.uint8) | np.where(size[more] > j + 1, 0x80, 0
                                                                 ).astype(np.uint8)
    return out, ends




def _table(clicks, params: dict) -> np.ndarray:
    """int64 [n, 27]: a chunk's clicks as a TFRecord holds them, the label and C1-C26, -1
    where a field is empty (its empty id, or a field the model has not)."""
    n = len(clicks.labels)
    table = np.full((n, 1 + CATEGORIES), -1, np.int64)
    table[:, 0] = clicks.labels > 0
    fields = params["fields"]
    empty = np.array(empty_ids(fields, params["vocabulary"]))
    table[:, 1:1 + fields] = np.where(clicks.ids == empty, -1, clicks.ids)
    return table


def _block_records(table: np.ndarray) -> list[bytes]:
    """Serialized tf.train.Examples of `table`'s rows, BLOCK at a time (the last fewer): the
    labels one packed Int64List, the ids another (C1-C26 of a click, then of the next), put
    together from the varints numpy writes, a fraction of a microsecond a click
    (tests/fast/test_click_files.py parses them back with TensorFlow)."""
    n = len(table)
    columns = [(_varints(table[:, 0]), 1), (_varints(table[:, 1:].reshape(-1)), CATEGORIES)]
    keys = [_field(1, name.encode()) for name in RECORD_KEYS]
    records = []
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        parts = []
        for key, ((data, ends), width) in zip(keys, columns):
            begin = ends[start * width - 1] if start else 0
            packed = _field(1, data[begin:ends[stop * width - 1]].tobytes())  # Int64List
            parts.append(_field(1, key + _field(2, _field(3, packed))))  # a Features entry
        records.append(_field(1, b"".join(parts)))  # Example.features
    return records


class _Writer:
    """One file of the log, written a chunk at a time."""

    def __init__(self, path: Path, kind: str, compress: bool):
        self.kind, self.path = kind, path
        self._pending = np.zeros((0, 1 + CATEGORIES), np.int64)  # under a block's clicks
        if kind == "tfrecord":
            import tensorflow as tf

            self._file = tf.io.TFRecordWriter(
                str(path), tf.io.TFRecordOptions(compression_type="GZIP" if compress else ""))
        else:
            self._file = gzip.open(path, "wb", compresslevel=6) if compress else open(path, "wb")

    def write(self, chunk) -> None:
        """A chunk of the file: bytes of TSV, or a table of a TFRecord's clicks (_table), written
        BLOCK clicks a record, the rest kept for the next chunk, or the file's last record."""
        if self.kind == "tfrecord":
            table = np.concatenate([self._pending, chunk])
            whole = len(table) // BLOCK * BLOCK
            self._records(table[:whole])
            self._pending = table[whole:]
        else:
            self._file.write(chunk)

    def _records(self, table: np.ndarray) -> None:
        for record in _block_records(table):
            self._file.write(record)

    def close(self) -> None:
        if self.kind == "tfrecord":
            self._records(self._pending)
        self._file.close()




def _pieces(chunks, bounds: list[int]):
    """(file k, its clicks): the chunks cut where the files' bounds fall."""
    k, written = 0, 0
    for clicks in chunks:
        start, n = 0, len(clicks.labels)
        while start < n:
            while written == bounds[k + 1]:
                k += 1
            rows = slice(start, start + min(n - start, bounds[k + 1] - written))
            yield k, clicks_lib.Clicks(clicks.ids[rows], clicks.labels[rows], clicks.planted[rows])
            start, written = rows.stop, written + rows.stop - rows.start


def write_part(out: Path, params: dict, part: int, examples: int, files: int, kind: str,
               compress: bool) -> dict:
    """Writes clicks.generate(params, examples, part)'s clicks into `files` files of
    consecutive clicks; returns their record for clicks.json (and, of the evaluation, the
    planted log-loss, as clicks.Clicks.planted_log_loss computes it)."""
    columns = _Columns(params, part)
    names = file_names(TRAIN if part == 0 else EVAL, files, kind, compress)
    bounds = [examples * k // files for k in range(files + 1)]
    loss, current, writer = 0.0, -1, None
    for k, clicks in _pieces(clicks_lib.generate_chunks(params, examples, part, CHUNK), bounds):
        if k != current:
            if writer is not None:
                writer.close()
            for empty in range(current + 1, k):  # more files than clicks: some are empty
                _Writer(out / names[empty], kind, compress).close()
            current, writer = k, _Writer(out / names[k], kind, compress)
            log.info("writing %s", out / names[k])
        writer.write(_table(clicks, params) if kind == "tfrecord" else
                     _tsv_chunk(columns, clicks))
        loss += clicks.planted_log_loss() * len(clicks.labels)
    if writer is not None:
        writer.close()
    for empty in range(current + 1, files):
        _Writer(out / names[empty], kind, compress).close()
    record = {"files": names, "examples": [bounds[k + 1] - bounds[k] for k in range(files)]}
    if part == 1:
        record["planted_log_loss"] = loss / max(examples, 1)
    return record


def write(out: Path, params: dict, *, model: str, kind: str, compress: bool,
          train_examples: int, eval_examples: int, train_files: int, eval_files: int) -> dict:
    """Writes the click log into `out` (which must hold none yet) and clicks.json; returns
    clicks.json's content."""
    out.mkdir(parents=True, exist_ok=True)
    old = sorted(p.name for p in out.iterdir()
                 if p.name == MANIFEST or p.name.startswith((f"{TRAIN}-", f"{EVAL}-")))
    if old:
        raise DataError(f"{out} already holds click files ({', '.join(old[:3])}"
                        f"{', ...' if len(old) > 3 else ''}): give an empty directory")
    manifest = {"format": kind, "compression": "gzip" if compress else None,
                **({"features": list(RECORD_KEYS)} if kind == "tfrecord" else {}),
                "planted": planted_model(params, model),
                TRAIN: write_part(out, params, 0, train_examples, train_files, kind, compress),
                EVAL: write_part(out, params, 1, eval_examples, eval_files, kind, compress)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
