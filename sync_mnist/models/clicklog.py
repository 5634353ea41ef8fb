"""The click log read back through tf.data: any log of the format models/clickformat.py
tells, the one sync-mnist-clicks writes (models/clickwriter.py) or a real one.

    sync-mnist-cluster --model ctr --data-dir DIR  # trains on DIR/train-*, evaluates on DIR/eval-*

Reading (train_dataset): the files' names decide the format. The model reads the label and
the first `fields` categorical columns (26 for ctr, 8 for SMALL), each the int64 id the model
hashes (a line's decoded from hexadecimal), an empty one as -1; a line's integer columns are
checked, not used (the model has no dense input). The training clicks carry no planted
probability: only the evaluation's metric reads it. Lines are parsed 1,024 at a time,
records eight blocks at a time (tf.io.parse_example), then handed on one click at a time as
the package's streamed input takes them (core/stream.py), which cuts them per worker (by
file, when every worker gets files; else by record, tf.data's DATA sharding of these single
clicks, not of the blocks) and batches them. A line that is not of the format, a record whose
ids are not 26 for each label (none, too few: the earlier formats'), with a label not 0 or 1
or a category not an integer from -1 to 2**32 - 1, ends the run with exit 2 and one line
naming the file and the line or record (the record, not the click in it).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from sync_mnist.core.shard import DataError
from sync_mnist.models import clicks as clicks_lib
from sync_mnist.models.clickformat import (
    BLOCK, CATEGORIES, CATEGORY_RE, COLUMN_NAMES, COLUMNS, EVAL, INTEGER_RE, INTEGERS,
    LABEL_RE, LINE_RE, MANIFEST, MODELS, PLANTED_KEYS, RECORD_KEYS, TRAIN, file_format)

log = logging.getLogger(__name__)

# Clicks parsed at a time (lines, or records of BLOCK): a parse costs CPU of its own, whatever
# its size; at 256 a time, reading the click files cost about 1.5 times as much (docs/sparse.md).
# The shuffle moves these parsed blocks whole, each block's clicks permuted.
PARSE_BATCH = 1024
MAX_EVAL_EXAMPLES = 1_000_000  # the evaluation loads its clicks whole (numpy); it reads no more


# --------------------------------------------------------------------------- the files



def resolve(patterns: str, what: str) -> list[str]:
    """The files that `patterns` (comma-separated globs) match, each pattern's sorted, checked:
    each readable, a .gz one gzip, all of one format. Raises DataError naming `what` (the
    clicks: "training" or "evaluation") and the pattern or file."""
    files: list[str] = []
    for pattern in (p for p in patterns.split(",") if p):
        if "://" in pattern:  # gs://, hdfs://: TensorFlow's file systems; its readers check
            import tensorflow as tf

            matched = sorted(tf.io.gfile.glob(pattern))
        else:
            matched = sorted(p for p in glob.glob(os.path.expanduser(pattern))
                             if not os.path.isdir(p))
        if not matched:
            raise DataError(f"no {what} clicks: no file matches {pattern}")
        files += [p for p in matched if p not in files]
    if not files:
        raise DataError(f"no {what} clicks: no pattern in {patterns!r}")
    first = file_format(files[0])
    for path in files:
        if file_format(path) != first:
            raise DataError(f"the {what} clicks are of one format: {path} is "
                            f"{_describe(file_format(path))}, but {files[0]} is "
                            f"{_describe(first)}")
        if "://" not in path:
            _check_readable(path)
    return files


def _describe(fmt: tuple[str, str]) -> str:
    return ("gzipped " if fmt[1] else "") + ("TFRecord" if fmt[0] == "tfrecord" else
                                              "Criteo TSV")


def _check_readable(path: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    if path.endswith(".gz") and head and head != b"\x1f\x8b":
        raise DataError(f"{path}: named .gz but not gzip (it starts {head!r})")


@dataclasses.dataclass(frozen=True)
class ClickFiles:
    """What a run reads: its training and evaluation files, and the planted model that wrote
    them (clicks.json beside the evaluation files), None for a real log."""

    train: list[str]
    eval: list[str]
    planted: dict | None


def patterns(params: dict) -> tuple[str, str] | None:
    """(training, evaluation) patterns of the click model's params: "train_files" and
    "eval_files" (--train-files, --eval-files), or "data_dir"'s train-* and eval-* (--data-dir);
    None: none of them set (the clicks are generated)."""
    train, evaluation, data_dir = (params.get(k) for k in ("train_files", "eval_files",
                                                           "data_dir"))
    if train or evaluation:
        if not (train and evaluation):
            raise DataError("--train-files and --eval-files go together: the click model "
                            "trains on the one and evaluates on the other")
        return str(train), str(evaluation)
    if data_dir is None:
        return None
    if not os.path.isdir(data_dir):
        raise DataError(f"--data-dir {data_dir}: no such directory")
    return os.path.join(data_dir, f"{TRAIN}-*"), os.path.join(data_dir, f"{EVAL}-*")


def click_files(params: dict) -> ClickFiles:
    """The files of the params' patterns, checked, and the planted model beside the evaluation
    files, checked against the model's fields."""
    train_patterns, eval_patterns = patterns(params)
    train = resolve(train_patterns, "training")
    evaluation = resolve(eval_patterns, "evaluation")
    manifest, planted = _planted(evaluation)
    if planted is not None and planted.get("fields") != params["fields"]:
        raise DataError(f"{manifest}: the clicks were written for a model of "
                        f"{planted.get('fields')} fields (--model {planted.get('model')}), "
                        f"this one reads {params['fields']}")
    return ClickFiles(train, evaluation, planted)




