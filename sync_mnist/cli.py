"""Command line: `sync-mnist` runs one task; `sync-mnist-cluster` runs a localhost cluster.

This is the only module that reads argparse, sys.argv or the environment (TF_CONFIG is read
here and parsed in cluster.py). It builds a validated TaskConfig and hands it down.

One task per host:
    sync-mnist --role ps     --index 0 --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222,h3:2222
    sync-mnist --role worker --index 0 --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222,h3:2222
    ... (worker 1 and 2 likewise)

The same command in every task, which learns its place from the environment:
    TF_CONFIG='{"cluster": {...}, "task": {...}}' sync-mnist   # a Kubernetes TFJob pod
    srun --ntasks 4 sync-mnist                                 # a Slurm step: rank 0 is the ps

The model the chief saved (--export-dir, or LOGDIR/saved_model), in TensorFlow 2, no cluster:
    sync-mnist evaluate --model DIR
    sync-mnist predict  --model DIR digit.png ...
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import signal
import sys
from pathlib import Path

from sync_mnist import cluster as cluster_lib
from sync_mnist import config as config_lib
from sync_mnist.launcher import netns
from sync_mnist.config import TaskConfig, TrainConfig

DEFAULT_EPOCHS = 12


# What str.splitlines() breaks lines at, each shown as repr() shows it ('\n' as \n).
_ESCAPED = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2 (argparse's code), without the usage dump.

    No abbreviations: the launcher forwards its argv to every task, where an abbreviation may
    name another option (`--worker` is `--workers` here, `--worker-hosts` there).
    """

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message):
        # One line even when an argument holds a line break: argparse quotes it as given.
        self.exit(config_lib.EXIT_USAGE, f"{self.prog}: error: {message.translate(_ESCAPED)}\n")


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("training (every task of a cluster must agree)")
    length = g.add_mutually_exclusive_group()
    length.add_argument("--train-steps", type=int,
                        help="updates (global steps) to train; in async mode, local steps per "
                             f"worker (default: --epochs {DEFAULT_EPOCHS})")
    length.add_argument("--epochs", type=int,
                        help="passes over each worker's shard (default: "
                             f"{DEFAULT_EPOCHS} unless --train-steps is given)")
    g.add_argument("--batch-size", type=int, default=100,
                   help="examples per worker per step (default: 100)")
    g.add_argument("--learning-rate", type=float, default=0.001,
                   help="learning rate of the base optimizer (default: 0.001)")
    g.add_argument("--lr-decay", default="cosine", choices=config_lib.LR_DECAYS,
                   help="cosine: the learning rate falls from --learning-rate to 0 over the "
                        "run (cosine), so the final weights are not those of one noisy step; "
                        "none: constant, as in the question (default: cosine)")
    g.add_argument("--optimizer", default="adam", choices=config_lib.OPTIMIZERS,
                   help="base optimizer that SyncReplicasOptimizer wraps (default: adam)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed for initialisation, shard partition and shuffling (default: 0)")
    g.add_argument("--dataset", default="mnist", choices=("mnist", "synthetic"),
                   help="mnist: the complete MNIST (60,000 train / 10,000 test digits); "
                        "synthetic: generated, not digits, for tests (default: mnist)")
    g.add_argument("--data-dir", type=Path, default=None,
                   help="a directory with your own MNIST: the four IDX files (raw or .gz) or "
                        "mnist.npz (default: none: the copy that ships with sync_mnist)")
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
                   help="ps only: seconds past --timeout it waits without progress before it "
                        "gives up, so that restarted workers can start; sync-mnist-cluster "
                        "--max-restarts sets 120 (default: 5)")
    g.add_argument("--export-dir", type=Path, default=None,
                   help="where the chief saves the trained model (a SavedModel) at the end; "
                        "an earlier model there is replaced (default: LOGDIR/saved_model "
                        "with --logdir, else none)")
    g.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any blocking wait may last: for the ps, the chief, an update, "
                        "the other workers (default: 300)")
    g.add_argument("--mode", default="sync", choices=config_lib.MODES,
                   help="sync: SyncReplicasOptimizer; async: the plain optimizer, to compare "
                        "(default: sync)")
    g.add_argument("--replicas-to-aggregate", type=_whole_number, default=None,
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
                   help="the chief evaluates on the test digits every K updates (global "
                        "steps), into TensorBoard (test/accuracy) and the result record "
                        "(default: none: only at the end)")
    g.add_argument("--target-accuracy", type=float, default=None, metavar="A",
                   help="stop the whole cluster, all workers on the same update, at the first "
                        "of those evaluations whose test accuracy reaches A (0 < A <= 1; needs "
                        "--eval-every); not reached: training runs the planned length and "
                        "still exits 0 (default: none)")
    g.add_argument("--wire-dtype", default="float32", choices=config_lib.WIRE_DTYPES,
                   help="what each gradient crosses to the ps in: bfloat16 halves the bytes "
                        "of every push (cast on the worker, float32 again on the ps, where the "
                        "accumulators and the optimizer stay float32; each element rounded to "
                        "8 significant bits); the weights' pull stays float32 (default: "
                        "float32)")
    # Benchmark only (sync-mnist-bench prices the proof with it): no counters, no verdict.
    parser.add_argument("--bench-no-proof", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--summary-json", type=Path, default=None,
                        help="write the result record here as JSON (default: none)")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's C++ and deprecation logs; the launcher on a "
                             "terminal also shows every task's lines above its progress line "
                             "(default: hidden)")


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _train_config(args: argparse.Namespace) -> TrainConfig:
    epochs = args.epochs if args.epochs is not None or args.train_steps is not None \
        else DEFAULT_EPOCHS
    return TrainConfig(train_steps=args.train_steps, epochs=epochs,
                       batch_size=args.batch_size, learning_rate=args.learning_rate,
                       lr_decay=args.lr_decay,
                       optimizer=args.optimizer, seed=args.seed, dataset=args.dataset,
                       data_dir=args.data_dir, logdir=args.logdir, timeout=args.timeout,
                       mode=args.mode, log_every=args.log_every, save_steps=args.save_steps,
                       save_secs=args.save_secs, export_dir=_export_dir(args),
                       restart_grace=args.restart_grace,
                       replicas_to_aggregate=args.replicas_to_aggregate, setup=args.setup,
                       proof=not args.bench_no_proof, eval_every=args.eval_every,
                       target_accuracy=args.target_accuracy, wire_dtype=args.wire_dtype)


