"""ModelSpec.export_outputs and api.parsing_serving_input_fn: the contract, checked where it
enters, as EstimatorSpec checked it (graphs only; the SavedModel they make is
tests/inprocess/test_serving.py)."""

from __future__ import annotations

import pytest
import tensorflow as tf

import sync_mnist.api as sm
import sync_mnist.canned as canned

tf1 = tf.compat.v1
fc = tf1.feature_column


def _spec(**kwargs) -> sm.ModelSpec:
    return sm.ModelSpec(sm.ModeKeys.PREDICT, predictions={"p": tf.zeros([2, 1])}, **kwargs)


def test_export_outputs_default_to_the_predictions_and_one_output_is_the_default():
    with tf.Graph().as_default():
        spec = _spec()
        assert list(spec.export_outputs) == ["serving_default"]
        assert dict(spec.export_outputs["serving_default"].outputs) == dict(spec.predictions)
        value = sm.RegressionOutput(tf.zeros([2, 1]))
        assert _spec(export_outputs={"regression": value}).export_outputs == {
            "regression": value, "serving_default": value}


@pytest.mark.parametrize("outputs, message", [
    (lambda: {"a": sm.RegressionOutput(tf.zeros([2])), "b": sm.PredictOutput(
        {"p": tf.zeros([2])})}, r"export_outputs has 2 signatures \(a, b\) and none is the "
                                "default: name one 'serving_default'"),
    (lambda: {"serving_default": {"p": tf.zeros([2])}}, r"export_outputs\['serving_default'\] "
                                                        "must be a ClassificationOutput"),
    (lambda: {"c": sm.ClassificationOutput()}, "give scores, classes or both"),
    (lambda: {"c": sm.ClassificationOutput(classes=tf.zeros([2, 2]))},
     "classes must be a string tensor, got float32"),
    (lambda: {"r": sm.RegressionOutput(tf.zeros([2], tf.int64))},
     "value must be a float32 tensor, got int64"),
    (lambda: {"p": sm.PredictOutput({})}, "outputs must be a non-empty dict"),
])
def test_bad_export_outputs_are_named(outputs, message):
    with tf.Graph().as_default(), pytest.raises(sm.ContractError, match=message):
        _spec(export_outputs=outputs())


def test_the_parsing_serving_input_takes_serialized_examples():
    spec = {"x": tf.io.FixedLenFeature([2], tf.float32), "c": tf.io.VarLenFeature(tf.string)}
    with tf.Graph().as_default():
        inputs, features = sm.parsing_serving_input_fn(spec)({})
        (name, examples), = inputs.items()
        assert name == "examples" and examples.dtype == tf.string
        assert examples.shape.as_list() == [None]
        assert examples.op.name == "input_example_tensor"  # the Estimator's name
        assert features["x"].shape.as_list() == [None, 2]
        assert isinstance(features["c"], tf.SparseTensor)
    with pytest.raises(sm.ContractError, match="feature_spec must be a non-empty dict"):
        sm.parsing_serving_input_fn({})


def test_a_canned_model_parses_its_columns_and_not_its_weight():
    x = fc.numeric_column("x", shape=[2])
    color = fc.categorical_column_with_hash_bucket("color", 10)
    model = canned.DNNLinearCombinedRegressor(
        linear_feature_columns=[x, color], dnn_feature_columns=[x, fc.embedding_column(color, 2)],
        dnn_hidden_units=[2], weight_column=fc.numeric_column("w"), train_input_fn=None,
        eval_input_fn=None)
    with tf.Graph().as_default():
        _, features = model.serving_input_fn({})
        spec = model.model_fn(features, None, sm.ModeKeys.PREDICT, {})
    assert sorted(features) == ["color", "x"]
    assert sorted(spec.export_outputs) == ["predict", "regression", "serving_default"]
    own = lambda params: ({"x": tf1.placeholder(tf.float32)}, {})  # noqa: E731
    assert canned.LinearRegressor([x], train_input_fn=None, eval_input_fn=None,
                                  serving_input_fn=own).serving_input_fn is own
