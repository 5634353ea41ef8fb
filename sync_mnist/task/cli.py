"""Command line of `sync-mnist`: one task of a cluster (`sync-mnist-cluster`, the localhost
cluster, is launcher/cli.py).

The command lines are the only modules that read argparse, sys.argv or the environment
(TF_CONFIG is read here and parsed in cluster.py); the options they share are options.py.
This one builds a validated TaskConfig and hands it down; `plot` and `evaluate`/`predict` go
on to plot_cli.py and inference_cli.py.

One task per host:
    sync-mnist --role ps     --index 0 --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222,h3:2222
    sync-mnist --role worker --index 0 --ps-hosts h0:2222 --worker-hosts h1:2222,h2:2222,h3:2222
    ... (worker 1 and 2 likewise)

The same command in every task, which learns its place from the environment:
    TF_CONFIG='{"cluster": {...}, "task": {...}}' sync-mnist   # a Kubernetes TFJob pod
    srun --ntasks 4 sync-mnist                                 # a Slurm step: rank 0 is the ps

The model the chief saved (--export-dir, or LOGDIR/saved_model), in TensorFlow 2, no cluster:
    sync-mnist evaluate --saved-model DIR
    sync-mnist predict  --saved-model DIR image.png ...
"""

from __future__ import annotations

import _thread
import argparse
import logging
import os
import resource
import signal
import sys
import threading
import time

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import config as config_lib
from sync_mnist.core import tfcompat
from sync_mnist.tools import inference_cli, plot_cli
from sync_mnist.task import options, preemption
from sync_mnist.core.config import TaskConfig


def task_parser() -> argparse.ArgumentParser:
    parser = options.Parser(prog="sync-mnist", description="Run one task of a synchronous "
                            "parameter-server cluster that trains a model (--model).",
                            epilog="`sync-mnist plot LOGDIR` draws a finished run instead (see "
                                   "`sync-mnist plot --help`); to use a trained model: "
                                   "sync-mnist evaluate --saved-model DIR, sync-mnist "
                                   "predict --saved-model DIR IMAGE.png ...")
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
    options.add_training_options(parser)
    return parser