def _export_dir(args: argparse.Namespace) -> Path | None:
    if args.export_dir is None and args.logdir is not None:
        return args.logdir / "saved_model"
    return args.export_dir


def task_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sync-mnist", description="Run one task of a synchronous "
                     "parameter-server cluster that trains MNIST.",
                     epilog="`sync-mnist plot LOGDIR` draws a finished run instead (see "
                            "`sync-mnist plot --help`); to use a trained model: sync-mnist "
                            "evaluate --model DIR, sync-mnist predict --model DIR IMAGE.png ...")
    parser.add_argument("--role", help="ps or worker (default: from TF_CONFIG, or from the "
                        "rank in an srun step; given beside TF_CONFIG, it must agree)")
    parser.add_argument("--index", type=int,
                        help="task index within its role; worker 0 is the chief (default: as "
                             "--role)")
    ps_default, worker_default = cluster_lib.default_hosts(cluster_lib.DEFAULT_NUM_PS,
                                                           cluster_lib.DEFAULT_NUM_WORKERS)
    parser.add_argument("--ps-hosts", default=None,
                        help="comma-separated host:port of every ps task; with K of them, "
                             "every weight matrix and bias is cut into K slices along its "
                             "first axis, one on each ps, so each holds and serves 1/K of "
                             "the model's bytes (default: TF_CONFIG if set, else "
                             f"{','.join(ps_default)})")
    parser.add_argument("--worker-hosts", default=None,
                        help="comma-separated host:port of every worker task (default: "
                             f"TF_CONFIG if set, else {','.join(worker_default)})")
    slurm = parser.add_argument_group(
        "Slurm (an srun step with no --role, --index, host flags or TF_CONFIG)")
    slurm.add_argument("--ps", type=int, default=None,
                       help=f"the first PS ranks are ps tasks, the rest workers; the model is "
                            f"split evenly over the ps tasks, as with --ps-hosts (default: "
                            f"{cluster_lib.DEFAULT_NUM_PS})")
    slurm.add_argument("--base-port", type=int, default=None,
                       help="the port of the first task on each node, the next task's is one "
                            f"more (default: {cluster_lib.DEFAULT_BASE_PORT})")
    _add_training_options(parser)
    return parser


