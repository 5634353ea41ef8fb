"""Serving that old clients can call: a canned model's SavedModel takes serialized
tf.train.Examples through the Estimator's signatures, and `sync-mnist predict` answers any
model's SavedModel from JSON lines or TFRecords.

Each SavedModel is written in this process by export.py's own functions, from weights drawn at
random (no cluster: the chief's export of a cluster's weights is tests/cluster/test_export.py),
and its answers are compared with the model function's own predictions on the same weights in a
plain session. It is loaded with tf.saved_model.load in eager mode, as a client loads it; the
CLI's main runs in this process too (each process would cost a TensorFlow start-up).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import sync_mnist.api as sm
import sync_mnist.canned as canned
from sync_mnist.models import ctr
from sync_mnist.task import export
from sync_mnist.tools import inference_cli

tf1 = tf.compat.v1
fc = tf1.feature_column

# Three examples as a client has them: x two floats, color a word (one example has two), and
# no weight "w": serving needs none, though the model trained with one.
EXAMPLES = [{"x": [0.5, -1.0], "color": "red"}, {"x": [2.0, 1.0], "color": ["blue", "green"]},
            {"x": [0.0, 0.25], "color": "green"}]
SAME = dict(rtol=1e-5, atol=1e-6)


def _columns():
    x = fc.numeric_column("x", shape=[2])
    color = fc.categorical_column_with_vocabulary_list("color", ["red", "green", "blue"])
    return x, color


def _wide_and_deep(**kwargs) -> sm.Model:
    x, color = _columns()
    return canned.DNNLinearCombinedClassifier(
        linear_feature_columns=[x, color], dnn_feature_columns=[x, fc.embedding_column(color, 3)],
        dnn_hidden_units=[4], weight_column="w", train_input_fn=None, eval_input_fn=None,
        **kwargs)


def _serialized(example: dict) -> bytes:
    feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=example["x"])),
               "color": tf.train.Feature(bytes_list=tf.train.BytesList(value=[
                   c.encode() for c in np.atleast_1d(example["color"])]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _sparse_features() -> dict:
    """EXAMPLES as the model function takes them in training: x dense, color sparse."""
    colors = [np.atleast_1d(e["color"]) for e in EXAMPLES]
    indices = [[i, j] for i, c in enumerate(colors) for j in range(len(c))]
    return {"x": tf.constant([e["x"] for e in EXAMPLES], tf.float32),
            "color": tf.SparseTensor(indices, [str(c) for cs in colors for c in cs],
                                     [len(colors), max(map(len, colors))])}


def _own_predictions(model: sm.Model, features, seed: int = 0):
    """(weights drawn at random for every variable, the model function's PREDICT outputs on
    `features` with them), in a plain session."""
    with tf.Graph().as_default(), tf1.Session() as sess:
        spec = model.model_fn(features(), None, sm.ModeKeys.PREDICT, dict(model.params))
        rng = np.random.default_rng(seed)
        variables = tf1.global_variables()
        weights = {v.op.name: rng.normal(0, 0.5, v.shape).astype(v.dtype.as_numpy_dtype)
                   for v in variables}
        sess.run([v.initializer for v in variables],
                 {v.initial_value: weights[v.op.name] for v in variables})
        sess.run(tf1.tables_initializer())
        return weights, sess.run(dict(spec.predictions))


@pytest.fixture(scope="module")
def wide_and_deep(tmp_path_factory):
    """(the canned model's SavedModel, its own predictions of EXAMPLES)."""
    model = _wide_and_deep()
    weights, expected = _own_predictions(model, _sparse_features)
    export_dir = tmp_path_factory.mktemp("canned") / "model"
    export.write_saved_model(model, {}, None, weights, export_dir)
    return export_dir, expected


def _signatures(export_dir):
    return tf.saved_model.load(str(export_dir)).signatures


def test_a_canned_classifier_answers_serialized_examples_through_each_signature(wide_and_deep):
    export_dir, expected = wide_and_deep
    with context.eager_mode():
        examples = tf.constant([_serialized(e) for e in EXAMPLES])
        signatures = _signatures(export_dir)
        assert sorted(signatures) == ["classification", "predict", "regression",
                                      "serving_default"]
        for name in ("serving_default", "classification"):
            out = signatures[name](inputs=examples)  # TensorFlow Serving's Classify API
            assert sorted(out) == ["classes", "scores"]
            np.testing.assert_allclose(out["scores"], expected["probabilities"], **SAME)
            assert out["classes"].numpy().tolist() == [[b"0", b"1"]] * 3
        out = signatures["regression"](inputs=examples)  # the logistic, as the Estimator's
        np.testing.assert_allclose(out["outputs"], expected["logistic"], **SAME)
        out = signatures["predict"](examples=examples)
        assert sorted(out) == sorted(expected)
        for key, value in expected.items():
            if value.dtype.kind == "f":
                np.testing.assert_allclose(out[key], value, **SAME, err_msg=key)
            else:
                np.testing.assert_array_equal(out[key], value, err_msg=key)


@pytest.mark.parametrize("make, signatures, default", [
    (lambda: canned.LinearClassifier(list(_columns()), n_classes=3, train_input_fn=None,
                                     eval_input_fn=None),
     ["classification", "predict", "serving_default"], "classify"),
    (lambda: canned.DNNRegressor([3], [_columns()[0]], train_input_fn=None,
                                 eval_input_fn=None),
     ["predict", "regression", "serving_default"], "regress"),
])
def test_multi_class_and_regressor_signatures_are_the_estimators(make, signatures, default):
    model = make()
    with tf.Graph().as_default():
        exported = export.signature_defs(*_serving_graph(model))
    assert sorted(exported) == signatures
    assert exported["serving_default"].method_name == f"tensorflow/serving/{default}"
    assert list(exported["serving_default"].inputs) == ["inputs"]
    assert list(exported["predict"].inputs) == ["examples"]


def _serving_graph(model: sm.Model):
    inputs, features = model.serving_input_fn({})
    spec = model.model_fn(features, None, sm.ModeKeys.PREDICT, {})
    return inputs, spec.export_outputs, spec.predictions


def test_a_classification_signature_needs_serialized_examples_else_the_default_is_predict():
    """A canned model given its own serving_input_fn of feature tensors: the Estimator left the
    classify and regress signatures out; so does the export, and serves the predictions."""
    def serving_input_fn(params):
        inputs = {"x": tf1.placeholder(tf.float32, [None, 2]),
                  "color": tf1.placeholder(tf.string, [None, 1])}
        return inputs, dict(inputs)

    with tf.Graph().as_default():
        exported = export.signature_defs(*_serving_graph(_wide_and_deep(
            serving_input_fn=serving_input_fn)))
    assert sorted(exported) == ["predict", "serving_default"]
    assert exported["serving_default"] == exported["predict"]
    assert sorted(exported["serving_default"].inputs) == ["color", "x"]


# --------------------------------------------------------------------- sync-mnist predict


def _predict(capsys, export_dir, *args) -> tuple[int, list, str]:
    """(exit code, the JSON lines printed, stderr) of `sync-mnist predict`, in this process."""
    with context.eager_mode():
        code = inference_cli.main(["predict", "--saved-model", str(export_dir), *map(str, args)])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_predict_answers_a_canned_model_from_json_lines_and_from_tfrecords(
        wide_and_deep, tmp_path, capsys):
    export_dir, expected = wide_and_deep
    lines = tmp_path / "examples.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    records = tmp_path / "examples.tfrecord"
    with tf.io.TFRecordWriter(str(records)) as writer:
        for e in EXAMPLES:
            writer.write(_serialized(e))
    for given in (lines, records):
        code, answers, err = _predict(capsys, export_dir, given)
        assert code == 0, err
        np.testing.assert_allclose([a["scores"] for a in answers], expected["probabilities"],
                                   **SAME)
        assert [a["classes"] for a in answers] == [["0", "1"]] * 3
    code, answers, err = _predict(capsys, export_dir, "--signature", "predict", lines, records)
    assert code == 0, err
    assert [a["class_ids"] for a in answers] == expected["class_ids"].tolist() * 2
    np.testing.assert_allclose([a["logistic"] for a in answers],
                               np.concatenate([expected["logistic"]] * 2), **SAME)


@pytest.fixture(scope="module")
def click_model(tmp_path_factory):
    """(the click model's SavedModel, some ids, its own probabilities of them)."""
    model, params = ctr.SMALL, dict(ctr.SMALL.params)
    ids = ctr.generate(params, 5, part=1).ids
    weights, expected = _own_predictions(model, lambda: {ctr.IDS: tf.constant(ids)})
    export_dir = tmp_path_factory.mktemp("ctr") / "model"
    export.write_saved_model(model, params, None, weights, export_dir)
    return export_dir, ids, expected["probabilities"]


def test_predict_answers_the_click_model_from_json_lines(click_model, tmp_path, capsys):
    export_dir, ids, expected = click_model
    lines = tmp_path / "clicks.jsonl"
    lines.write_text("".join(json.dumps({"ids": row.tolist()}) + "\n" for row in ids))
    code, answers, err = _predict(capsys, export_dir, lines)
    assert code == 0, err
    assert [sorted(a) for a in answers] == [["probabilities"]] * len(ids)
    np.testing.assert_allclose([a["probabilities"] for a in answers], expected, **SAME)


@pytest.mark.parametrize("line, error", [
    ('{"ids": [1, 2]}', "line 2: input 'ids' has shape [2]; one example of [None, 8] has [8]"),
    ('{"id": [1]}', "line 2: no input 'ids': signature 'serving_default' takes ids (int64 "
                    "[None, 8])"),
    ('{"ids": [1, 2, 3, 4, 5, 6, 7, "x"]}', "line 2: input 'ids' is not int64"),
    ('{"ids": [1, 2, 3, 4, 5, 6, 7, 1.9999]}',
     "line 2: input 'ids' is not int64: 1.9999 is not a whole number"),
    ('{"ids": [1, 2, 3, 4, 5, 6, 7, true]}', "line 2: input 'ids' is not int64: true is not a "
                                             "number"),
    ('[1, 2]', "line 2: not a JSON object but list"),
    ('{"ids": [1,', "line 2: not JSON"),
])
def test_predict_names_the_bad_line_and_input(click_model, tmp_path, capsys, line, error):
    export_dir, ids, _ = click_model
    given = tmp_path / "clicks.jsonl"
    given.write_text(json.dumps({"ids": ids[0].tolist()}) + "\n" + line + "\n")
    code, answers, err = _predict(capsys, export_dir, given)
    assert code == 2 and answers == []
    assert err.startswith(f"error: {given} {error}"), err
    assert "Traceback" not in err


def test_predict_refuses_tfrecords_for_a_signature_of_feature_tensors(click_model, tmp_path,
                                                                      capsys):
    export_dir, _, _ = click_model
    (tmp_path / "clicks.tfrecord").write_bytes(b"")
    code, _, err = _predict(capsys, export_dir, tmp_path / "clicks.tfrecord", "--signature",
                            "serving_default")
    assert code == 2
    assert "need a signature that takes serialized Examples; signature 'serving_default' " \
           "takes ids (int64 [None, 8]): give it JSON lines" in err
    code, _, err = _predict(capsys, export_dir, tmp_path / "clicks.tfrecord", "--signature",
                            "classification")
    assert code == 2
    assert err.strip() == f"error: {export_dir}: no signature 'classification'; it has " \
                          "serving_default"


def test_predict_names_a_bad_tfrecord_file_and_a_feature_of_the_wrong_type(
        wide_and_deep, tmp_path, capsys):
    export_dir, _ = wide_and_deep
    (tmp_path / "text.tfrecord").write_text("not records\n")
    code, _, err = _predict(capsys, export_dir, tmp_path / "text.tfrecord")
    assert code == 2 and err.startswith(f"error: {tmp_path / 'text.tfrecord'}: not a TFRecord "
                                        "file"), err
    cut = tmp_path / "cut.tfrecord.gz"  # a gzip of records, its second half lost
    with tf.io.TFRecordWriter(str(tmp_path / "whole.gz"), options="GZIP") as writer:
        for k in range(200):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[k] * 50))}))
                .SerializeToString())
    whole = (tmp_path / "whole.gz").read_bytes()
    cut.write_bytes(whole[:len(whole) // 2])
    code, answers, err = _predict(capsys, export_dir, cut)
    assert code == 2 and answers == [], err
    assert re.fullmatch(rf"error: {re.escape(str(cut))}: damaged or cut short after its \d+ "
                        r"whole records: truncated record at \d+' failed with EOF reached\n",
                        err), err
    given = tmp_path / "ints.jsonl"  # whole numbers make an int64_list; x is float
    given.write_text(json.dumps(EXAMPLES[0]) + "\n" + '{"x": [1, 2], "color": "red"}\n')
    code, _, err = _predict(capsys, export_dir, given)
    assert code == 2
    assert err.strip() == f"error: {given} line 2: the model refused it: Key: x, Index: 0.  " \
                          "Data types don't match. Data type: int64 but expected type: float"