def check(params: dict, model: str) -> None:
    """click_files' checks before any task starts (the click model's api.Model.check), where
    the params name files: the files, and that clicks.json was written for `model`
    (MODULE:NAME)."""
    given = patterns(params)
    if given is None:
        return
    resolve(given[0], "training")
    manifest, planted = _planted(resolve(given[1], "evaluation"))
    if planted is not None:
        written = MODELS.get(planted.get("model"), planted.get("model"))
        if written != model:
            raise DataError(f"{manifest}: the clicks were written for --model "
                            f"{planted.get('model')} ({planted.get('fields')} fields), not "
                            f"{model}: write them with sync-mnist-clicks --model {model}")


def _planted(evaluation: list[str]) -> tuple[str, dict | None]:
    """(clicks.json beside the evaluation files, its planted model or None: a real log)."""
    manifest = os.path.join(os.path.dirname(evaluation[0]), MANIFEST)
    if "://" in manifest or not os.path.exists(manifest):
        return manifest, None
    try:
        planted = json.loads(Path(manifest).read_text())["planted"]
        # What reading and the evaluation's planted probability need, checked before training.
        missing = [k for k in PLANTED_KEYS if k not in planted]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{manifest}: cannot read the planted model: "
                        f"{type(e).__name__}: {e}") from None
    if missing:
        raise DataError(f"{manifest}: its planted model has no {', '.join(missing)}: write the "
                        "clicks again, or remove it to read them as a real log")
    return manifest, planted


# --------------------------------------------------------------------------- reading

def train_dataset(params: dict):
    """The training clicks as a tf.data.Dataset of single examples ({ids}, label): what
    ctr.train_input_fn returns."""
    files = click_files(params)
    return read(files.train, params["fields"], None, shuffle=params.get("shuffle_buffer") or 0,
                seed=params.get("seed", 0))


def eval_arrays(params: dict) -> tuple[dict, np.ndarray]:
    """The evaluation clicks, read whole into numpy arrays (at most MAX_EVAL_EXAMPLES): what
    ctr.eval_input_fn returns."""
    import tensorflow as tf

    files = click_files(params)
    graph = tf.Graph()
    with graph.as_default():
        batches = read(files.eval, params["fields"], files.planted).batch(10_000)
        iterator = tf.compat.v1.data.make_one_shot_iterator(batches)
        following = iterator.get_next()
    parts, n = [], 0
    with tf.compat.v1.Session(graph=graph) as sess:
        while n < MAX_EVAL_EXAMPLES:
            try:
                parts.append(sess.run(following))
            except tf.errors.OutOfRangeError:
                break
            except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
                raise DataError(f"the evaluation clicks: {_message(e)}") from None
            n += len(parts[-1][1])
    if not parts:
        raise DataError(f"no evaluation clicks in {', '.join(files.eval)}")
    if n >= MAX_EVAL_EXAMPLES:
        log.warning("the evaluation reads the first %s clicks of its files", f"{n:,}")
    features = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
    return features, np.concatenate([p[1] for p in parts])


def _message(error) -> str:
    """The line of a tf.data error that says what is wrong: after "Graph execution error:",
    without the "Error in user-defined function passed to ... transformation with iterator:
    ...:" before it (core.config.first_line gives the heading there); an assertion's message
    without its brackets."""
    from sync_mnist.core.config import first_line

    text = getattr(error, "message", None) or str(error)
    own = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    if (not text.startswith("Graph execution error:") or not own or own[0].startswith("[[{{")
            or any(line.startswith("Node: '") for line in own)):
        return first_line(error)
    line = re.sub(r"^Error in user-defined function passed to \S+ transformation with "
                  r"iterator: \S+: ", "", own[0])
    return re.sub(r"^assertion failed: \[(.*)\]$", r"\1", line)


