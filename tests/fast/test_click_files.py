"""models/clickwriter.py and models/clicklog.py, without a session: the click log written as
Criteo's TSV and as TFRecord files of tf.train.Example (gzipped too), beside clicks.json; a
pattern that matches nothing, a file that cannot be read, files of two formats, or clicks
written for another model, refused with one line before training (the click model's check); the
click model's data params.
tests/inprocess/test_click_files_reading.py reads the files back."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import tensorflow as tf

from sync_mnist.core.config import ConfigError, TrainConfig
from sync_mnist.core.shard import DataError
from sync_mnist.models import clickformat, clicklog, clickwriter, ctr, mlp, write_clicks
from sync_mnist.models import params as model_params
from sync_mnist.task import inputs

from click_files import PARAMS, SMALL
from click_files import params as _params
from click_files import write as _write


def test_a_criteo_line_has_a_label_13_integers_and_26_hexadecimal_categories(tmp_path):
    _write(tmp_path, "tsv", train=30, files=1)
    line = (tmp_path / "train-00000-of-00001.tsv").read_text().splitlines()[0].split("\t")
    assert len(line) == 40 and line[0] in ("0", "1")
    assert all(v == "" or v.lstrip("-").isdigit() for v in line[1:14])
    assert all(v == "" or len(v) == 8 and int(v, 16) >= 0 for v in line[14:])
    assert line[14 + PARAMS["fields"]:] == [""] * (26 - PARAMS["fields"])  # SMALL: C1-C8


def test_a_tfrecord_is_a_block_of_clicks_their_ids_in_one_list_minus_one_where_empty(
        tmp_path, monkeypatch):
    # 300 clicks in 2 files: 150 each, a block of 128 and one of 22 (records never span files),
    # generated and written 100 at a time (a block spans chunks)
    monkeypatch.setattr(clickwriter, "CHUNK", 100)
    _write(tmp_path, "tfrecord", train=300, files=2)
    truth = ctr.generate(PARAMS, 300, part=0)
    empty = np.array(clickformat.empty_ids(PARAMS["fields"], PARAMS["vocabulary"]))
    ids = np.where(truth.ids == empty, -1, truth.ids)  # the number the hex spells, or -1
    clicks = 0
    for k in range(2):
        path = tmp_path / f"train-0000{k}-of-00002.tfrecord"
        records = list(tf.compat.v1.io.tf_record_iterator(str(path)))
        assert [len(tf.train.Example.FromString(r).features.feature["label"].int64_list.value)
                for r in records] == [clickformat.BLOCK, 150 - clickformat.BLOCK]
        for record in records:
            feature = tf.train.Example.FromString(record).features.feature
            assert sorted(feature) == ["ids", "label"]  # no I1-I13
            n = len(feature["label"].int64_list.value)
            assert feature["label"].int64_list.value == truth.labels[clicks:clicks + n].tolist()
            given = np.array(feature["ids"].int64_list.value).reshape(n, 26)  # C1-C26 a click
            assert given[:, :PARAMS["fields"]].tolist() == ids[clicks:clicks + n].tolist()
            assert (given[:, PARAMS["fields"]:] == -1).all()  # SMALL: C1-C8
            clicks += n
    assert clicks == 300 and (ids == -1).any(axis=0).all()


def test_varints_are_protobuf_s():
    values = np.array([0, 1, 127, 128, 300, 2 ** 32 - 1, 2 ** 63 - 1, -1, -2 ** 63])
    data, ends = clickwriter._varints(values)
    assert data.tobytes() == tf.train.Int64List(value=values.tolist()).SerializeToString()[2:]
    assert ends.tolist() == [1, 2, 3, 5, 7, 12, 21, 31, 41]


def test_patterns_that_match_nothing_or_files_that_cannot_be_read_are_named(tmp_path):
    _write(tmp_path, "tsv", train=30, files=1)
    options = {"train_files": str(tmp_path / "nothing-*"), "eval_files": str(tmp_path / "e*")}
    with pytest.raises(DataError, match=r"no training clicks: no file matches .*nothing-\*"):
        ctr.SMALL.check({**PARAMS, **options})
    (tmp_path / "train-bad.tsv.gz").write_text("not gzip")
    with pytest.raises(DataError, match=r"train-bad.tsv.gz: named .gz but not gzip"):
        clicklog.resolve(str(tmp_path / "train-bad*"), "training")
    (tmp_path / "train-gone.tsv").symlink_to(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"train-gone.tsv: cannot read: No such file"):
        clicklog.resolve(str(tmp_path / "train-gone*"), "training")
    with pytest.raises(DataError, match=r"the training clicks are of one format: .* is "
                                        r"gzipped Criteo TSV, but .* is Criteo TSV"):
        clicklog.resolve(f"{tmp_path}/train-0*,{tmp_path}/train-bad*", "training")
    with pytest.raises(DataError, match=r"--data-dir .*: no such directory"):
        clicklog.patterns({"data_dir": str(tmp_path / "absent")})


def test_clicks_written_for_another_model_are_refused_before_training(tmp_path):
    _write(tmp_path, "tsv", train=30, files=1)
    with pytest.raises(DataError, match=r"clicks.json: the clicks were written for --model "
                                        r"sync_mnist.models.ctr:SMALL \(8 fields\), not "
                                        r"sync_mnist.models.ctr:MODEL"):
        ctr.MODEL.check({**ctr.PARAMS, "data_dir": str(tmp_path)})
    with pytest.raises(DataError, match="written for a model of 8 fields"):
        ctr.train_input_fn({**ctr.PARAMS, "data_dir": str(tmp_path)})


def test_a_planted_model_without_what_the_evaluation_needs_is_refused_before_training(
        tmp_path):
    _write(tmp_path, "tsv", train=30, files=1)
    manifest = tmp_path / clickformat.MANIFEST
    written = json.loads(manifest.read_text())
    del written["planted"]["vocabulary"]
    manifest.write_text(json.dumps(written))
    with pytest.raises(DataError) as raised:
        ctr.train_input_fn(_params(tmp_path))
    assert str(raised.value) == (f"{manifest}: its planted model has no vocabulary: write the "
                                 "clicks again, or remove it to read them as a real log")


def test_the_click_model_s_data_params(tmp_path):
    assert clicklog.patterns(ctr.PARAMS) is None  # generated in memory, as before
    ctr.MODEL.check(ctr.PARAMS)  # nothing to check
    assert inputs.data_name(ctr.PARAMS) is None
    given = {**ctr.PARAMS, "train_files": "t*", "eval_files": "e*"}
    assert clicklog.patterns(given) == ("t*", "e*")
    assert inputs.data_name(given) == "t*"
    assert clicklog.patterns({**ctr.PARAMS, "data_dir": str(tmp_path)}) == (
        f"{tmp_path}/train-*", f"{tmp_path}/eval-*")
    assert inputs.data_name(mlp.MODEL.params) == "mnist"
    with pytest.raises(DataError, match="--train-files and --eval-files go together"):
        clicklog.patterns({**ctr.PARAMS, "train_files": "t*"})
    with pytest.raises(ConfigError) as raised:
        model_params.of(mlp.MODEL, TrainConfig(model="mlp", epochs=1, params={
            "dataset": "synthetic", "eval_files": "e*"}))
    assert str(raised.value) == ("--eval-files e*: --model mlp has no param 'eval_files', so "
                                 "it would be ignored (its params: data_dir, dataset, "
                                 "hidden_units)")


def test_the_command_writes_into_a_new_directory_only(tmp_path, capsys):
    out = tmp_path / "clicks"
    argv = [str(out), "--model", SMALL, "--train-examples", "50", "--eval-examples", "20",
            "--train-files", "2", "--gzip"]
    assert write_clicks.main(argv) == 0
    assert "sync-mnist-cluster --model sync_mnist.models.ctr:SMALL --data-dir" in \
        capsys.readouterr().out
    with gzip.open(out / "train-00001-of-00002.tsv.gz", "rt") as f:
        assert len(f.read().splitlines()) == 25
    assert write_clicks.main(argv) == 2
    assert "already holds click files" in capsys.readouterr().err
    assert write_clicks.main([str(tmp_path / "other"), "--train-files", "0"]) == 2
