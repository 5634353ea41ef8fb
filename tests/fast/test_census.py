"""TensorFlow's census wide & deep program and its migration (examples/census): the lines the
migration changes, counted, and shown in docs/your-model.md as they are; the census rows
write_census.py generates, in the format and vocabularies the program reads; the migrated
program's model and input function as graphs. Trained, verified synchronous, beside the
planted truth: tests/convergence/test_census_convergence.py; resumed after a kill:
tests/recovery/test_census_resume.py."""

from __future__ import annotations

import csv
import difflib
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm

tf1 = tf.compat.v1
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "census"
DOC = ROOT / "docs" / "your-model.md"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"census_example_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code(name: str) -> list[str]:
    """The file's lines from its first import: the docstrings say different things."""
    lines = (EXAMPLE / f"{name}.py").read_text().splitlines()
    return lines[lines.index("import os"):]


def changed_lines(before: list[str], after: list[str]) -> int:
    """Lines of `before` that `after` removes or replaces, plus lines it adds beyond them."""
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
               if tag != "equal")


def shown_diff(before: list[str], after: list[str]) -> list[str]:
    """The diff as the docs show it: unified, one line of context, hunks headed by "@@", no
    trailing blanks (a blank line of context is empty)."""
    lines = difflib.unified_diff(before, after, lineterm="", n=1)
    return ["@@" if line.startswith("@@") else line.rstrip() for line in list(lines)[2:]]


def test_the_migration_changes_17_lines_of_its_imports_and_input_and_replaces_its_driver():
    before, after = _code("census_tf1"), _code("census")
    cuts = [[lines.index(next(line for line in lines if line.startswith(start)))
             for start in ("def input_fn(", "def build_estimator(")] for lines in (before, after)]
    part = [(before[a:b], after[c:d]) for (a, b), (c, d) in
            zip(zip([0, *cuts[0]], [*cuts[0], None]), zip([0, *cuts[1]], [*cuts[1], None]))]
    # The imports: sync_mnist.canned and TensorFlow's compat.v1. The feature columns are
    # untouched.
    assert changed_lines(*part[0]) == 3
    assert part[0][0][part[0][0].index("def build_model_columns():"):] == \
        part[0][1][part[0][1].index("def build_model_columns():"):]
    # The input function returns examples (the package batches and repeats), and the train
    # and evaluation input functions leave the driver for the module, taking params.
    assert changed_lines(*part[1]) == 14
    # The Estimator, its RunConfig, the train-and-evaluate loop and the flags: the canned
    # model with the input functions and its param, the data directory; the command line
    # does the rest.
    assert changed_lines(*part[2]) == 55
    assert changed_lines(before, after) == 72


def test_the_docs_show_the_real_diff():
    text = DOC.read_text()
    section = text[text.index("## From a canned Estimator"):]
    block = re.search(r"```diff\n(.*?)\n```", section, re.S)[1].splitlines()
    assert block == shown_diff(_code("census_tf1"), _code("census"))


def test_write_census_writes_adult_data_format_with_the_programs_vocabularies(tmp_path):
    writer, census = _module("write_census"), _module("census")
    truth = writer.write(tmp_path, train_rows=600, eval_rows=400, seed=3)
    assert writer.COLUMNS == census._CSV_COLUMNS
    vocabularies = {column.key: set(column.vocabulary_list)
                    for column in census.build_model_columns()[0]
                    if hasattr(column, "vocabulary_list")}
    assert set(vocabularies) == {"education", "marital_status", "relationship", "workclass"}
    for name, rows in (("adult.data", 600), ("adult.test", 400)):
        with open(tmp_path / name, newline="") as file:
            lines = list(csv.reader(file))
        assert len(lines) == rows and {len(line) for line in lines} == {15}
        columns = dict(zip(writer.COLUMNS, zip(*lines)))
        for key, vocabulary in vocabularies.items():
            assert set(columns[key]) <= vocabulary, key
        assert set(columns["occupation"]) <= set(writer.OCCUPATION) | {"?"}
        assert set(columns["income_bracket"]) == {">50K", "<=50K"}
        for key, default in zip(writer.COLUMNS, census._CSV_COLUMN_DEFAULTS):
            if default == [0]:  # the integer columns parse as int32, as decode_csv reads them
                assert all(0 <= int(v) < 2**31 for v in columns[key]), key
            else:
                assert all(v and " " not in v for v in columns[key]), key
        assert all(writer.EDUCATION_NUM[e] == int(n)
                   for e, n in zip(columns["education"], columns["education_num"]))
        labels = np.array(columns["income_bracket"]) == ">50K"
        part = truth["train" if name == "adult.data" else "eval"]
        assert part["label_mean"] == pytest.approx(labels.mean())
        assert part["planted_accuracy"] > part["accuracy_baseline"]
    assert json.loads((tmp_path / "census.json").read_text()) == truth


def test_the_planted_truth_is_what_its_rows_were_drawn_from():
    writer = _module("write_census")
    columns, probability, labels = writer.generate(20000, seed=5)
    assert probability == pytest.approx(1 / (1 + np.exp(-writer.planted_logit(columns))))
    assert labels.mean() == pytest.approx(probability.mean(), abs=0.01)
    # The AUC from ranks, ties shared, against counting every pair of a small sample.
    rng = np.random.default_rng(0)
    scores, marks = np.round(rng.random(300), 1), rng.integers(0, 2, 300)
    pairs = [(s > t) + 0.5 * (s == t) for s, a in zip(scores, marks) if a
             for t, b in zip(scores, marks) if not b]
    assert writer.auc(marks, scores) == pytest.approx(np.mean(pairs))


def test_the_migrated_program_reads_single_examples_and_builds_wide_and_deep(tmp_path,
                                                                             monkeypatch):
    _module("write_census").write(tmp_path, train_rows=50, eval_rows=50)
    census = _module("census")
    assert isinstance(census.MODEL, sm.Model)
    assert census.MODEL.params == {"data_dir": "/tmp/census_data"}  # --data-dir's to set
    with tf.Graph().as_default():
        dataset = census.train_input_fn({"data_dir": str(tmp_path)})
        features, label = dataset.element_spec
        assert label.dtype == tf.bool and label.shape.rank == 0
        assert set(features) == set(census._CSV_COLUMNS) - {"income_bracket"}
        assert features["age"].dtype == tf.int32 and features["occupation"].dtype == tf.string
        batch = tf1.data.make_one_shot_iterator(dataset.batch(8)).get_next()
        spec = census.MODEL.model_fn(*batch, sm.ModeKeys.TRAIN, {})
        assert set(spec.optimizer) == {"dnn", "linear"}
        shapes = {v.op.name: v.shape.as_list() for v in tf1.trainable_variables()}
    assert [shapes[f"dnn/hiddenlayer_{i}/kernel"][1] for i in range(4)] == [100, 75, 50, 25]
    assert shapes["dnn/logits/kernel"] == [25, 1]
    # The occupation's embedding (8 wide) and the two crossings' tables (1,000 rows each).
    assert shapes["dnn/input_from_feature_columns/input_layer/occupation_embedding/"
                  "embedding_weights"] == [1000, 8]
    assert shapes["linear/linear_model/education_X_occupation/weights"] == [1000, 1]
    assert shapes["linear/linear_model/age_bucketized_X_education_X_occupation/weights"] == \
        [1000, 1]
