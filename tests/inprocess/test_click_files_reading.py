"""models/clicklog.py's reading, in sessions: the files (Criteo's TSV, TFRecord, gzipped)
read back through tf.data as exactly the clicks ctr.generate draws in memory; a line or record
not of the format is one line naming the file and the line or record, through the package's
stream (core/stream.py).  tests/fast/test_click_files.py checks the writing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from sync_mnist.core.shard import DataError
from sync_mnist.core.stream import Stream
from sync_mnist.models import clickformat, clicklog, ctr

tf1 = tf.compat.v1
from click_files import PARAMS
from click_files import params as _params
from click_files import write as _write


def _read(params: dict) -> tuple[dict, np.ndarray]:
    """Every training click of `params`' files, in order, read in a session as a worker would."""
    graph = tf.Graph()
    with graph.as_default():
        batches = ctr.train_input_fn(params).batch(1000)
        following = tf1.data.make_one_shot_iterator(batches).get_next()
    out = []
    with tf1.Session(graph=graph) as sess:
        while True:
            try:
                out.append(sess.run(following))
            except tf.errors.OutOfRangeError:
                break
    return ({k: np.concatenate([f[k] for f, _ in out]) for k in out[0][0]},
            np.concatenate([labels for _, labels in out]))


@pytest.mark.parametrize("kind, compress", [("tsv", False), ("tsv", True), ("tfrecord", False),
                                            ("tfrecord", True)])
def test_the_files_hold_the_clicks_a_run_draws_in_memory(tmp_path, kind, compress):
    manifest = _write(tmp_path, kind, compress)
    names = sorted(p.name for p in tmp_path.iterdir())
    suffix = (".tsv" if kind == "tsv" else ".tfrecord") + (".gz" if compress else "")
    assert names == ["clicks.json", f"eval-00000-of-00001{suffix}",
                     *(f"train-0000{k}-of-00003{suffix}" for k in range(3))]
    assert manifest["train"]["examples"] == [100, 100, 100]
    features, labels = _read(_params(tmp_path))
    truth = ctr.generate(PARAMS, 300, part=0)
    empty = np.array(clickformat.empty_ids(PARAMS["fields"], PARAMS["vocabulary"]))
    ids = features[ctr.IDS]
    assert ids.dtype == np.int64 and ids.shape == (300, PARAMS["fields"])
    assert (ids == np.where(truth.ids == empty, -1, truth.ids)).all()  # written empty: -1
    assert (ids == -1).any(axis=0).all()  # every field has its empty values
    assert (labels == truth.labels).all()
    assert set(features) == {ctr.IDS}  # the planted probability is the evaluation's alone
    # and the evaluation's, with the planted probability computed from clicks.json's model,
    # and the planted log-loss clicks.json reports
    eval_features, eval_labels = ctr.eval_input_fn(_params(tmp_path))
    eval_truth = ctr.generate(PARAMS, 120, part=1)
    assert (eval_labels == eval_truth.labels).all()
    assert np.allclose(eval_features[ctr.PLANTED], eval_truth.planted, atol=1e-6)
    assert manifest["eval"]["planted_log_loss"] == pytest.approx(
        eval_truth.planted_log_loss(), rel=1e-6)
    assert json.loads((tmp_path / "clicks.json").read_text()) == manifest


@pytest.mark.parametrize("kind", ["tsv", "tfrecord"])
def test_the_training_clicks_are_shuffled_alike_on_a_rerun_and_anew_by_seed(tmp_path, kind):
    """Sync: a restarted worker's stream must be the one it left, so a shuffle is a function
    of the seed alone; each click is read once."""
    _write(tmp_path, kind, train=3000)
    files = sorted(str(p) for p in tmp_path.glob("train-*"))

    def clicks(seed: int) -> list[tuple]:
        graph = tf.Graph()
        with graph.as_default():
            tf1.set_random_seed(seed)  # the package sets the input graph's (core/stream.py)
            dataset = clicklog.read(files, PARAMS["fields"], None, shuffle=2048, seed=seed)
            following = tf1.data.make_one_shot_iterator(dataset.batch(10_000)).get_next()
        with tf1.Session(graph=graph) as sess:
            features, labels = sess.run(following)
        return [(*ids, label) for ids, label in zip(features[ctr.IDS].tolist(), labels)]

    first, again, other = clicks(0), clicks(0), clicks(1)
    features, labels = _read(_params(tmp_path))
    in_order = [(*ids, label) for ids, label in zip(features[ctr.IDS].tolist(), labels)]
    assert first == again
    assert sorted(first) == sorted(other) == sorted(in_order)
    assert first != other and first != in_order


