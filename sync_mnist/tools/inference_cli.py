"""`sync-mnist evaluate|predict`: use a model that training exported (inference.py)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sync_mnist.core import config as config_lib
from sync_mnist.task import options

COMMANDS = ("evaluate", "predict")


def model_parser() -> argparse.ArgumentParser:
    parser = options.Parser(prog="sync-mnist", description="Use a model that training "
                            "exported (--export-dir, or LOGDIR/saved_model).")
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate = commands.add_parser(
        "evaluate", help="accuracy, loss and confusion matrix on the test digits",
        description="Accuracy, loss and confusion matrix of a trained model on the test digits.")
    predict = commands.add_parser(
        "predict", help="the digit in each 28x28 grayscale PNG",
        description="The digit in each 28x28 grayscale PNG (white on black, as in MNIST), "
                    "with its probability.")
    for command in (evaluate, predict):
        command.add_argument("--saved-model", type=Path, required=True, metavar="DIR",
                             help="the SavedModel directory (required)")
        command.add_argument("--verbose", action="store_true",
                             help="show TensorFlow's C++ logs (default: hidden)")
    evaluate.add_argument("--data-dir", type=Path, default=None,
                          help="your own MNIST files, as for training (default: none: the "
                               "copy that ships with sync_mnist)")
    predict.add_argument("images", nargs="+", type=Path, metavar="IMAGE.png",
                         help="28x28 grayscale PNG files")
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
    from sync_mnist.tools import inference

    try:
        model = inference.load_model(args.saved_model)
        if args.command == "evaluate":
            images, labels, description = inference.test_digits(args.data_dir)
            print(f"model {args.saved_model} on {description}")
            print(inference.evaluate(model, images, labels).format())
        else:
            for prediction in inference.predict(model, args.images):
                print(prediction.format())
    except (inference.ModelError, inference.ImageError, data.DataError) as e:
        for line in str(e).splitlines():  # every bad image, one per line
            print(f"error: {line}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    except Exception as e:  # a TensorFlow error or a bug: one line, then the exit code
        logging.getLogger("sync_mnist").error("failed: %s: %s", type(e).__name__,
                                              config_lib.first_line(e))
        return config_lib.EXIT_FAILED
    return config_lib.EXIT_OK
