"""`sync-mnist-clicks`: the click model's generated clicks written as a click log
(models/clickwriter.py writes the files, models/clicklog.py reads them;
models/clickformat.py's docstring tells their formats).

    sync-mnist-clicks DIR                          # 600,000 + 50,000 clicks of --model ctr, TSV
    sync-mnist-clicks DIR --format tfrecord --gzip
    sync-mnist-clicks DIR --model sync_mnist.models.ctr:SMALL --train-files 6
    sync-mnist-cluster --model ctr --data-dir DIR  # trains on DIR/train-*, evaluates on DIR/eval-*
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sync_mnist.core import tfcompat
from sync_mnist.core.shard import DataError
from sync_mnist.models import clickformat, clickwriter

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sync-mnist-clicks",
        description="Write the click model's generated clicks (sync_mnist/models/ctr.py, its "
                    "planted model) as a click log: Criteo's tab-separated format or TFRecord "
                    "files of tf.train.Example, cut into files, with clicks.json; then "
                    "`sync-mnist-cluster --model ctr --data-dir DIR` trains on them.")
    p.add_argument("out", type=Path, metavar="DIR",
                   help="directory to write train-*, eval-* and clicks.json into (new or empty)")
    p.add_argument("--model", default="ctr", choices=tuple(clickformat.MODELS),
                   help="whose clicks: ctr (26 fields) or its SMALL variant (8 fields); train "
                        "it with the same --model (default: ctr)")
    p.add_argument("--format", default="tsv", choices=("tsv", "tfrecord"),
                   help="tsv: Criteo's format, a click a line; tfrecord: tf.train.Example "
                        "records (default: tsv)")
    p.add_argument("--gzip", action="store_true", help="gzip every file (default: off)")
    p.add_argument("--seed", type=int, default=0,
                   help="the planted model's and the clicks' seed: --seed of a run that "
                        "generates them in memory draws the same (default: 0)")
    p.add_argument("--train-examples", type=int, default=None,
                   help="training clicks (default: the model's, 600,000 for ctr, 40,000 for "
                        "SMALL)")
    p.add_argument("--eval-examples", type=int, default=None,
                   help="evaluation clicks (default: the model's, 50,000 for ctr, 10,000 for "
                        "SMALL)")
    p.add_argument("--train-files", type=int, default=12,
                   help="files the training clicks are cut into: the workers share them out "
                        "by file when each gets files enough for a batch, so a multiple of the "
                        "workers keeps their shards equal (default: 12)")
    p.add_argument("--eval-files", type=int, default=1,
                   help="files the evaluation clicks are cut into (default: 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    tfcompat.eager_mode(verbose=False)  # TensorFlow as it comes, without its start-up notes
    from sync_mnist.models import ctr

    model = getattr(ctr, clickformat.MODELS[args.model].rpartition(":")[2])
    params = {**model.params, "seed": args.seed}
    train = params["train_examples"] if args.train_examples is None else args.train_examples
    evaluation = params["eval_examples"] if args.eval_examples is None else args.eval_examples
    for name, value in (("--train-examples", train), ("--eval-examples", evaluation),
                        ("--train-files", args.train_files), ("--eval-files", args.eval_files)):
        if value < 1:
            print(f"error: {name} must be at least 1, got {value}", file=sys.stderr)
            return 2
    try:
        manifest = clickwriter.write(args.out, params, model=args.model, kind=args.format,
                                     compress=args.gzip, train_examples=train,
                                     eval_examples=evaluation, train_files=args.train_files,
                                     eval_files=args.eval_files)
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum((args.out / n).stat().st_size for n in
               manifest[clickformat.TRAIN]["files"] + manifest[clickformat.EVAL]["files"])
    print(f"wrote {train:,} training and {evaluation:,} evaluation clicks into "
          f"{args.train_files} + {args.eval_files} files in {args.out} ({size / 1e6:,.1f} MB); "
          "the evaluation's planted log-loss is "
          f"{manifest[clickformat.EVAL]['planted_log_loss']:.4f}")
    print(f"train on them: sync-mnist-cluster --model {args.model} --data-dir {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