def test_hexadecimal_ids_decode_over_the_whole_32_bit_range():
    values = ["00000000", "0000002a", "68fd1e64", "FFFFFFFF", "7fffffff", ""]
    with tf.Graph().as_default(), tf1.Session() as sess:
        ids = sess.run(clicklog.hex_ids(tf.constant(values)))
    assert ids.tolist() == [0, 42, 0x68FD1E64, 0xFFFFFFFF, 0x7FFFFFFF, -1]


def _stream_error(params: dict) -> tuple[str, str]:
    """(the DataError's line, the TensorFlow error's whole message) of reading `params`'s
    training files to the end, as a worker does."""
    graph = tf.Graph()
    with graph.as_default():
        dataset = ctr.train_input_fn(params)
    with pytest.raises(DataError) as error:
        stream = Stream(graph, dataset, index=0, num_workers=1, batch_size=10, epochs=1,
                        sharded=False, what="train_input_fn")
        for step in range(1000):
            stream.batch(step)
    assert "\n" not in str(error.value)
    return str(error.value), error.value.__cause__.message


# Line LINE of a file of TRAIN_LINES is in the second batch of lines the reader parses; so is
# record BAD of a file of TFRecords, the second of its batch (TensorFlow's "Index: 1").
LINE, TRAIN_LINES = clicklog.PARSE_BATCH + 11, clicklog.PARSE_BATCH + 44
BAD = clicklog.PARSE_BATCH // clickformat.BLOCK + 2


def _break_line(directory: Path, edit) -> Path:
    """Line LINE of the one training file edited."""
    path = directory / "train-00000-of-00001.tsv"
    lines = path.read_text().splitlines()
    lines[LINE - 1] = "\t".join(edit(lines[LINE - 1].split("\t")))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda f: f[:-1], "39 tab-separated fields, not 40"),
    (lambda f: f + ["x"], "41 tab-separated fields, not 40"),
    (lambda f: ["2"] + f[1:], 'field 1 (label) is `2`: not 0 or 1'),
    (lambda f: f[:3] + ["1.5"] + f[4:], 'field 4 (I3) is `1.5`: not an integer or empty'),
    (lambda f: f[:16] + ["zz00ff00"] + f[17:], 'field 17 (C3) is `zz00ff00`: not 8 hex'),
])
def test_a_line_not_of_the_format_names_the_file_and_line(tmp_path, edit, message):
    _write(tmp_path, "tsv", train=TRAIN_LINES, files=1)
    path = _break_line(tmp_path, edit)
    _, whole = _stream_error(_params(tmp_path))
    assert f"{path}:{LINE}: {message}" in whole
    # The evaluation reads its files itself: one line, the file and the line first.
    params = {**_params(tmp_path), "train_files": str(path), "eval_files": str(path)}
    expected = f"the evaluation clicks: {path}:{LINE}: {message}"
    with pytest.raises(DataError, match="^" + re.escape(expected)):
        ctr.eval_input_fn(params)


def test_a_worker_s_data_error_line_names_the_file_and_line(tmp_path):
    _write(tmp_path, "tsv", train=TRAIN_LINES, files=1)
    path = _break_line(tmp_path, lambda f: f[:-1])
    line, _ = _stream_error(_params(tmp_path))
    assert f"{path}:{LINE}: 39 tab-separated fields, not 40" in line


def _block(**columns) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature={
        k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in columns.items()}))


def _ids(*clicks) -> list[int]:
    """A record's "ids" of clicks each given as one value for all its 26 fields."""
    return [value for click in clicks for value in [click] * 26]


GOOD = {"label": [1, 0, 1], "ids": _ids(0x2a, -1, 7)}