def _task_in_cluster(args: argparse.Namespace, parser: argparse.ArgumentParser
                     ) -> tuple[cluster_lib.ClusterLayout, str, int]:
    """The cluster and this task's role and index in it: from the flags, from TF_CONFIG (no
    host flags), or from an srun step (no host flags, no TF_CONFIG, no --role/--index)."""
    hosts_given = args.ps_hosts is not None or args.worker_hosts is not None
    tf_config = os.environ.get("TF_CONFIG")
    in_srun = (not hosts_given and not tf_config and args.role is None and args.index is None
               and os.environ.get("SLURM_PROCID") is not None)
    if not in_srun and (args.ps is not None or args.base_port is not None):
        raise config_lib.ConfigError("--ps and --base-port apply only in an srun step with no "
                                     "--role, --index, host flags or TF_CONFIG")
    if in_srun:
        num_ps = cluster_lib.DEFAULT_NUM_PS if args.ps is None else args.ps
        if num_ps < 1:
            raise config_lib.ConfigError(f"--ps {num_ps}: a cluster needs at least one ps task")
        from sync_mnist import tfcompat

        _before_tensorflow(args.verbose)  # from_slurm's hostlist parser imports TensorFlow
        tfcompat.graph_mode(args.verbose)
        return cluster_lib.from_slurm(
            os.environ, num_ps=num_ps,
            base_port=cluster_lib.DEFAULT_BASE_PORT if args.base_port is None else args.base_port)
    if not hosts_given and tf_config:
        layout, role, index = cluster_lib.from_tf_config(tf_config)
        if args.role not in (None, role) or args.index not in (None, index):
            given = " ".join(f"--{name} {value}" for name, value in (("role", args.role),
                             ("index", args.index)) if value is not None)
            raise cluster_lib.ClusterError(
                f"TF_CONFIG says this task is {role} {index}, but {given} was given")
        return layout, role, index
    missing = [flag for flag, value in (("--role", args.role), ("--index", args.index))
               if value is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}"
                     f"{' (or a TF_CONFIG, or an srun step)' if len(missing) == 2 else ''}")
    return _cluster_layout(args), args.role, args.index


def _cluster_layout(args: argparse.Namespace) -> cluster_lib.ClusterLayout:
    ps_default, worker_default = cluster_lib.default_hosts(cluster_lib.DEFAULT_NUM_PS,
                                                           cluster_lib.DEFAULT_NUM_WORKERS)
    return cluster_lib.ClusterLayout.parse(
        ",".join(ps_default) if args.ps_hosts is None else args.ps_hosts,
        ",".join(worker_default) if args.worker_hosts is None else args.worker_hosts)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `sync-mnist`: one ps or worker task. Returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:  # a subcommand, named by the first word
        return plot_main(argv[1:])
    if argv and argv[0] in MODEL_COMMANDS:  # the first word only: task flags stay as they are
        return model_main(argv)
    # Sync: in an srun step with --kill-on-bad-exit, the first task to reject an argument gets
    # the others SIGTERM, while they are rejecting the same argument. Held until the arguments
    # are checked (and ignored by `run` after a rejection), a SIGTERM does not turn their exit 2
    # (bad input) into a kill, so the step, and the job, end with 2.
    held: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
        parser = task_parser()
        args = parser.parse_args(argv)
        layout, role, index = _task_in_cluster(args, parser)
        config = TaskConfig(role=role, index=index, cluster=layout,
                            train=_train_config(args), summary_json=args.summary_json)
    except ValueError as e:  # ConfigError, ClusterError
        return _usage_error(e)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    _setup_logging(args.verbose, config.name)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if held:  # stopped while it checked its arguments, which were good
        logging.getLogger("sync_mnist").error("interrupted")
        return config_lib.EXIT_INTERRUPTED
    return _run_task(config, args.verbose)


def run() -> None:
    """The `sync-mnist` process (bin/sync-mnist, the console script, `python -m sync_mnist`):
    main(), then exit with its code."""
    try:
        code = main()
    except SystemExit as e:  # argparse: --help, or a usage error
        code = e.code
    # Sync: srun's SIGTERM to the other tasks may still come as this one exits 2. Python's
    # shutdown puts back the default action of a signal it handles, not of one it ignores.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(code)


