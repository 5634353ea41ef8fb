"""The options and the parsing that the command lines share: the training options every task
of a cluster must agree on, and how they become a TrainConfig; the parser that makes usage
errors one line; the logging set-up, and what must happen before TensorFlow is imported.

The task's command (cli.py), the launcher's (launcher/cli.py), the after-training commands
(plot_cli.py, model_cli.py) and the straggler experiment all build their parsers from these.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from sync_mnist.models import params as model_params
from sync_mnist.models import registry
from sync_mnist import models
from sync_mnist.core import config as config_lib
from sync_mnist.core import tfcompat
from sync_mnist.core.config import ConfigError, TrainConfig, first_line

DEFAULT_EPOCHS = 12


# What str.splitlines() breaks lines at, each shown as repr() shows it ('\n' as \n).
_ESCAPED = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


class Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2 (argparse's code), without the usage dump.

    No abbreviations: the launcher forwards its argv to every task, where an abbreviation may
    name another option (`--worker` is `--workers` here, `--worker-hosts` there).
    """

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message):
        # One line even when an argument holds a line break: argparse quotes it as given.
        self.exit(config_lib.EXIT_USAGE, f"{self.prog}: error: {message.translate(_ESCAPED)}\n")


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """The options every task of a cluster must agree on (train_config reads them)."""
    g = parser.add_argument_group("training (every task of a cluster must agree)")
    _add_schedule_options(g)
    _add_file_options(g)
    _add_protocol_options(g)
    # Benchmark only (sync-mnist-bench prices the proof with it): no counters, no verdict.
    parser.add_argument("--bench-no-proof", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--summary-json", type=Path, default=None,
                        help="write the result record here as JSON (default: none)")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's C++ and deprecation logs; the launcher on a "
                             "terminal also shows every task's lines above its progress line "
                             "(default: hidden)")


def _add_schedule_options(g) -> None:
    """Which model, how long, in what batches, and how the model learns."""
    g.add_argument("--model", default=models.DEFAULT, metavar="SPEC",
                   help="the model to train: a built-in one (" + ", ".join(models.BUILT_IN)
                        + "), a module's (pkg.module:NAME) or a file's (path/to/file.py:NAME), "
                        f"NAME a sync_mnist.api.Model (default: {models.DEFAULT})")
    g.add_argument("--param", action="append", type=_param, default=None, metavar="KEY=VALUE",
                   help="one of the model's params (its api.Model params name them), read as "
                        "its default's type: a number, true or false, text, or a comma-"
                        "separated list; repeatable. A key the model has not is refused "
                        "(default: the model's own)")
    length = g.add_mutually_exclusive_group()
    length.add_argument("--train-steps", type=int,
                        help="updates (global steps) to train; in async mode, local steps per "
                             f"worker (default: --epochs {DEFAULT_EPOCHS}; "
                             + ", ".join(f"{n} for --model {m}"
                                         for m, n in models.DEFAULT_EPOCHS.items()) + ")")
    length.add_argument("--epochs", type=int,
                        help="passes over each worker's shard (default: "
                             f"{DEFAULT_EPOCHS} unless --train-steps is given; "
                             + ", ".join(f"{n} for --model {m}"
                                         for m, n in models.DEFAULT_EPOCHS.items()) + ")")
    g.add_argument("--batch-size", type=int, default=100,
                   help="examples per worker per step (default: 100)")
    g.add_argument("--learning-rate", type=float, default=0.001,
                   help="learning rate of the base optimizer (default: 0.001)")
    g.add_argument("--lr-decay", default="cosine", choices=config_lib.LR_DECAYS,
                   help="cosine: the learning rate falls from --learning-rate to 0 over the "
                        "run (cosine), so the final weights are not those of one noisy step; "
                        "none: constant, as in the question (default: cosine)")
    g.add_argument("--optimizer", default="adam", choices=config_lib.OPTIMIZERS,
                   help="base optimizer that SyncReplicasOptimizer wraps, for a model that "
                        "leaves it to the command line (default: adam)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed for initialisation, shard partition and shuffling (default: 0)")


