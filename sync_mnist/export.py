"""The trained model as a SavedModel anyone can load: no devices, no training state.

At the end of training the chief reads the trained weights from the ps (they live there, not
on the chief), builds a fresh inference graph on no device with model.py's builders, loads the
weights into it and saves that graph. Nothing of the cluster goes in: no ps device strings, no
sync queues or accumulators, no optimizer slots, no counters.

Signature `serving_default`:
  images         uint8 [None, 28, 28]: pixels 0-255 as in MNIST (a white digit on black)
  probabilities  float32 [None, 10]
  classes        int64 [None]

Loaded in TensorFlow 2, with no import of this package:
  model = tf.saved_model.load(DIR)
  out = model.signatures["serving_default"](images=tf.constant(batch_uint8))
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from sync_mnist import model

tf1 = tf.compat.v1

SIGNATURE = "serving_default"
INPUT = "images"
PROBABILITIES = "probabilities"
CLASSES = "classes"
IMAGE_SIZE = 28


def model_variable_names() -> list[str]:
    """Names of the model's variables, as model.build_logits creates them."""
    with tf.Graph().as_default() as graph:
        model.build_logits(tf1.placeholder(tf.float32, [None, model.IMAGE_PIXELS]))
        return [v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)]


def read_weights(run: Callable, graph: tf.Graph) -> dict[str, np.ndarray]:
    """Reads the model's trained weights through a session of the training graph.

    Args:
      run: runs fetches in a session of `graph` (the chief's, with its bounded options); the
        variables live on the ps, so this is where their values cross to the chief.
      graph: the training graph, which holds the model's variables among many others.

    Returns:
      {variable name: value} for exactly the variables of the inference graph, each whole: a
      variable cut into one slice per ps (model.build_logits) is joined again here, so the
      SavedModel is the same whatever the number of ps.
    """
    wholes = model.whole_variables(graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))
    names = model_variable_names()
    missing = [n for n in names if n not in wholes]
    if missing:
        raise ValueError(f"the training graph has no variable {missing[0]!r} to export")
    values = run([wholes[n].slices for n in names])
    return {n: np.concatenate(slices, axis=0) for n, slices in zip(names, values)}


def write_saved_model(weights: dict[str, np.ndarray], export_dir: Path) -> None:
    """Saves the inference graph with `weights` to export_dir, replacing an earlier model.

    It is written next to export_dir first and moved into place, so export_dir never holds a
    half-written model.
    """
    export_dir = Path(export_dir)
    partial = export_dir.with_name(f".{export_dir.name}.partial-{os.getpid()}")
    previous = export_dir.with_name(f".{export_dir.name}.previous-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    with tf.Graph().as_default() as graph:
        images = tf1.placeholder(tf.uint8, [None, IMAGE_SIZE, IMAGE_SIZE], name=INPUT)
        # The same scaling as the training data (data.py): uint8 / 255 in float32.
        pixels = tf.reshape(tf.cast(images, tf.float32) / 255.0, [-1, model.IMAGE_PIXELS])
        logits = model.build_logits(pixels)
        probabilities = tf.nn.softmax(logits, name=PROBABILITIES)
        classes = tf.argmax(logits, axis=1, output_type=tf.int64, name=CLASSES)
        variables = graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
        with tf1.Session(graph=graph) as sess:
            # Feeding each variable's initial value initialises it to the trained weights.
            sess.run([v.initializer for v in variables],
                     {v.initial_value: weights[v.op.name] for v in variables})
            builder = tf1.saved_model.Builder(str(partial))
            builder.add_meta_graph_and_variables(
                sess, [tf1.saved_model.SERVING], clear_devices=True, strip_default_attrs=True,
                signature_def_map={SIGNATURE: tf1.saved_model.predict_signature_def(
                    inputs={INPUT: images},
                    outputs={PROBABILITIES: probabilities, CLASSES: classes})})
            builder.save()
    if export_dir.exists():
        export_dir.rename(previous)
    partial.rename(export_dir)
    shutil.rmtree(previous, ignore_errors=True)