def _run_task(config: TaskConfig, verbose: bool) -> int:
    from sync_mnist import preflight, report, tfcompat

    result = report.TaskResult(role=config.role, index=config.index, mode=config.train.mode)
    if config.summary_json:
        try:
            preflight.check_output_file(config.summary_json, "--summary-json")
        except config_lib.ConfigError as e:
            return _usage_error(e)  # and no record: where it would go is what is wrong
    try:
        # The user's to fix (a taken port, an unwritable --logdir): say so at once, not after
        # TensorFlow's start-up of a few seconds.
        preflight.check_task(config)
    except ValueError as e:  # ConfigError, ClusterError
        _usage_error(e)
        result.error = _first_line(e)
        _finish(config, result, config_lib.EXIT_USAGE)
    try:
        tfcompat.graph_mode(verbose)
        # Imported only now: they import TensorFlow, which must see the log settings first.
        from sync_mnist import data, ps, worker
    except KeyboardInterrupt:  # stopped while TensorFlow loads: nothing to report yet
        return config_lib.EXIT_INTERRUPTED

    log = logging.getLogger("sync_mnist")

    def last_resort(message: str) -> None:  # see TaskTimeout: unwinding blocked after a timeout
        log.error("%s (exiting: closing the sessions blocked for %g s)", message,
                  config_lib.TaskTimeout.UNWIND_GRACE_SECS)
        _finish(config, report.TaskResult(role=config.role, index=config.index,
                                          mode=config.train.mode, error=message),
                config_lib.EXIT_TIMEOUT)

    config_lib.TaskTimeout.last_resort = last_resort
    try:
        if config.train.setup == "question":
            from sync_mnist import question  # the specimen; nothing else imports it

            if config.role == "ps":
                question.run_question_ps(config)
            result = question.run_question_worker(config)
        elif config.role == "ps":
            result = ps.run_ps(config)
        else:
            result = worker.run_worker(config)
        code = report.exit_code_for(result)
    except cluster_lib.Unreachable as e:  # a ps that may still come: retried, as a timeout
        _usage_error(e)
        result.error, code = _first_line(e), config_lib.EXIT_TIMEOUT
    except (ValueError, data.DataError) as e:  # ConfigError, ClusterError, DataError
        _usage_error(e)
        result.error, code = _first_line(e), config_lib.EXIT_USAGE
    except ps.TaskTimeout as e:
        log.error("%s", e)
        result.error, code = str(e), config_lib.EXIT_TIMEOUT
    except KeyboardInterrupt:
        log.error("interrupted")
        result.error, code = "interrupted", config_lib.EXIT_INTERRUPTED
    except Exception as e:  # a TensorFlow OpError or a bug: one line, then the exit code
        if _interrupted_inside_tensorflow(e):
            log.error("interrupted")
            result.error, code = "interrupted", config_lib.EXIT_INTERRUPTED
        else:
            log.error("failed: %s: %s", type(e).__name__, _first_line(e))
            if verbose:
                log.exception("traceback")
            result.error = f"{type(e).__name__}: {_first_line(e)}"
            code = (config_lib.EXIT_PEER_LOST if _peer_lost(e) else
                    config_lib.EXIT_TIMEOUT if _timed_out(e) else config_lib.EXIT_FAILED)
    _finish(config, result, code)


def _finish(config: TaskConfig, result, code: int) -> None:
    """Writes the result record and ends the process with `code`."""
    result.exit_code = code
    # ru_maxrss is in KiB on Linux.
    result.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if config.summary_json:
        try:
            result.write_json(config.summary_json)
        except OSError as e:  # checked at the start (preflight); something changed since
            logging.getLogger("sync_mnist").error(
                "could not write --summary-json %s: %s", config.summary_json, e.strerror or e)
            code = code or config_lib.EXIT_FAILED
    # The gRPC server has no clean shutdown in TF2; leave without running its destructor,
    # which can block, once everything this task owes anyone has been sent and written.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def plot_main(argv: list[str]) -> int:
    """`sync-mnist plot LOGDIR`: draws a finished run into a PNG (see plot.py)."""
    parser = _Parser(prog="sync-mnist plot", description="Draw a finished run's contributions "
                     "per worker against global_step, and its loss, into a PNG, from the "
                     "summaries the chief wrote with --logdir. Needs matplotlib "
                     "(pip install 'sync_mnist[plot]').")
    parser.add_argument("logdir", type=Path, help="the run's --logdir")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="the PNG to write (default: LOGDIR/synchrony.png)")
    parser.add_argument("--title", default=None,
                        help="the picture's title (default: the name of LOGDIR)")
    args = parser.parse_args(argv)
    _setup_logging(False, "plot")
    from sync_mnist import plot, preflight, tfcompat

    output = args.output or args.logdir / "synchrony.png"
    try:
        # At once, before TensorFlow's slow start: matplotlib, something to draw, and
        # somewhere to write it.
        plot.require_matplotlib()
        plot.events_files(args.logdir)
        preflight.check_output_file(output, "-o")
        tfcompat.graph_mode(verbose=False)  # quiet: TensorFlow reads the events files
        series = plot.plot_run(args.logdir, output, title=args.title)
    except (plot.PlotError, config_lib.ConfigError) as e:
        return _usage_error(e)
    logging.getLogger("sync_mnist").info(
        "wrote %s: contributions %s at global_step %d", output, series.final_contributions,
        series.final_step)
    return config_lib.EXIT_OK