def _add_file_options(g) -> None:
    """What it reads and writes."""
    model_params.add_spelled_options(g)
    g.add_argument("--logdir", type=Path, default=None,
                   help="chief's checkpoints and TensorBoard summaries; an existing checkpoint "
                        "is resumed (default: none)")
    save = g.add_mutually_exclusive_group()
    save.add_argument("--save-steps", type=int, default=100,
                      help="global steps between checkpoints, with --logdir (default: 100)")
    save.add_argument("--save-secs", type=float, default=None,
                      help="seconds between checkpoints instead of --save-steps, with --logdir "
                           "(default: none: every --save-steps steps)")
    g.add_argument("--restart-grace", type=float, default=5.0,
                   help="seconds past --timeout a task waits for a restarted peer: a worker "
                        "whose update waits for other workers, before it gives up (its own "
                        "push made); the ps without progress; sync-mnist-cluster "
                        "--max-restarts sets 120 (default: 5)")
    g.add_argument("--preempt-grace", type=float, default=25.0, metavar="SECS",
                   help="on SIGTERM or SIGUSR1, the cluster stops on one update and the chief "
                        "saves it (with --logdir), then every task exits 143; a task still "
                        "running this many seconds after its signal exits 143 without (keep it "
                        "below the SIGKILL that follows: Kubernetes' grace is 30 s, Slurm's "
                        "KillWait 30 s) (default: 25)")
    _add_warm_start_options(g)
    g.add_argument("--export-dir", type=Path, default=None,
                   help="where the chief saves the trained model (a SavedModel) at the end; "
                        "an earlier model there is replaced (default: LOGDIR/saved_model "
                        "with --logdir, else none)")


def _add_warm_start_options(g) -> None:
    """tf.estimator.WarmStartSettings, as flags (core/warm_start.py)."""
    g.add_argument("--warm-start-from", default=None, metavar="PATH",
                   help="initialise the model from another run's checkpoint (a prefix, or a "
                        "directory of them: its newest) or SavedModel, only where --logdir "
                        "holds no checkpoint of this run yet: a restart resumes its own; each "
                        "ps reads its share of the values, so PATH must be where every ps "
                        "can read it (default: none: initialised afresh)")
    g.add_argument("--warm-start-vars", action="append", default=None, metavar="REGEX",
                   help="with --warm-start-from: warm-start only the model's variables whose "
                        "name (as the checkpoint holds it, e.g. layer0/weights) this matches "
                        "from its start; repeat it for more (default: .*, every variable the "
                        "model function makes)")
    g.add_argument("--warm-start-map", action="append", default=None, type=name_pair,
                   metavar="NAME=PREV_NAME",
                   help="with --warm-start-from: the variable NAME takes the source's "
                        "PREV_NAME; repeat it for more (default: every variable takes its own "
                        "name there)")


def name_pair(text: str) -> tuple[str, str]:
    name, equals, prev = text.partition("=")
    if not equals or not name.strip() or not prev.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PREV_NAME")
    return name.strip(), prev.strip()


def _add_protocol_options(g) -> None:
    """Timeouts, the synchronisation, and the evaluations during training."""
    g.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any blocking wait may last: for the ps, the chief, an update, "
                        "the other workers (default: 300)")
    g.add_argument("--mode", default="sync", choices=config_lib.MODES,
                   help="sync: SyncReplicasOptimizer; async: the plain optimizer, to compare "
                        "(default: sync)")
    g.add_argument("--replicas-to-aggregate", type=whole_number, default=None,
                   help="gradients averaged per update; fewer than the workers makes the rest "
                        "backup workers, whose late gradients are dropped (default: every "
                        "worker's)")
    g.add_argument("--setup", default="fixed", choices=config_lib.SETUPS,
                   help="fixed: this project's design; question: replay the question's "
                        "Supervisor + init tokens design, which is not synchronous "
                        "(default: fixed)")
    g.add_argument("--log-every", type=int, default=20,
                   help="local steps between progress lines (default: 20)")
    g.add_argument("--eval-every", type=int, default=None, metavar="K",
                   help="the chief evaluates on the model's evaluation data every K updates "
                        "(global steps), into TensorBoard (test/accuracy) and the result record "
                        "(default: none: only at the end)")
    g.add_argument("--eval-at-start", action="store_true",
                   help="the chief also evaluates the model as it starts to train (initialised, "
                        "warm-started, restored or found on the ps), before the first update, "
                        "and logs it as it logs the final evaluation (default: off)")
    g.add_argument("--target-accuracy", type=float, default=None, metavar="A",
                   help="stop the whole cluster, all workers on the same update, at the first "
                        "of those evaluations whose test accuracy reaches A (0 < A <= 1; needs "
                        "--eval-every); not reached: training runs the planned length and "
                        "still exits 0 (default: none)")
    g.add_argument("--wire-dtype", default="float32", choices=config_lib.WIRE_DTYPES,
                   help="what the weights and gradients cross between ps and worker in: "
                        "bfloat16 halves the bytes of every pull and push (each cast where it "
                        "is sent, float32 again where it arrives, rounded to 8 significant "
                        "bits); the variables, the optimizer and the evaluation stay float32 "
                        "(default: float32)")
    g.add_argument("--count-examples", default=None, metavar="FEATURE",
                   help="an int64 id feature of the training data (one id an example): the ps "
                        "counts each id's uses in the applied updates, and the data verdict "
                        "says whether each was used once a pass; any optimizer (default: none)")
    g.add_argument("--count-examples-ids", type=whole_number, default=1_000_000, metavar="N",
                   help="--count-examples' ids run from 0 below N, 4 bytes each on ps 0 (and "
                        "in each checkpoint); an id outside is exit 2 (default: 1000000)")