def read(files: list[str], fields: int, planted: dict | None, shuffle: int = 0, seed: int = 0):
    """The clicks of `files` (one format), as a Dataset of single examples: in order, or
    shuffled within a window of about `shuffle` clicks.

    The clicks are parsed PARSE_BATCH at a time. A real log is in time order, so the training
    clicks are shuffled a parsed block at a time: each block's clicks permuted, the blocks drawn
    from a buffer of shuffle / PARSE_BATCH. An example-by-example shuffle buffer cost more CPU
    than the parsing (4 of the 20 microseconds a click cost on this machine), and cutting the
    parsed blocks into blocks of 256 to shuffle made reading cost over a quarter more (1.33
    against 1.04 us a click, in one process): CPU taken from the training's. Every worker and
    every rerun shuffles alike: a block's order is a function of `seed` (--seed), its file and
    its first line or record, and the buffer draws from the graph's seed, which the package
    set (core/stream.py)."""
    import tensorflow as tf

    kind, compression = file_format(files[0])
    reader = tf.data.TFRecordDataset if kind == "tfrecord" else tf.data.TextLineDataset
    parse = _parse_tfrecords if kind == "tfrecord" else _parse_lines

    per = PARSE_BATCH // BLOCK if kind == "tfrecord" else PARSE_BATCH  # records a parse

    def batches(path):  # the file's name and first line's or record's number go with each batch
        return reader(path, compression_type=compression).batch(per).enumerate().map(
            lambda k, records: (path, k * per + 1, records))

    def example(path, first, records):
        ids, labels = parse(path, first, records, fields)
        if shuffle:
            ids, labels = _permuted((ids, labels), _block_seed(seed, path, first))
        features = {"ids": ids}
        if planted is not None:
            features["planted_probability"] = _planted_probability(ids, planted)
        return features, labels

    # Sync: the files are the source, so the package can cut them per worker by file.
    blocks = tf.data.Dataset.from_tensor_slices(files).flat_map(batches).map(
        example, num_parallel_calls=2, deterministic=True)
    if shuffle:
        blocks = blocks.shuffle(max(1, shuffle // PARSE_BATCH))
    return blocks.unbatch()


def _block_seed(seed: int, path, first):
    """The stateless seed of the block of `path` that begins at line or record `first`."""
    import tensorflow as tf

    key = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, 0], tf.int64), tf.strings.to_hash_bucket_fast(path, 2 ** 62))
    return tf.random.experimental.stateless_fold_in(key, first)


def _permuted(columns: tuple, seed):
    """The tensors of `columns`, their rows in one random order drawn from `seed` (stateless:
    the same whichever of the parallel parses draws it, and whenever)."""
    import tensorflow as tf

    order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(columns[-1])[0]), seed)
    return tuple(tf.gather(c, order) for c in columns)


def _parse_lines(path, first, lines, fields: int):
    """(ids int64 [n, fields], labels float32 [n]) of Criteo lines; an assertion naming the
    file and the line that is not of the format."""
    import tensorflow as tf

    ok = tf.strings.regex_full_match(lines, LINE_RE)
    bad = tf.argmin(tf.cast(ok, tf.int32), output_type=tf.int32)
    message = tf.cond(tf.reduce_all(ok), lambda: tf.constant(""),
                      lambda: _explain_line(path, first + tf.cast(bad, tf.int64), lines[bad]))
    check = tf.debugging.Assert(tf.reduce_all(ok), [message], summarize=1)
    with tf.control_dependencies([check]):
        columns = tf.reshape(tf.strings.split(lines, "\t").values, [-1, COLUMNS])
    labels = tf.cast(tf.equal(columns[:, 0], "1"), tf.float32)
    return hex_ids(columns[:, 1 + INTEGERS:1 + INTEGERS + fields]), labels


def _explain_line(path, number, line):
    """"PATH:LINE: what is wrong" of a line that is not of the Criteo format."""
    import tensorflow as tf

    values = tf.strings.split(line, "\t")
    count = tf.size(values)
    padded = tf.concat([values, tf.fill([COLUMNS], "")], 0)[:COLUMNS]
    fine = tf.concat([tf.strings.regex_full_match(padded[:1], LABEL_RE),
                      tf.strings.regex_full_match(padded[1:1 + INTEGERS], INTEGER_RE),
                      tf.strings.regex_full_match(padded[1 + INTEGERS:], CATEGORY_RE)], 0)
    column = tf.argmin(tf.cast(fine, tf.int32), output_type=tf.int32)
    where = tf.strings.join([path, ":", tf.strings.as_string(number), ": "])
    wrong_count = tf.strings.join([
        where, tf.strings.as_string(count), f" tab-separated fields, not {COLUMNS} (a label, "
        f"{INTEGERS} integer columns, {CATEGORIES} categorical columns)"])
    wrong_value = tf.strings.join([
        where, "field ", tf.strings.as_string(column + 1), " (",
        tf.gather(tf.constant(COLUMN_NAMES), column), ") is `",
        tf.strings.substr(padded[column], 0, 40), "`: not ",
        tf.gather(tf.constant(["0 or 1", "an integer or empty",
                               "8 hexadecimal digits or empty"]),
                  tf.minimum(column, 1) + tf.cast(column > INTEGERS, tf.int32))])
    return tf.where(tf.equal(count, COLUMNS), wrong_value, wrong_count)