def launch_main(argv: list[str] | None = None) -> int:
    """Entry point of `sync-mnist-cluster`: P ps + N workers as processes on localhost."""
    parser = _Parser(prog="sync-mnist-cluster", description="Start a synchronous "
                     "parameter-server cluster on this machine and train MNIST.")
    parser.add_argument("--ps", type=int, default=cluster_lib.DEFAULT_NUM_PS,
                        help="parameter-server tasks; every weight matrix and bias is cut into "
                             "one slice per ps, so each holds and serves an even share of "
                             f"the model's bytes (default: {cluster_lib.DEFAULT_NUM_PS})")
    parser.add_argument("--workers", type=int, default=cluster_lib.DEFAULT_NUM_WORKERS,
                        help=f"worker tasks (default: {cluster_lib.DEFAULT_NUM_WORKERS})")
    parser.add_argument("--base-port", type=int, default=cluster_lib.DEFAULT_BASE_PORT,
                        help="ps tasks listen from this port, workers after them, as "
                             "`sync-mnist` assumes by default; if any is taken, free ports are "
                             "chosen instead; 0: always free ports; in a private namespace "
                             "(--isolate) every port is free, and 0 means the default "
                             f"(default: {cluster_lib.DEFAULT_BASE_PORT})")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="restart a task that dies (killed, crashed or timed out; not one "
                             "that rejected its input or found training not synchronous), up "
                             "to this many times in all, start-up included; a task that timed "
                             "out naming a peer as missing has that peer restarted first, "
                             "killed first if it still runs (default: 0)")
    parser.add_argument("--isolate", default="auto", choices=netns.MODES,
                        help="run every task in one private network namespace with loopback "
                             "only, so no other host and no process outside it can reach the "
                             "cluster's ports; auto: where Linux allows it (root, or "
                             "unprivileged user namespaces), else say so once and go on; on: "
                             "exit 2 where impossible (default: auto)")
    _add_training_options(parser)
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, "cluster")
    from sync_mnist.launcher import launch

    try:
        if args.ps < 1 or args.workers < 1:
            raise config_lib.ConfigError(
                f"--ps {args.ps} --workers {args.workers}: a cluster needs at least one of each")
        if not 0 <= args.base_port <= 65535:
            raise config_lib.ConfigError(f"--base-port {args.base_port} is outside 0-65535")
        # In a private namespace the tasks take consecutive ports from it (0 means the
        # default there): each task would exit 2 on a port past 65535.
        first = args.base_port or cluster_lib.DEFAULT_BASE_PORT
        last = first + args.ps + args.workers - 1
        if last > 65535:
            raise config_lib.ConfigError(
                f"--base-port {args.base_port}: {args.ps} ps + {args.workers} workers need ports "
                f"{first}-{last}, beyond 65535")
        if args.max_restarts < 0:
            raise config_lib.ConfigError(
                f"--max-restarts must be 0 or more, got {args.max_restarts}")
        train = _train_config(args)
        train.aggregate(args.workers)
    except ValueError as e:
        return _usage_error(e)
    passthrough = _task_arguments(argv if argv is not None else sys.argv[1:],
                                  ("--ps", "--workers", "--base-port", "--summary-json",
                                   "--isolate", "--max-restarts"))
    return launch.run_cluster(num_ps=args.ps, num_workers=args.workers,
                              base_port=args.base_port, train=train,
                              task_args=passthrough, summary_json=args.summary_json,
                              verbose=args.verbose, isolate=args.isolate,
                              max_restarts=args.max_restarts)