def task_in_cluster(args: argparse.Namespace, parser: argparse.ArgumentParser
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
        options.before_tensorflow(args.verbose)  # from_slurm's hostlist parser imports TensorFlow
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
    return cluster_layout(args), args.role, args.index


def cluster_layout(args: argparse.Namespace) -> cluster_lib.ClusterLayout:
    ps_default, worker_default = cluster_lib.default_hosts(cluster_lib.DEFAULT_NUM_PS,
                                                           cluster_lib.DEFAULT_NUM_WORKERS)
    return cluster_lib.ClusterLayout.parse(
        ",".join(ps_default) if args.ps_hosts is None else args.ps_hosts,
        ",".join(worker_default) if args.worker_hosts is None else args.worker_hosts)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `sync-mnist`: one ps or worker task. Returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:  # a subcommand, named by the first word
        return plot_cli.main(argv[1:])
    if argv and argv[0] in inference_cli.COMMANDS:  # the first word only: task flags stay as they are
        return inference_cli.main(argv)
    # Sync: in an srun step with --kill-on-bad-exit, the first task to reject an argument gets
    # the others SIGTERM, while they are rejecting the same argument. Held until the arguments
    # are checked (and ignored by `run` after a rejection), a SIGTERM does not turn their exit 2
    # (bad input) into a kill, so the step, and the job, end with 2.
    held: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
        parser = task_parser()
        args = parser.parse_args(argv)
        layout, role, index = task_in_cluster(args, parser)
        config = TaskConfig(role=role, index=index, cluster=layout,
                            train=options.train_config(args), summary_json=args.summary_json)
    except ValueError as e:  # ConfigError, ClusterError
        return options.usage_error(e)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    options.setup_logging(args.verbose, config.name)
    signal.signal(signal.SIGINT, _raise_interrupt)
    # SIGTERM and SIGUSR1: at once before training, else the cluster stops on one update.
    logdir = config.train.logdir
    preemption.install(config.train.preempt_grace, _preempted_overdue(config), _raise_interrupt,
                       f"the chief saves it to {logdir}" if logdir else
                       "no --logdir: nothing is saved, and a rerun starts over")
    sys.unraisablehook = _interrupt_again
    if held:  # stopped while it checked its arguments, which were good
        logging.getLogger("sync_mnist").error("interrupted")
        return config_lib.EXIT_PREEMPTED
    return run_task(config, args.verbose)


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


def run_task(config: TaskConfig, verbose: bool) -> int:
    """Runs the task. Its one way out is _finish: with a result record, the process ends there;
    without one (nothing was started), main returns the code."""
    return _finish(config, *_task(config, verbose))


def _task(config: TaskConfig, verbose: bool):
    """(result record or None, exit code) of this task."""
    from sync_mnist.task import preflight, report

    if config.summary_json:
        try:
            preflight.check_output_file(config.summary_json, "--summary-json")
        except config_lib.ConfigError as e:
            return None, options.usage_error(e)  # no record: where it would go is what is wrong
    result = report.TaskResult(role=config.role, index=config.index, mode=config.train.mode)
    try:
        # The user's to fix (a taken port, an unwritable --logdir): say so at once, not after
        # TensorFlow's start-up of a few seconds.
        preflight.check_task(config)
    except ValueError as e:  # ConfigError, ClusterError
        options.usage_error(e)
        result.error = config_lib.first_line(e)
        return result, config_lib.EXIT_USAGE
    if not _load_tensorflow(verbose):  # stopped while TensorFlow loads: nothing to report yet
        return None, _interrupted()
    config_lib.TaskTimeout.last_resort = _last_resort(config)
    return stopped_as_interrupted(lambda: _run_role(config, verbose, result), result)


def stopped_as_interrupted(run, result):
    """run(), or, for a stop signal that lands outside its own handling of one (while it
    reports a failure: found by make chaos, worker 1 timed out as the launcher stopped the
    cluster, and its `log.error` raised the KeyboardInterrupt with a traceback), the task
    interrupted: (result, 143 or 130), said in one line."""
    try:
        return run()
    except KeyboardInterrupt:
        logging.getLogger("sync_mnist").error("interrupted")
        result.error = "interrupted"
        return result, _interrupted()


def _load_tensorflow(verbose: bool) -> bool:
    """Imports TensorFlow in graph mode; False if stopped while it loads."""
    try:
        tfcompat.graph_mode(verbose)
        # Imported only now: they import TensorFlow, which must see the log settings first.
        from sync_mnist.task import ps, worker  # noqa: F401
    except KeyboardInterrupt:
        return False
    except ImportError as e:
        # A stop that lands in a C extension's initialisation comes back as "ImportError:
        # initialization failed", caused by the KeyboardInterrupt (seen in the chaos soak).
        if _interrupt_inside(e):
            return False
        raise
    return True


def _last_resort(config: TaskConfig):
    """See TaskTimeout: unwinding blocked after a timeout; this ends the task all the same."""
    from sync_mnist.task import report

    log = logging.getLogger("sync_mnist")

    def last_resort(message: str, missing: tuple[str, ...]) -> None:
        log.error("%s (exiting: closing the sessions blocked for %g s)", message,
                  config_lib.TaskTimeout.UNWIND_GRACE_SECS)
        _finish(config, report.TaskResult(role=config.role, index=config.index,
                                          mode=config.train.mode, error=message,
                                          missing=list(missing) or None),
                config_lib.EXIT_TIMEOUT)

    return last_resort


def _run_role(config: TaskConfig, verbose: bool, result):
    """(result, exit code) of this task's role; an error becomes its line and its code."""
    from sync_mnist.core.shard import DataError
    from sync_mnist.task import ps, report, worker

    log = logging.getLogger("sync_mnist")
    try:
        if config.train.setup == "question":
            from sync_mnist.specimen import question  # the specimen; nothing else imports it

            if config.role == "ps":
                question.run_question_ps(config)
            result = question.run_question_worker(config)
        elif config.role == "ps":
            result = ps.run_ps(config)
        else:
            result = worker.run_worker(config, failed=result)
        code = report.exit_code_for(result)
    except cluster_lib.Unreachable as e:  # a ps that may still come: retried, as a timeout
        options.usage_error(e)
        result.error, code = config_lib.first_line(e), config_lib.EXIT_TIMEOUT
    except (ValueError, DataError) as e:  # ConfigError, ClusterError, DataError
        options.usage_error(e)
        result.error, code = config_lib.first_line(e), config_lib.EXIT_USAGE
        if config.role == "worker" and config.train.setup == "fixed":
            from sync_mnist.core import protocol

            protocol.tell_the_ps_of_bad_input(config)
    except ps.TaskTimeout as e:
        log.error("%s", e)
        result.error, code = str(e), config_lib.EXIT_TIMEOUT
        result.missing = list(e.missing) or None
    except KeyboardInterrupt:
        log.error("interrupted")
        result.error, code = "interrupted", _interrupted()
    except Exception as e:  # a TensorFlow OpError or a bug: one line, then the exit code
        if _interrupt_inside(e):
            log.error("interrupted")
            result.error, code = "interrupted", _interrupted()
        else:
            log.error("failed: %s: %s", type(e).__name__, config_lib.first_line(e))
            if verbose:
                log.exception("traceback")
            result.error = f"{type(e).__name__}: {config_lib.first_line(e)}"
            code = (config_lib.EXIT_PEER_LOST if _peer_lost(e) else
                    config_lib.EXIT_TIMEOUT if _timed_out(e) else config_lib.EXIT_FAILED)
    return result, code


def _interrupted() -> int:
    """The code of a task stopped at once: 143 for SIGTERM or SIGUSR1, 130 for SIGINT."""
    return config_lib.EXIT_PREEMPTED if preemption.signalled() else config_lib.EXIT_INTERRUPTED


def _preempted_overdue(config: TaskConfig):
    """preemption.py's bound: the cluster did not stop in time; this ends the task all the
    same (143), before the SIGKILL that follows."""
    from sync_mnist.task import report

    def overdue(message: str) -> None:
        logging.getLogger("sync_mnist").error("%s", message)
        _finish(config, report.TaskResult(role=config.role, index=config.index,
                                          mode=config.train.mode, error=message),
                config_lib.EXIT_PREEMPTED)

    return overdue


def _finish(config: TaskConfig, result, code: int) -> int:
    """Writes the result record and ends the process with `code`; with no record (nothing was
    started), returns `code` instead."""
    if result is None:
        return code
    if threading.current_thread() is threading.main_thread():
        # The task's end is decided: a stop signal now (the launcher stopping the cluster
        # after a peer's failure) would cut the record short with a traceback.
        for signum in (signal.SIGINT, *preemption.SIGNALS):
            signal.signal(signum, signal.SIG_IGN)
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
    tfcompat.remove_autograph_files()  # what leaving skips of TensorFlow's own cleanup
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _interrupt_inside(error: BaseException) -> bool:
    """Whether `error` is a stop signal's KeyboardInterrupt that C code passed on as another
    error: pybind11 wraps it in a RuntimeError ("MISMATCH of original and normalized active
    exception types ... KeyboardInterrupt"); CPython, when it lands inside a builtin that C
    code called, raises "SystemError: <built-in function __import__> returned a result with
    an exception set", caused by it (.ci/run: a SIGTERM during the graph's build, its
    SystemError sent to sys.unraisablehook by TensorFlow's C++, lost, and the task ran on);
    an extension module's initialisation, "ImportError: initialization failed"."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt) or (
                isinstance(error, RuntimeError) and "KeyboardInterrupt" in str(error)):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _timed_out(error: Exception) -> bool:
    """A bounded call (RunOptions.timeout_in_ms) expired wherever it was: retried, as a timeout."""
    import tensorflow as tf  # already loaded: only a running task gets here

    return isinstance(error, tf.errors.DeadlineExceededError)


def _peer_lost(error: Exception) -> bool:
    """A ps or worker went away under a running call: a restarted task can rejoin, so retry.

    CancelledError too: TensorFlow cancels the rest of a step when a peer under it fails, and
    which partition's error the call raises varies. Replaying one chaos run (ps 0 of 2 frozen
    at the end, then restarted), ps 1's read of ps 0 failed with AbortedError in most replays
    and with CancelledError in one, which then failed the run (exit 1).
    """
    import tensorflow as tf  # already loaded: only a running task gets here

    return isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError,
                              tf.errors.CancelledError, config_lib.PeerLost))


def _raise_interrupt(signum, frame):
    if frame is not None and frame.f_code in (_interrupt_again.__code__,
                                              _deliver_again.__code__):
        _deliver_again()  # raised in the hook, it would be lost as the first one was
        return
    raise KeyboardInterrupt


def _interrupt_again(unraisable) -> None:
    """sys.unraisablehook: a stop whose KeyboardInterrupt landed in a destructor (a TensorFlow
    session's __del__ while the task unwinds, say) would be printed as "Exception ignored" and
    lost; it is delivered again instead, from another thread a moment later, so that it is
    raised once the destructor has returned. So is one that C code passed on as another error
    (_interrupt_inside). If that moment comes while this hook still runs
    (a loaded machine), _raise_interrupt sends it again rather than raise it here."""
    if _interrupt_inside(unraisable.exc_value):
        _deliver_again()
        return
    sys.__unraisablehook__(unraisable)


def _deliver_again() -> None:
    # Not threading.Timer: its start() waits for the thread, and the signal could come
    # inside that wait, in threading's frames, where _raise_interrupt cannot tell it is in
    # the hook.
    def later():
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # raises whatever the stop was (_interrupted)

    _thread.start_new_thread(later, ())


if __name__ == "__main__":
    sys.exit(main())
