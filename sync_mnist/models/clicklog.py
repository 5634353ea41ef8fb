"""The click log in files: the click model's generated clicks written as a real log is kept,
and any such log read back through tf.data.

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

What is written: exactly ctr.generate's clicks of the same seed (the planted model's), in
order, cut into --train-files and --eval-files files of consecutive clicks. Field f's id k is
written as k in 8 hexadecimal digits (as k in a TFRecord), except one id per field, rank f
(field 0's most frequent, field 25's 26th), written empty: a missing value that is a value of
the planted model, at a rate from 22% (C1) to under 1% (C26), as real logs have columns often
empty and columns never. The
TSV's integer columns are noise (drawn apart, not read by the model), empty at Criteo's rates.
A model with fewer fields (SMALL: 8) fills C1-C8 and leaves the rest empty. Writing is streamed,
a chunk of clicks at a time: files of any size, never whole in memory.

Beside them, clicks.json: the planted model (seed, fields, vocabulary, Zipf exponent, weight
scale, bias, the empty id of each field), the files and their counts, and the evaluation
clicks' planted log-loss. The format has no column for the planted probability; a run computes
it from the ids and this description (`planted_probability`, which the click model's evaluation
compares against). A real log has no clicks.json, and a run of it prints no planted figures.

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
import gzip
import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from sync_mnist.core.shard import DataError
from sync_mnist.models import clicks as clicks_lib

log = logging.getLogger(__name__)

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
# Clicks parsed at a time (lines, or records of BLOCK): a parse costs CPU of its own, whatever
# its size; at 256 a time, reading the click files cost about 1.5 times as much (docs/sparse.md).
# The shuffle moves these parsed blocks whole, each block's clicks permuted.
PARSE_BATCH = 1024
# Clicks a TFRecord holds (a file's last record fewer): 128 makes a record's cost a small part
# of a click's (tf.train.Example's framing, once a block). Larger records would save little
# more, and a record's clicks are read together.
BLOCK = 128
MAX_EVAL_EXAMPLES = 1_000_000  # the evaluation loads its clicks whole (numpy); it reads no more
CHUNK = 65_536  # clicks generated and written at a time
# The integer columns' noise: each column's chance to be empty (about the Kaggle log's) and
# the parameter of its geometric law.
INTEGER_EMPTY = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
INTEGER_P = (0.3, 0.01, 0.05, 0.1, 1e-4, 0.003, 0.03, 0.05, 0.01, 0.5, 0.2, 0.5, 0.05)


# --------------------------------------------------------------------------- the files

def file_format(path: str) -> tuple[str, str]:
    """("tsv" or "tfrecord", "GZIP" or ""), from the file's name."""
    name = os.path.basename(path)
    compression = "GZIP" if name.endswith(".gz") else ""
    stem = name[:-3] if compression else name
    return ("tfrecord" if stem.endswith(TFRECORD_SUFFIXES) else "tsv"), compression


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


# The click models whose clicks sync-mnist-clicks writes, by the names --model gives them.
MODELS = {"ctr": "sync_mnist.models.ctr:MODEL", "sync_mnist.models.ctr:MODEL":
          "sync_mnist.models.ctr:MODEL", "sync_mnist.models.ctr:SMALL":
          "sync_mnist.models.ctr:SMALL"}


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


# --------------------------------------------------------------------------- writing

def empty_ids(fields: int, vocabulary: int) -> list[int]:
    """The id each field writes empty: rank f in field f."""
    return [min(f, vocabulary - 1) for f in range(fields)]


# planted_model's keys that reading needs (_planted_probability and the empty ids).
PLANTED_KEYS = ("fields", "vocabulary", "weight_scale", "bias", "seed", "empty_ids")


def planted_model(params: dict, model: str) -> dict:
    """clicks.json's "planted": what reading needs to compute the planted probability."""
    keys = ("fields", "vocabulary", "zipf", "weight_scale", "bias", "seed")
    return {"model": model, **{k: params[k] for k in keys},
            "empty_ids": empty_ids(params["fields"], params["vocabulary"])}


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


RECORD_KEYS = ("label", "ids")  # a TFRecord's features: no integer columns


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


def file_names(part: str, files: int, kind: str, compress: bool) -> list[str]:
    suffix = (".tfrecord" if kind == "tfrecord" else ".tsv") + (".gz" if compress else "")
    return [f"{part}-{k:05d}-of-{files:05d}{suffix}" for k in range(files)]


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