def _parse_tfrecords(path, first, records, fields: int):
    """(ids int64 [n, fields], labels float32 [n]) of serialized tf.train.Examples, each a
    block of clicks: "label" a value a click, "ids" 26 (C1-C26) a click. An assertion (or
    tf.io.parse_example's error, a feature not int64) names the file and the record."""
    import tensorflow as tf

    numbers = first + tf.range(tf.size(records, out_type=tf.int64))
    names = tf.strings.join([path, ": record ", tf.strings.as_string(numbers)])
    spec = {k: tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64) for k in RECORD_KEYS}
    block = tf.io.parse_example(records, spec, example_names=names)
    clicks, ids_given = block["label"].row_lengths(), block["ids"].row_lengths()
    even = tf.equal(ids_given, CATEGORIES * clicks)
    fine = tf.reduce_all(even)

    def uneven():
        record = tf.argmin(tf.cast(even, tf.int32), output_type=tf.int32)
        return tf.strings.join([
            names[record], ": ids has ", tf.strings.as_string(ids_given[record]), " values, "
            f"not {CATEGORIES} for each of its ", tf.strings.as_string(clicks[record]),
            " labels: a record is a block of clicks, its label a value a click and its ids 26 "
            "a click (C1-C26, -1 where empty); records of a list a column (C1-C26) are of a "
            "format before 6 December 2026: write the files again"])

    message = tf.cond(fine, lambda: tf.constant(""), uneven)
    with tf.control_dependencies([tf.debugging.Assert(fine, [message], summarize=1)]):
        label = tf.identity(block["label"].values)
        ids = tf.reshape(block["ids"].values, [-1, CATEGORIES])[:, :fields]
    ok = tf.logical_and(tf.reduce_all((ids >= -1) & (ids < 2 ** 32), axis=1),
                        tf.logical_or(tf.equal(label, 0), tf.equal(label, 1)))
    valid = tf.reduce_all(ok)

    def invalid():
        click = tf.argmin(tf.cast(ok, tf.int32), output_type=tf.int64)
        record = tf.gather(block["label"].value_rowids(), click)
        return tf.strings.join([names[record], ": not a block of clicks of the format: labels "
                                "0 or 1, categories C1-C26 from 0 to 2**32 - 1 or -1 (empty)"])

    message = tf.cond(valid, lambda: tf.constant(""), invalid)
    with tf.control_dependencies([tf.debugging.Assert(valid, [message], summarize=1)]):
        labels = tf.cast(label, tf.float32)
    return ids, labels


def _hex_digits(strings):
    """int64 [..., 8]: the value of each of the first 8 characters as a hexadecimal digit, -1
    where it is none (a shorter string reads as padded with zero bytes)."""
    import tensorflow as tf

    c = tf.cast(tf.io.decode_raw(strings, tf.uint8, fixed_length=8), tf.int64)
    lower = c | 0x20  # 'A'-'F' as 'a'-'f'
    return tf.where((c >= 48) & (c <= 57), c - 48,
                    tf.where((lower >= 97) & (lower <= 102), lower - 87, -1))


def _ids_of(strings, digits):
    import tensorflow as tf

    value = tf.reduce_sum(digits * (16 ** tf.range(7, -1, -1, dtype=tf.int64)), axis=-1)
    return tf.where(tf.equal(strings, ""), tf.constant(-1, tf.int64), value)


def hex_ids(strings):
    """int64: the ids of categorical values of 8 hexadecimal digits, -1 where empty."""
    return _ids_of(strings, _hex_digits(strings))


def _planted_probability(ids, planted: dict):
    """float32 [n]: the planted model's probability of a click (clicks.json's), from the ids;
    an empty id is the one its field writes empty."""
    import tensorflow as tf

    fields, vocabulary = planted["fields"], planted["vocabulary"]
    weights = clicks_lib.planted_weights(fields, vocabulary, planted["weight_scale"], planted["seed"])
    rank = tf.where(ids < 0, tf.constant(planted["empty_ids"], tf.int64), ids)
    flat = tf.range(fields, dtype=tf.int64) * vocabulary + rank
    logit = planted["bias"] + tf.reduce_sum(tf.gather(tf.constant(weights.ravel()), flat), 1)
    return tf.cast(tf.sigmoid(logit), tf.float32)
