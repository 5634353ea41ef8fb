"""`sync-mnist evaluate|predict`: use a model that training exported (inference.py)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sync_mnist.core import config as config_lib
from sync_mnist.task import options

COMMANDS = ("evaluate", "predict")
SIGNATURE = "serving_default"  # export.SIGNATURE, without importing TensorFlow to parse
FORMATS = ("png", "jsonl", "tfrecord")  # serving.input_format's


def model_parser() -> argparse.ArgumentParser:
    parser = options.Parser(prog="sync-mnist", description="Use a model that training "
                            "exported (--export-dir, or LOGDIR/saved_model).")
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate = commands.add_parser(
        "evaluate", help="accuracy, loss and confusion matrix on the test digits",
        description="Accuracy, loss and confusion matrix of a trained model on the test digits.")
    predict = commands.add_parser(
        "predict", help="any model's answers to examples in JSON lines or TFRecords; the "
                        "digit in each 28x28 grayscale PNG",
        description="Any model's answers, one JSON line per example, to the examples in "
                    "JSON-lines files (one object per line) or TFRecord files of serialized "
                    "tf.train.Example, through one signature of its SavedModel; or, for the "
                    "MNIST models, the digit in each 28x28 grayscale PNG (white on black) with "
                    "its probability. docs/trained-model.md says what a line holds.")
    for command in (evaluate, predict):
        command.add_argument("--saved-model", type=Path, required=True, metavar="DIR",
                             help="the SavedModel directory (required)")
        command.add_argument("--verbose", action="store_true",
                             help="show TensorFlow's C++ logs (default: hidden)")
    evaluate.add_argument("--data-dir", type=Path, default=None,
                          help="your own MNIST files, as for training (default: none: the "
                               "copy that ships with sync_mnist)")
    predict.add_argument("inputs", nargs="+", type=Path, metavar="FILE",
                         help="JSON-lines files (- for standard input), TFRecord files "
                              "(.tfrecord, .tfrecords or .tfr, and .gz if compressed) or PNG "
                              "files (.png, alone)")
    predict.add_argument("--signature", default=SIGNATURE, metavar="NAME",
                         help=f"the signature to call (default: {SIGNATURE}); PNG files "
                              "always use the default")
    predict.add_argument("--format", choices=FORMATS, default=None,
                         help="the format of every FILE (default: from each file's name: "
                              ".png, a TFRecord suffix, else JSON lines)")
    return parser


def main(argv: list[str]) -> int:
    """`sync-mnist evaluate|predict`: exit 0, 2 on bad input (model, images, data), else 1."""
    args = model_parser().parse_args(argv)
    options.setup_logging(args.verbose, args.command)
    from sync_mnist.task import preflight
    from sync_mnist.core import tfcompat

    try:
        preflight.check_model_dir(args.saved_model)  # at once, not after TensorFlow's start-up
    except config_lib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    tfcompat.eager_mode(args.verbose)
    from sync_mnist.models import data
    from sync_mnist.tools import inference, serving

    try:
        if args.command == "evaluate":
            model = inference.load_model(args.saved_model)
            images, labels, description = inference.test_digits(args.data_dir)
            print(f"model {args.saved_model} on {description}")
            print(inference.evaluate(model, images, labels).format())
        else:
            _predict(args)
    except (serving.ModelError, serving.InputError, inference.ImageError,
            data.DataError) as e:
        for line in str(e).splitlines():  # every bad image, one per line
            print(f"error: {line}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    except Exception as e:  # a TensorFlow error or a bug: one line, then the exit code
        logging.getLogger("sync_mnist").error("failed: %s: %s", type(e).__name__,
                                              config_lib.first_line(e))
        return config_lib.EXIT_FAILED
    return config_lib.EXIT_OK


def _predict(args) -> None:
    """PNG files through the MNIST models' interface; any other files through the signature
    asked for, one JSON line per example, printed as each batch is answered (so a bad example
    stops the command after the answers to those before it)."""
    from sync_mnist.tools import inference, serving

    kinds = [args.format or serving.input_format(path) for path in args.inputs]
    if "png" in kinds:
        if set(kinds) != {"png"}:
            raise serving.InputError("PNG files go alone (a digit each, for an MNIST model); "
                                     "give the JSON-lines or TFRecord files in another call")
        model = inference.load_model(args.saved_model)
        for prediction in inference.predict(model, args.inputs):
            print(prediction.format())
        return
    signature = serving.signature(args.saved_model, args.signature)
    examples = (row for path, kind in zip(args.inputs, kinds)
                for row in serving.rows(path, kind, signature))
    for outputs in serving.predict(signature, examples):
        print(serving.json_line(outputs))