def _param(text: str) -> tuple[str, str]:
    try:
        return model_params.parse(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--param {text!r}: ")) from None


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The validated TrainConfig of parsed add_training_options options."""
    epochs = args.epochs if args.epochs is not None or args.train_steps is not None \
        else models.DEFAULT_EPOCHS.get(args.model, DEFAULT_EPOCHS)
    registry.check(args.model)
    params = model_params.given(args.param or ())
    for key, option in model_params.SPELLED.items():  # the same door
        value = getattr(args, key)
        if value is not None and key in params:
            raise ConfigError(f"{option} {value} and --param {key}={params[key]}: give one")
        if value is not None:
            params[key] = str(value)
    return TrainConfig(model=args.model, train_steps=args.train_steps, epochs=epochs,
                       batch_size=args.batch_size, learning_rate=args.learning_rate,
                       lr_decay=args.lr_decay,
                       optimizer=args.optimizer, seed=args.seed,
                       params=params,
                       logdir=args.logdir, timeout=args.timeout,
                       mode=args.mode, log_every=args.log_every, save_steps=args.save_steps,
                       save_secs=args.save_secs, export_dir=_export_dir(args),
                       restart_grace=args.restart_grace, preempt_grace=args.preempt_grace,
                       replicas_to_aggregate=args.replicas_to_aggregate, setup=args.setup,
                       proof=not args.bench_no_proof, eval_every=args.eval_every,
                       eval_at_start=args.eval_at_start,
                       target_accuracy=args.target_accuracy, wire_dtype=args.wire_dtype,
                       warm_start=_warm_start(args), count_examples=args.count_examples,
                       count_examples_ids=args.count_examples_ids)


def _warm_start(args: argparse.Namespace) -> config_lib.WarmStart | None:
    if args.warm_start_from is None:
        for flag, given in (("--warm-start-vars", args.warm_start_vars),
                            ("--warm-start-map", args.warm_start_map)):
            if given:
                raise config_lib.ConfigError(f"{flag} needs --warm-start-from PATH")
        return None
    return config_lib.WarmStart(args.warm_start_from, tuple(args.warm_start_vars or (".*",)),
                                tuple(args.warm_start_map or ()))


def _export_dir(args: argparse.Namespace) -> Path | None:
    if args.export_dir is None and args.logdir is not None:
        return args.logdir / "saved_model"
    return args.export_dir


def task_arguments(argv: list[str], launcher_only: tuple[str, ...]) -> list[str]:
    """The launcher's own argv minus its own options: what every task is started with.

    Exact because the parser takes no abbreviations: every option in argv is spelled in full,
    as `--name value` or `--name=value`, and each launcher-only option takes one value.
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in launcher_only:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def setup_logging(verbose: bool, tag: str) -> None:
    """Log lines to stderr, each tagged `[tag]`; call it before TensorFlow is imported."""
    before_tensorflow(verbose)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogFormatter(f"%(asctime)s [{tag}] %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def before_tensorflow(verbose: bool) -> None:
    """Before TensorFlow is imported."""
    tfcompat.defer_keras()  # no Keras 3 at start-up; a model that uses it gets it
    if not verbose:
        # TensorFlow's C++ logs (cuInit, CPU features, gRPC start-up) say nothing a user needs.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


class LogFormatter(logging.Formatter):
    """Warnings and errors start `warning: ` or `error: `: they stand out in a scrolling log,
    and the launcher's live display (progress.py) keeps them on screen."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            record.message = f"{record.levelname.lower()}: {record.message}"
        return super().formatMessage(record)


def usage_error(error: Exception) -> int:
    """Says `error: ...` in one line on stderr; returns the usage exit code."""
    print(f"error: {first_line(error)}", file=sys.stderr)
    details = getattr(error, "details", None)  # a model's own traceback (api.ContractError)
    if details:
        print(details, file=sys.stderr)
    return config_lib.EXIT_USAGE