MODEL_COMMANDS = ("evaluate", "predict")


def model_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sync-mnist", description="Use a model that training exported "
                     "(--export-dir, or LOGDIR/saved_model).")
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate = commands.add_parser(
        "evaluate", help="accuracy, loss and confusion matrix on the test digits",
        description="Accuracy, loss and confusion matrix of a trained model on the test digits.")
    predict = commands.add_parser(
        "predict", help="the digit in each 28x28 grayscale PNG",
        description="The digit in each 28x28 grayscale PNG (white on black, as in MNIST), "
                    "with its probability.")
    for command in (evaluate, predict):
        command.add_argument("--model", type=Path, required=True,
                             help="the SavedModel directory (required)")
        command.add_argument("--verbose", action="store_true",
                             help="show TensorFlow's C++ logs (default: hidden)")
    evaluate.add_argument("--data-dir", type=Path, default=None,
                          help="your own MNIST files, as for training (default: none: the "
                               "copy that ships with sync_mnist)")
    predict.add_argument("images", nargs="+", type=Path, metavar="IMAGE.png",
                         help="28x28 grayscale PNG files")
    return parser


def model_main(argv: list[str]) -> int:
    """`sync-mnist evaluate|predict`: exit 0, 2 on bad input (model, images, data), else 1."""
    args = model_parser().parse_args(argv)
    _setup_logging(args.verbose, args.command)
    from sync_mnist import preflight, tfcompat

    try:
        preflight.check_model_dir(args.model)  # at once, not after TensorFlow's start-up
    except config_lib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    tfcompat.eager_mode(args.verbose)
    from sync_mnist import data, inference

    try:
        model = inference.load_model(args.model)
        if args.command == "evaluate":
            images, labels, description = inference.test_digits(args.data_dir)
            print(f"model {args.model} on {description}")
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
                                              _first_line(e))
        return config_lib.EXIT_FAILED
    return config_lib.EXIT_OK


def _task_arguments(argv: list[str], launcher_only: tuple[str, ...]) -> list[str]:
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


def _setup_logging(verbose: bool, tag: str) -> None:
    _before_tensorflow(verbose)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(f"%(asctime)s [{tag}] %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def _before_tensorflow(verbose: bool) -> None:
    """Before TensorFlow is imported."""
    # `import tensorflow` imports Keras 3 eagerly, which this graph-mode program never uses:
    # about 0.9 s of CPU in every task's start-up, 4 tasks at once on a 2-core machine. With
    # TF_USE_LEGACY_KERAS, TensorFlow tries tf_keras instead, which is not installed, and
    # goes on without either (tests/test_task_identity.py checks that Keras stays out).
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    if not verbose:
        # TensorFlow's C++ logs (cuInit, CPU features, gRPC start-up) say nothing a user needs.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


class _Formatter(logging.Formatter):
    """Warnings and errors start `warning: ` or `error: `: they stand out in a scrolling log,
    and the launcher's live display (progress.py) keeps them on screen."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            record.message = f"{record.levelname.lower()}: {record.message}"
        return super().formatMessage(record)


def _usage_error(error: Exception) -> int:
    print(f"error: {_first_line(error)}", file=sys.stderr)
    return config_lib.EXIT_USAGE


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _interrupted_inside_tensorflow(error: Exception) -> bool:
    """SIGTERM during a TensorFlow call: pybind11 wraps our KeyboardInterrupt in a RuntimeError
    ("MISMATCH of original and normalized active exception types ... KeyboardInterrupt")."""
    return isinstance(error, RuntimeError) and "KeyboardInterrupt" in str(error)


def _timed_out(error: Exception) -> bool:
    """A bounded call (RunOptions.timeout_in_ms) expired wherever it was: retried, as a timeout."""
    import tensorflow as tf  # already loaded: only a running task gets here

    return isinstance(error, tf.errors.DeadlineExceededError)


def _peer_lost(error: Exception) -> bool:
    """A ps or worker went away under a running call: a restarted task can rejoin, so retry."""
    import tensorflow as tf  # already loaded: only a running task gets here

    return isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
