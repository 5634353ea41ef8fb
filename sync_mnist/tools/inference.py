"""Using a trained MNIST model: evaluate it on the test digits, classify PNG files (any
model's SavedModel on JSON lines or TFRecords: serving.py).

This runs in TensorFlow 2's eager mode and loads the SavedModel with tf.saved_model.load, as
anyone outside this package would; it needs no cluster. The model's interface is export.py's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from sync_mnist.models import data
from sync_mnist.tools import png, serving
from sync_mnist.models import mnist
from sync_mnist.task.export import SIGNATURE
from sync_mnist.tools.png import ImageError
from sync_mnist.tools.serving import ModelError

# The signature the built-in MNIST models' SavedModel serves (models/mnist.py):
#   images         uint8 [None, 28, 28]: pixels 0-255 as in MNIST (a white digit on black)
#   probabilities  float32 [None, 10]
#   classes        int64 [None]
INPUT = mnist.SERVING_INPUT
PROBABILITIES = "probabilities"
CLASSES = "classes"
IMAGE_SIZE = mnist.IMAGE_SIZE
NUM_CLASSES = mnist.NUM_CLASSES
BATCH = 1000  # images per call of the model

Model = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def load_model(model_dir: Path) -> Model:
    """Loads a SavedModel written by export.py.

    Returns:
      A function: uint8 images [n, 28, 28] -> (probabilities float32 [n, 10], classes int64 [n]).

    Raises:
      ModelError: the directory is missing, holds no SavedModel, or not one of this interface.
    """
    model_dir = Path(model_dir)
    signature = serving.load(model_dir).signatures.get(SIGNATURE)
    spec = signature.structured_input_signature[1].get(INPUT) if signature else None
    if spec is None or spec.dtype != tf.uint8 or spec.shape.as_list() != [None, IMAGE_SIZE,
                                                                           IMAGE_SIZE]:
        raise ModelError(f"{model_dir}: no signature {SIGNATURE!r} taking {INPUT!r} as uint8 "
                         f"[None, {IMAGE_SIZE}, {IMAGE_SIZE}]; is it a sync-mnist model?")

    def classify(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        probabilities, classes = [], []
        for start in range(0, len(images), BATCH):
            out = signature(**{INPUT: tf.constant(images[start:start + BATCH])})
            probabilities.append(out[PROBABILITIES].numpy())
            classes.append(out[CLASSES].numpy())
        if not probabilities:
            return np.zeros([0, NUM_CLASSES], np.float32), np.zeros([0], np.int64)
        return np.concatenate(probabilities), np.concatenate(classes)

    return classify


def test_digits(data_dir: Path | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """The test split as the model takes it: (uint8 images [n, 28, 28], labels, description).

    The one place this module reads data: the shipped MNIST, or the user's in `data_dir`.
    """
    dataset = data.load_dataset("mnist", data_dir)
    return (dataset.test_images.reshape(-1, IMAGE_SIZE, IMAGE_SIZE), dataset.test_labels,
            dataset.description)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    examples: int
    accuracy: float
    loss: float  # mean cross-entropy, from the probabilities (each at least LOSS_FLOOR)
    confusion: np.ndarray  # int64 [10, 10]: row = true digit, column = predicted digit

    LOSS_FLOOR = 1e-12  # keeps -log(p) finite when a probability rounds to 0 in float32

    def format(self) -> str:
        lines = [f"examples={self.examples} accuracy={self.accuracy:.4f} loss={self.loss:.4f}",
                 "confusion matrix (rows: true digit, columns: predicted digit):",
                 "      " + "".join(f"{d:>6}" for d in range(NUM_CLASSES))]
        for digit, row in enumerate(self.confusion):
            lines.append(f"{digit:>6}" + "".join(f"{n:>6}" for n in row))
        return "\n".join(lines)


def evaluate(model: Model, images: np.ndarray, labels: np.ndarray) -> Evaluation:
    """Accuracy, loss and confusion matrix of `model` on labelled images."""
    probabilities, classes = model(images)
    picked = probabilities[np.arange(len(labels)), labels].astype(np.float64)
    confusion = np.zeros([NUM_CLASSES, NUM_CLASSES], np.int64)
    np.add.at(confusion, (labels, classes), 1)
    return Evaluation(examples=len(labels), accuracy=float(np.mean(classes == labels)),
                      loss=float(np.mean(-np.log(np.maximum(picked, Evaluation.LOSS_FLOOR)))),
                      confusion=confusion)


def read_png(path: Path) -> np.ndarray:
    """One 28x28 grayscale PNG as uint8 [28, 28]; ImageError naming the file otherwise."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ImageError(f"{path}: cannot be read: {e.strerror or e}") from None
    png.check_header(raw, path)  # size and colour type, before anything is decoded
    try:
        pixels = tf.io.decode_png(raw, channels=1).numpy()
    except tf.errors.InvalidArgumentError as e:
        raise ImageError(f"{path}: not a readable PNG: {e.message.splitlines()[0]}") from None
    return pixels[:, :, 0]


@dataclasses.dataclass(frozen=True)
class Prediction:
    path: Path
    digit: int
    probability: float

    def format(self) -> str:
        return f"{self.path}: {self.digit} (probability {self.probability:.4f})"


def predict(model: Model, paths: list[Path]) -> list[Prediction]:
    """The class and its probability for each PNG; checks every file before classifying any.

    Raises:
      ImageError: naming every file that is not a 28x28 grayscale PNG, one per line.
    """
    images, errors = [], []
    for path in paths:
        try:
            images.append(read_png(path))
        except ImageError as e:
            errors.append(str(e))
    if errors:
        raise ImageError("\n".join(errors))
    probabilities, classes = model(np.stack(images))
    return [Prediction(path, int(c), float(p[c]))
            for path, p, c in zip(paths, probabilities, classes)]
