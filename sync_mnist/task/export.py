"""The trained model as a SavedModel anyone can load: no devices, no training state.

At the end of training the chief reads the trained weights from the ps (they live there, not
on the chief), builds a fresh graph of the model function in PREDICT mode on no device, loads
the weights into it and saves that graph. Nothing of the cluster goes in: no ps device
strings, no sync queues or accumulators, no optimizer slots, no counters.

The signatures are the PREDICT ModelSpec's export_outputs, as the Estimator exported them
(export_lib.build_all_signature_defs): a PredictOutput takes the inputs of the model's
serving_input_fn (without one, the features as the training data has them) and answers its
tensors; a ClassificationOutput or a RegressionOutput takes serialized tf.train.Examples, and
so is exported only when the serving input is one string tensor (api.parsing_serving_input_fn),
as TensorFlow Serving's Classify and Regress APIs need. Without export_outputs: one signature,
`serving_default`, of the predictions. A default signature that could not be exported is the
predictions' PredictOutput instead, so that every SavedModel has one.

Loaded in TensorFlow 2, with no import of this package:
  model = tf.saved_model.load(DIR)
  out = model.signatures["serving_default"](**inputs)
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from sync_mnist import api
from sync_mnist.core import checkpoints, placement

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

SIGNATURE = api.DEFAULT_SERVING_KEY


class _Serving:
    def __init__(self, model: api.Model, params: dict, example: tuple):
        """The model's PREDICT graph, on no device, in the current graph."""
        if model.serving_input_fn is None:
            features, _ = placement.placeholders(*example)
            inputs = features if isinstance(features, dict) else {"features": features}
        else:
            inputs, features = model.serving_input_fn(dict(params))
        spec = placement.build(model.model_fn, features, None, api.ModeKeys.PREDICT, params,
                               num_ps=1, ps_job=None).spec
        self.signatures = signature_defs(inputs, spec.export_outputs, spec.predictions)


def signature_defs(inputs: dict, export_outputs: dict, predictions: dict) -> dict:
    """{signature name: SignatureDef} of the export outputs, from the serving input's tensors.

    A classification or regression signature takes serialized tf.train.Examples (its input
    "inputs"): one string tensor. With any other serving input it is left out, with a warning,
    as the Estimator left it out; the default signature is then the predictions'.
    """
    values = list(inputs.values())
    examples = values[0] if len(values) == 1 and isinstance(values[0], tf.Tensor) and \
        values[0].dtype == tf.string else None
    signatures, left_out = {}, []
    for name, output in export_outputs.items():
        if isinstance(output, api.PredictOutput):
            signatures[name] = tf1.saved_model.predict_signature_def(inputs, dict(output.outputs))
        elif examples is None:
            left_out.append(name)
        elif isinstance(output, api.ClassificationOutput):
            signatures[name] = tf1.saved_model.classification_signature_def(
                examples, output.classes, output.scores)
        else:
            signatures[name] = tf1.saved_model.regression_signature_def(examples, output.value)
    if left_out:
        log.warning("the SavedModel has no signature %s: a classification or regression "
                    "signature takes serialized tf.train.Examples, and the serving input is %s",
                    ", ".join(left_out), ", ".join(inputs))
    if SIGNATURE not in signatures:
        signatures[SIGNATURE] = tf1.saved_model.predict_signature_def(inputs, dict(predictions))
    return signatures


def variable_names(model: api.Model, params: dict, example: tuple) -> list[str]:
    """Names of the variables of the model's PREDICT graph: what the SavedModel holds."""
    with tf.Graph().as_default() as graph:
        _Serving(model, params, example)
        return [v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)]


def read_weights(run: Callable, graph: tf.Graph, names: list[str]) -> dict[str, np.ndarray]:
    """Reads the model's trained weights through a session of the training graph.

    Args:
      run: runs fetches in a session of `graph` (the chief's, with its bounded options); the
        variables live on the ps, so this is where their values cross to the chief.
      graph: the training graph, which holds the model's variables among many others.
      names: the variables to read (variable_names).

    Returns:
      {variable name: value} for exactly `names`, each whole: a variable cut into one slice
      per ps (placement.py) is joined again here, so the SavedModel is the same whatever the
      number of ps.
    """
    wholes = placement.whole_variables(graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))
    missing = [n for n in names if n not in wholes]
    if missing:
        raise ValueError(f"the training graph has no variable {missing[0]!r} to export")
    values = run([wholes[n].slices for n in names])
    return {n: np.concatenate(slices, axis=0) for n, slices in zip(names, values)}


def write_saved_model(model: api.Model, params: dict, example: tuple,
                      weights: dict[str, np.ndarray], export_dir: Path) -> None:
    """Saves the model's PREDICT graph with `weights` to export_dir, replacing an earlier one.

    It is written next to export_dir first and moved into place, so export_dir never holds a
    half-written model. A write that fails for want of room (a full --logdir, where export_dir
    is by default) leaves nothing behind, and raises ExportError naming the directory.
    """
    export_dir = Path(export_dir)
    partial = export_dir.with_name(f".{export_dir.name}.partial-{os.getpid()}")
    previous = export_dir.with_name(f".{export_dir.name}.previous-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _write(model, params, example, weights, partial)
    except tf.errors.ResourceExhaustedError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise ExportError(f"could not write the trained model to {export_dir}: "
                          f"{checkpoints.storage_error(e)}") from None
    if export_dir.exists():
        export_dir.rename(previous)
    partial.rename(export_dir)
    shutil.rmtree(previous, ignore_errors=True)


class ExportError(RuntimeError):
    """The trained model could not be written."""


def _write(model: api.Model, params: dict, example: tuple, weights: dict[str, np.ndarray],
           partial: Path) -> None:
    with tf.Graph().as_default() as graph:
        serving = _Serving(model, params, example)
        variables = graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
        with tf1.Session(graph=graph) as sess:
            # Feeding each variable's initial value initialises it to the trained weights.
            sess.run([v.initializer for v in variables],
                     {v.initial_value: weights[v.op.name] for v in variables})
            # A model's lookup tables (a vocabulary column's) are filled when it is loaded.
            tables = graph.get_collection(tf1.GraphKeys.TABLE_INITIALIZERS)
            builder = tf1.saved_model.Builder(str(partial))
            builder.add_meta_graph_and_variables(
                sess, [tf1.saved_model.SERVING], clear_devices=True, strip_default_attrs=True,
                signature_def_map=serving.signatures,
                main_op=tf1.tables_initializer() if tables else None)
            builder.save()