def _with(**changes) -> tf.train.Example:
    return _block(**{k: v for k, v in {**GOOD, **changes}.items() if v is not None})


def _a_column_a_field() -> tf.train.Example:
    """A record of the format before 6 December 2026: C1-C26 a list each."""
    return _block(label=[1, 0, 1], **{f"C{f + 1}": [0x2a, -1, 7] for f in range(26)})


def _one_click_a_record() -> tf.train.Example:
    """A record of the format before 5 December 2026: a click, its empty fields absent."""
    return _block(label=[1], **{f"C{f + 1}": [5] for f in range(PARAMS["fields"]) if f != 2})


def _text_ids() -> tf.train.Example:
    text = _with()
    del text.features.feature["ids"].int64_list.value[:]
    text.features.feature["ids"].bytes_list.value.extend([b"0000002a"] * 78)  # the line's hex
    return text


FORMAT = ("a record is a block of clicks, its label a value a click and its ids 26 a click "
          "(C1-C26, -1 where empty); records of a list a column (C1-C26) are of a format before "
          "6 December 2026: write the files again")


@pytest.mark.parametrize("bad, message", [
    (lambda: _with(ids=[0x2a, 2 ** 32] + _ids(0x2a, -1, 7)[2:]),
     f"record {BAD}: not a block of clicks of the format"),
    (lambda: _with(label=[1, 2, 0]), f"record {BAD}: not a block of clicks of the format"),
    (lambda: _with(ids=_ids(1, 2)), f"record {BAD}: ids has 52 values, not 26 for each of its 3 "
                                    f"labels: {FORMAT}"),
    (lambda: _with(label=None), f"record {BAD}: ids has 78 values, not 26 for each of its 0 "
                                "labels"),
    (_a_column_a_field, f"record {BAD}: ids has 0 values, not 26 for each of its 3 labels: "
                        f"{FORMAT}"),
    (_one_click_a_record, f"record {BAD}: ids has 0 values, not 26 for each of its 1 labels"),
    (_text_ids, f"record {BAD}, Key: ids, Index: 1.  Data types don't match. Expected type: "
                "int64, Actual type: string"),
])
def test_a_bad_tfrecord_names_the_file_and_record(tmp_path, bad, message):
    """Record BAD: the second of the second batch of records the reader parses."""
    path = tmp_path / "train-00000.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in [_with()] * (BAD - 1) + [bad(), _with()]:
            writer.write(record.SerializeToString())
    line, whole = _stream_error({**PARAMS, "train_files": str(path), "eval_files": str(path)})
    assert f"{path}: {message}" in whole, whole
    params = {**PARAMS, "train_files": str(path), "eval_files": str(path)}
    with pytest.raises(DataError, match="^the evaluation clicks: (Name: )?" + re.escape(
            f"{path}: {message}")):  # TensorFlow's parse error begins "Name: "
        ctr.eval_input_fn(params)


def test_blocks_of_any_length_read_as_their_clicks(tmp_path):
    """A record of no click, of one, and ids beyond the model's fields: the reader reads the
    label and C1-C8 (SMALL's) of each click, in order."""
    path = tmp_path / "train-00000.tfrecord"
    fields = PARAMS["fields"]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in [_with(), _block(), _block(label=[0], ids=list(range(26))), _with()]:
            writer.write(record.SerializeToString())
    features, labels = _read({**PARAMS, "train_files": str(path), "eval_files": str(path)})
    assert labels.tolist() == [1, 0, 1, 0, 1, 0, 1]
    assert features[ctr.IDS].tolist() == [[0x2a] * fields, [-1] * fields, [7] * fields,
                                          list(range(fields)),
                                          [0x2a] * fields, [-1] * fields, [7] * fields]


def test_a_cut_off_tfrecord_file_is_a_data_error(tmp_path):
    """TensorFlow's reader names the offset, not the file: the line says which worker's input
    and which batch."""
    _write(tmp_path, "tfrecord", train=40, files=1)
    path = tmp_path / "train-00000-of-00001.tfrecord"
    path.write_bytes(path.read_bytes()[:-7])
    line, _ = _stream_error(_params(tmp_path))
    assert "DataLossError: truncated record at" in line and "worker 0's" in line
