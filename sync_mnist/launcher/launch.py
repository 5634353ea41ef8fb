"""The localhost cluster behind `make run-cluster`: P ps + N workers as child processes.

Each task is a real `python -m sync_mnist` process, exactly what a user runs on each host. The
launcher prefixes their output, stops every child when one fails or on Ctrl-C (children also
die with the launcher, through PR_SET_PDEATHSIG), and ends with a table built from the result
records the tasks wrote. Where Linux allows it, every task runs in one private network namespace
with loopback only (netns.py, --isolate), so no one else can reach the cluster's gRPC ports.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import logging
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import config as config_lib
from sync_mnist.core import tfcompat
from sync_mnist.models import params as model_params
from sync_mnist.models import registry
from sync_mnist.task import options, preflight, report
from sync_mnist.launcher import netns, progress
from sync_mnist.core.config import TrainConfig
from sync_mnist.core.shard import DataError

log = logging.getLogger(__name__)

KILL_GRACE_SECS = 5.0  # between SIGINT and SIGKILL when stopping the cluster
# glibc gives each thread that allocates its own malloc arena; TensorFlow's gRPC server starts
# about a hundred threads. One arena saves about 11 MB of peak memory per task (measured) for
# some lock contention that the tasks, two or three to a core here, do not notice. glibc reads
# it at start-up, so it must be in the environment the task is started with.
TASK_ENV = {"MALLOC_ARENA_MAX": "1"}
# How each task starts: `python -m sync_mnist`, what a user runs on each host (tests put a
# stand-in here).
TASK_COMMAND = [sys.executable, "-m", "sync_mnist"]
# Once a worker has ended by itself, every other task must end within 2 x --timeout (a
# non-chief's bound at the finish barrier; a question worker's last wait for a token) plus this
# much: the ps's grace beyond --timeout, a blocked unwinding's last resort, the evaluation.
EXIT_GRACE_SECS = 30.0
# Whatever the tasks do, the cluster must show a sign of life at least this often, plus
# 2 x --timeout + EXIT_GRACE_SECS: a task started or ended, or a worker's progress line. The
# start-up allowance covers a restarted task's start; past it, something waits without a bound.
STALL_ALLOWANCE_SECS = config_lib.START_SECS
QUESTION_READY_POLL_SECS = 30.0  # tf.compat.v1.train.Supervisor's default recovery_wait_secs
NO_RECORD = "wrote no result record"  # a task's error when it wrote none
_PR_SET_PDEATHSIG = 1
# Resolved here, in the launcher, before any fork: a library or symbol lookup (dlopen, dlsym)
# between fork and exec can deadlock on a lock that another thread of the launcher held.
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl


class _Task:
    # (how many processes had been started, unix time) when it first logged `ready after`
    first_ready: tuple[int, float] | None = None

    def __init__(self, role: str, index: int, argv: list[str], summary: Path,
                 namespace: netns.PrivateNamespace | None, output):
        self.role, self.index, self.summary = role, index, summary
        self._output = output  # where its lines go: see progress.Display
        self.tag = f"{role} {index}"
        self.stopped = False  # still running when the launcher stopped the cluster
        self.restarts = 0  # times --max-restarts restarted it
        self.restarted: float | None = None  # monotonic: when the policy last restarted it
        self.lost = False  # a worker that died while backups carried on without it
        self.spent = False  # a task that died once the chief had verified the run and ended
        self.overdue: str | None = None  # why the launcher stopped it past a bound of its own
        self.spared: str | None = None  # why a verified run did without it (spared_at_the_end)
        self.pids: list[int] = []  # every process started for it, the current one last
        self.waiting_for_chief = threading.Event()
        self.ready = False  # it logged `ready after`: it joined the training
        # A worker past the finish barrier and its done report: when (monotonic) it logged its
        # verdict.
        self.verdict_at: float | None = None
        # The workers it said its update waits for past --timeout (report.WAITING_FOR_
        # REPLACEMENT), for the policy to restart: appended by the reader thread.
        self.replacements: collections.deque[list[str]] = collections.deque()
        self._argv, self._namespace = argv, namespace
        self._spawn()

    def _spawn(self) -> None:
        namespace, launcher = self._namespace, os.getpid()
        self.exited_at: float | None = None  # unix time, for the summary
        self.ended: float | None = None  # monotonic, like the two below
        self.progressed: float | None = None  # its latest progress line
        self.waiting_for_chief.clear()
        self.ready = False
        # A record left by the process before must not pass for this one's.
        self.summary.unlink(missing_ok=True)
        self.spawned = time.monotonic()
        self.proc, self.reader = spawn(self._argv, {**TASK_ENV, **os.environ}, namespace,
                                       launcher, self._forward)
        self.pids.append(self.proc.pid)
        log.info("started %s (pid %d)", self.tag, self.proc.pid)

    def restart(self) -> None:
        """Starts the same command again, once the dead process's output has been forwarded."""
        self.reader.join(timeout=5)
        self.restarts += 1
        self.restarted = time.monotonic()
        self._spawn()

    def kill(self) -> None:
        """SIGKILLs its process group and waits (bounded) until the process is gone."""
        self.signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=KILL_GRACE_SECS)
        except subprocess.TimeoutExpired:  # stuck in the kernel; the restart goes ahead
            log.error("%s (pid %d) survived SIGKILL for %g s", self.tag, self.proc.pid,
                      KILL_GRACE_SECS)
        self.poll()

    def _forward(self, line: str) -> None:
        if report.WAITING_FOR_CHIEF in line:
            self.waiting_for_chief.set()
        if f"[{self.tag}] ready after " in line:
            self.ready = True
            if self.first_ready is None:
                self.first_ready = (len(self.pids), time.time())
        if f"[{self.tag}] verdict: " in line:
            self.verdict_at = time.monotonic()
        if names := report.replacements_wanted(line):
            self.replacements.append(names)
        line = line if f"[{self.tag}]" in line else f"[{self.tag}] {line}"
        if progress.parse(line):
            self.progressed = time.monotonic()
        self._output(line)

    def started_up(self) -> bool:
        """Whether it said it waits for the chief, or is ready: past its start-up."""
        return self.waiting_for_chief.is_set() or self.ready

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.exited_at is None:
            self.exited_at, self.ended = time.time(), time.monotonic()
        return code

    def last_sign_of_life(self) -> float:
        """When (monotonic) it last started, ended or printed a progress line."""
        return max(t for t in (self.spawned, self.ended, self.progressed) if t is not None)

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def result(self) -> report.TaskResult:
        try:
            fields = json.loads(self.summary.read_text())
        except (OSError, ValueError):
            fields = {"role": self.role, "index": self.index, "mode": "?", "error": NO_RECORD}
        result = report.TaskResult(**fields)
        result.exit_code = self.proc.returncode if self.proc.returncode is not None else -1
        result.restarts = self.restarts
        if self.first_ready and self.first_ready[0] < len(self.pids):  # an earlier life's
            result.first_ready_at = self.first_ready[1]
        if self.lost:
            result.error = (f"lost (exit {result.exit_code}); the backup workers finished "
                            "without it")
        if self.spent:
            result.error = (f"exited with code {result.exit_code} after a worker had verified "
                            "the run and ended; not restarted")
        if self.stopped:
            result.blocked = True
            result.error = "still running at the end; stopped by the launcher"
        if self.spared:  # not blocked: the verified run did without it
            result.blocked, result.error, result.spared = False, None, self.spared
        if self.overdue:
            result.blocked, result.error = True, self.overdue
        return result


def spawn(argv: list[str], env: dict, entry, launcher: int, on_line
          ) -> tuple[subprocess.Popen, threading.Thread]:
    """Starts a child (the launcher's tasks, the bench's) and the thread that reads its output.

    The child has a process group of its own, so stopping it stops its children, and dies with
    `launcher` (child_setup, which also enters `entry`, a namespace or None). Each line of its
    stdout and stderr, without its newline, goes to on_line(line) as it comes.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                            preexec_fn=lambda: child_setup(entry, launcher), text=True,
                            bufsize=1)

    def read() -> None:
        for line in proc.stdout:
            on_line(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, reader


def child_setup(namespace: netns.PrivateNamespace | None, launcher: int) -> None:
    """Between fork and exec of a task: join the namespace, then die with the launcher.

    Runs in the child of a threaded parent, so it calls only what was resolved before the
    fork. `launcher` is the launcher's pid, taken before the fork.
    """
    if namespace is not None:
        namespace.enter()  # first: joining a user namespace would clear the death signal
    # Children get SIGKILL if the launcher dies, even by SIGKILL: no orphans, ever.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:
        # The launcher died before the death signal was set, so it will never come: go now.
        os._exit(config_lib.EXIT_INTERRUPTED)


def choose_hosts(num_ps: int, num_workers: int, base_port: int):
    """The default consecutive ports when they are all free, else ports the kernel picks."""
    if base_port:
        ps_hosts, worker_hosts = cluster_lib.default_hosts(num_ps, num_workers, base_port)
        try:
            for address in ps_hosts + worker_hosts:
                cluster_lib.check_port_free(address, "launcher")
            return ps_hosts, worker_hosts
        except cluster_lib.ClusterError as e:
            log.info("%s; choosing free ports instead", e)
    ports = cluster_lib.free_ports(num_ps + num_workers)
    addresses = tuple(f"localhost:{p}" for p in ports)
    return addresses[:num_ps], addresses[num_ps:]


def run_cluster(*, num_ps: int, num_workers: int, base_port: int, train: TrainConfig,
                task_args: list[str], summary_json: Path | None = None,
                verbose: bool = False, isolate: str = "auto", max_restarts: int = 0,
                network=None) -> int:
    """Runs the cluster to the end; returns the launcher's exit code (see config.EXIT_*).

    `network`, for experiments (testbed.py), replaces --isolate: each task starts in a network
    namespace of its own. It gives `hosts(num_ps, num_workers)` -> (ps_hosts, worker_hosts)
    and `entry(role, index)`, which each task's child enters between fork and exec.
    """
    started = time.time()
    try:
        # A param the model has not, or a missing or damaged data file, is the user's to fix:
        # say so once, before any task starts, rather than once per task.
        check_model(train, verbose)
        if summary_json:  # and the cluster's record, which is written only at the end
            preflight.check_output_file(Path(summary_json), "--summary-json")
    except (DataError, config_lib.ConfigError) as e:
        return options.usage_error(e)
    except KeyboardInterrupt:  # Ctrl-C while the model (and TensorFlow) loads: no task yet
        log.error("interrupted")
        return config_lib.EXIT_INTERRUPTED
    try:
        # None: --isolate off, or auto where impossible, or a network of namespaces
        namespace = netns.for_cluster("off" if network else isolate)
    except netns.Unavailable as e:
        print(f"error: --isolate on: no private network namespace: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    if network:
        ps_hosts, worker_hosts = network.hosts(num_ps, num_workers)
    elif namespace:
        # The namespace is new and empty: every port is free, and no one else can take one.
        ps_hosts, worker_hosts = cluster_lib.default_hosts(
            num_ps, num_workers, base_port or cluster_lib.DEFAULT_BASE_PORT)
    else:
        ps_hosts, worker_hosts = choose_hosts(num_ps, num_workers, base_port)
    log.info("cluster: ps %s, workers %s; model %s; mode %s", ",".join(ps_hosts),
             ",".join(worker_hosts), train.model, train.mode)
    display = progress.open_display(verbose=verbose, mode=train.mode, num_workers=num_workers)
    tasks: list[_Task] = []
    with tempfile.TemporaryDirectory(prefix="sync-mnist-") as tmp:
        def start(role: str, index: int) -> _Task:
            summary = Path(tmp) / f"{role}-{index}.json"
            argv = [*TASK_COMMAND, "--role", role,
                    "--index", str(index), "--ps-hosts", ",".join(ps_hosts),
                    "--worker-hosts", ",".join(worker_hosts), *task_args,
                    # Sync: the others wait for the tasks the launcher restarts.
                    *(["--restart-grace", f"{config_lib.START_SECS:g}"]
                      if max_restarts else []),
                    "--summary-json", str(summary)]
            entry = network.entry(role, index) if network else namespace
            tasks.append(_Task(role, index, argv, summary, entry, display.task_line))
            return tasks[-1]

        failed, interrupted = _run_tasks(start, tasks, num_ps=num_ps, num_workers=num_workers,
                                         train=train, max_restarts=max_restarts,
                                         display=display, namespace=namespace)
        results = [t.result() for t in tasks]
    return _report(tasks, results, time.time() - started, train, failed=failed,
                   interrupted=interrupted, summary_json=summary_json, display=display)


def check_model(train: TrainConfig, verbose: bool) -> None:
    """The model's params, typed as every task will type them, and the model's own check of
    them (api.Model.check: its data, say), in a process of its own: loading the model loads
    TensorFlow, which its module imports, and the launcher would hold it (about 550 MB) for
    the whole run. Bounded by the start-up a task is allowed.

    Raises:
      ConfigError: a param the model has not, or a value its type cannot read; the model
        cannot be loaded; its check raised another error than ConfigError or DataError (with
        the user's traceback in `details`); the check took longer than the bound.
      DataError: the check found the data missing or malformed.
      KeyboardInterrupt: a stop while it ran (the process is stopped too).
    """
    context = multiprocessing.get_context("fork")  # the launcher has not loaded TensorFlow
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_check_model_here, args=(train, verbose, writer),
                            name="check-model", daemon=True)
    child.start()
    writer.close()
    bound = config_lib.START_SECS + train.timeout
    try:
        if not reader.poll(bound):
            raise config_lib.ConfigError(f"--model {train.model}: loading it and checking its "
                                         f"params took longer than {bound:g} s (the start-up "
                                         "a task is allowed)")
        refusal = reader.recv()
    except EOFError:
        refusal = ("ConfigError", f"--model {train.model}: the process that loads and checks "
                   "it ended without an answer", None)
    finally:
        if child.is_alive():
            child.kill()
        child.join(config_lib.START_SECS)
    if refusal is not None:
        kind, message, details = refusal
        if kind == "KeyboardInterrupt":
            raise KeyboardInterrupt
        error = DataError(message) if kind == "DataError" else config_lib.ConfigError(message)
        error.details = details  # the user's traceback, if any (options.usage_error)
        raise error


def _check_model_here(train: TrainConfig, verbose: bool, writer) -> None:
    """check_model's process: sends None (the model and its params pass), or the refusal as
    (DataError or ConfigError, its line, the user's traceback or None)."""
    try:
        tfcompat.graph_mode(verbose)  # before TensorFlow, which loading the model loads
        model = registry.resolve(train.model)
        params = model_params.of(model, train)
        if model.check is not None:
            registry.call(f"--model {train.model}'s check", model.check, dict(params))
        writer.send(None)
    except (DataError, config_lib.ConfigError) as e:
        writer.send(("DataError" if isinstance(e, DataError) else "ConfigError", str(e),
                     getattr(e, "details", None)))
    except KeyboardInterrupt:  # a stop (the launcher's too, as a rule: the same group)
        with contextlib.suppress(OSError):  # the launcher may have stopped listening
            writer.send(("KeyboardInterrupt", "", None))


def _run_tasks(start, tasks: list[_Task], *, num_ps: int, num_workers: int, train: TrainConfig,
               max_restarts: int, display, namespace) -> tuple[_Task | None, int]:
    """Starts the tasks (`start(role, index)`) and waits for their end; stops every one left.

    Returns the task whose failure ended the run (or None), and the code of a stop the launcher
    was sent that ended the run at once (0: none; 130: SIGINT; 143: SIGTERM or SIGUSR1 before
    the chief started).
    """
    interrupted = 0
    preempted: list[float] = []  # when the launcher was sent SIGTERM or SIGUSR1 (monotonic)
    previous = _catch_signals(tasks, preempted)
    try:
        for index in range(num_ps):
            start("ps", index)
        # Sync: with backups (R < N) the others can finish without a lost worker.
        spare = num_workers - train.aggregate(num_workers) \
            if train.setup == "fixed" and train.mode == "sync" else 0
        policy = _Policy(tasks, max_restarts=max_restarts, spare_workers=spare,
                         timeout=train.timeout)
        # The chief starts last, once every other worker waits for it: the start order in
        # which the question's 30 s readiness poll bites, and the same for both setups.
        others = [start("worker", index) for index in range(1, num_workers)]
        failed = _wait_until_waiting(tasks, others, config_lib.START_SECS + train.timeout,
                                     policy)
        if failed is None:
            start("worker", 0)
            # The question's workers may still be waiting out Supervisor's 30 s readiness
            # poll when its chief, training alone, has ended.
            end_bound = 2 * train.timeout + EXIT_GRACE_SECS + (
                QUESTION_READY_POLL_SECS if train.setup == "question" else 0.0)
            failed = _wait(tasks, policy, ps_serve_forever=train.setup == "question",
                           end_bound=end_bound,
                           stall_bound=STALL_ALLOWANCE_SECS + end_bound,
                           preempted=preempted,
                           preempt_bound=train.preempt_grace + KILL_GRACE_SECS)
    except KeyboardInterrupt:
        interrupted, failed = (config_lib.EXIT_PREEMPTED if preempted
                               else config_lib.EXIT_INTERRUPTED), None
        log.error("interrupted; stopping every task")
    finally:
        _stop(tasks)
        display.close()
        if namespace:
            namespace.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return failed, interrupted


def _catch_signals(tasks: list[_Task], preempted: list[float]) -> dict:
    """Installs the launcher's handlers: SIGINT raises KeyboardInterrupt; SIGTERM and SIGUSR1
    preempt (their first: its time goes into `preempted`). Returns the handlers they replace.
    """
    def preempt(signum, frame):
        # Sync: passed on to every task, which stop together on one update (preemption.py).
        # Before the chief has started nothing has trained: stop at once.
        if not preempted and not any(t.role == "worker" and t.index == 0 for t in tasks):
            preempted.append(time.monotonic())
            raise KeyboardInterrupt
        if not preempted:
            preempted.append(time.monotonic())
            for t in tasks:
                if t.poll() is None:
                    t.signal_group(signal.SIGTERM)

    return {signal.SIGINT: signal.signal(signal.SIGINT, _raise_interrupt),
            **{s: signal.signal(s, preempt) for s in (signal.SIGTERM, signal.SIGUSR1)}}


def _report(tasks: list[_Task], results: list[report.TaskResult], wall: float,
            train: TrainConfig, *, failed: _Task | None, interrupted: int,
            summary_json: Path | None, display) -> int:
    """Writes --summary-json and shows the table and the closing lines; returns the code."""
    summary = report.cluster_summary(results, tasks, wall)
    code = _exit_code(tasks, results, summary, train, failed=failed, interrupted=interrupted)
    if summary_json:  # first: the screen's reader may be slow (a pager), or gone
        path = Path(summary_json)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**summary, "exit_code": code}, indent=2) + "\n")
        except OSError as e:  # checked at the start; something changed since
            print(f"error: could not write --summary-json {path}: {e.strerror or e}",
                  file=sys.stderr)
            code = code or config_lib.EXIT_FAILED
    display.show(report.format_table(results))
    display.show(report.closing_lines(summary))
    if code == config_lib.EXIT_USAGE:  # a task rejected its input: name it and its reason
        failed = _first_to_reject(failed, tasks, results)
        print(f"error: {failed.tag}: {_usage_reason(failed, results)}", file=sys.stderr)
    # The last line: `make run-cluster` turns every failure into make's own code 2.
    display.show(f"exit code {code} ({config_lib.EXIT_MEANINGS[code]})")
    return code


def _exit_code(tasks: list[_Task], results: list[report.TaskResult], summary: dict,
               train: TrainConfig, *, failed: _Task | None, interrupted: int) -> int:
    if interrupted:
        return interrupted
    if failed is not None and failed.proc.returncode in (config_lib.EXIT_USAGE,
                                                         config_lib.EXIT_PREEMPTED):
        # Bad input to a task is bad input to the cluster; a task preempted before the
        # chief started stopped it.
        return failed.proc.returncode
    if any(t.overdue for t in tasks):  # a bound of the launcher's own expired
        return config_lib.EXIT_TIMEOUT
    # The failures are the codes of the tasks that ended by themselves: not those the launcher
    # stopped (once it gave up, or the question's ps, which never exits by itself), nor a
    # lost backup.
    failures = [r.exit_code for t, r in zip(tasks, results)
                if not t.stopped and not t.lost and not t.spent
                and r.exit_code not in _ENDS]
    if failed is not None and failed.proc.returncode in _VERIFIED_OR_NOT:
        failures.append(config_lib.EXIT_FAILED)  # it ended before the chief even started
    if failures:
        # Sync: when every failure was a bounded wait (a peer missing, dead or stuck), so is
        # the cluster's, and like a task's it asks for a retry.
        return config_lib.EXIT_TIMEOUT if all(c == config_lib.EXIT_TIMEOUT for c in failures) \
            else config_lib.EXIT_FAILED
    if train.mode == "sync" and not summary["synchronous"]:
        return config_lib.EXIT_NOT_SYNCHRONOUS
    if summary["data_covered"] is False:
        return config_lib.EXIT_DATA_NOT_COVERED
    if any(r.exit_code == config_lib.EXIT_PREEMPTED for r in results):
        return config_lib.EXIT_PREEMPTED  # the whole cluster stopped on one update
    return config_lib.EXIT_OK


def _first_to_reject(failed: _Task, tasks: list[_Task],
                     results: list[report.TaskResult]) -> _Task:
    """The task whose bad input ended the run: a ps that exits 2 because a worker told it of
    its bad input (protocol.tell_the_ps_of_bad_input) may end before that worker."""
    if failed.role != "ps":
        return failed
    return next((t for t, r in zip(tasks, results) if t.role == "worker"
                 and r.exit_code == config_lib.EXIT_USAGE), failed)


def _usage_reason(task: _Task, results: list[report.TaskResult]) -> str:
    """What a task that exited 2 said was wrong: the error in its result record."""
    error = next(r.error for r in results if (r.role, r.index) == (task.role, task.index))
    if error in (None, NO_RECORD):
        return f"bad input ({error or 'no error in its record'}; its lines above say why)"
    return error


# A task's exits that end its part of the run: verified, not synchronous, or preempted (the
# cluster stopped on one update, which every task does alike).
_VERIFIED_OR_NOT = (config_lib.EXIT_OK, config_lib.EXIT_NOT_SYNCHRONOUS,
                    config_lib.EXIT_DATA_NOT_COVERED)  # a task that read its verdicts
_ENDS = (*_VERIFIED_OR_NOT, config_lib.EXIT_PREEMPTED)
# Exits that a restart cannot mend: bad input, and a run that ended.
_FINAL_EXITS = (config_lib.EXIT_USAGE, *_ENDS)


class _Policy:
    """What the launcher does when a task exits, or says its update waits for other workers
    (replace): restart it or them, let it go, or stop the cluster.

    `max_restarts` counts faults: a task that dies (a signal, a crash) or freezes is started
    again with the same command while fewer than `max_restarts` faults have been mended,
    whether it failed while the cluster started or later. A task that timed out (exit 200)
    and names peers as missing (its record's `missing`, TaskResult.missing; never its
    message) has those peers restarted first, killed first if they still run: frozen (SIGSTOP)
    or stuck, they have not answered for a whole --timeout (unless still starting: see
    _culprits). The peers that timed out waiting for a task restarted after they started are
    restarted too, at no charge (the fault was that task's, paid for once), as is one whose
    timeout names no one after a ps restarted since it started (the new one answered). So
    are the tasks that lost a ps restarted after they started (exit 201): a training step
    recovers from a lost ps by itself, but the finish (its barrier, the counters, the
    evaluation) fails on it. Failing a restart, a worker other than the chief may be left dead
    while `spare_workers` allow (backups, R < N). A task that fails once the run is verified
    is let go (_let_go); one that fails after its own done report stops the cluster.
    """

    def __init__(self, tasks: list[_Task], *, max_restarts: int, spare_workers: int,
                 timeout: float):
        self._tasks, self._max, self._spare = tasks, max_restarts, spare_workers
        self._timeout, self._made = timeout, 0

    def after_exit(self, task: _Task, code: int, when: str = "") -> bool:
        """Handles `task`'s exit with `code` (`when`: a phrase for the log, such as " before
        the chief started"); False when the cluster must be stopped."""
        exited = f"{task.tag} exited with code {code}{when}"
        if _chief_ended_ok(self._tasks) or (task.role == "worker" and task.index != 0
                                            and _verdict_read(self._tasks)):
            self._let_go(task, exited)
            return True
        if code in _FINAL_EXITS:
            log.error("%s; stopping the cluster", exited)
            return False
        if task.result().done_reported:
            # The ps counted its done report and may have ended: a replacement would wait for
            # a ps that is gone (found by make chaos: the chief's SavedModel failed on a full
            # disk, exit 1, after its report).
            log.error("%s after its done report, which a restart cannot undo; stopping the "
                      "cluster", exited)
            return False
        if self._restarted_with_its_fault(task, code, exited) or self._restart(task, exited):
            return True
        if _spare_left(self._tasks, task, self._spare):
            task.lost = True
            log.warning("%s; the backup workers carry on without it", exited)
            return True
        log.error("%s; stopping the cluster", exited)
        return False

    def spared_at_the_end(self, live: list[_Task]) -> list[_Task]:
        """Of `live`, the tasks still running that a verified run did without: see
        _spared_at_the_end."""
        return _spared_at_the_end(self._tasks, live, self._spare)

    def _let_go(self, task: _Task, exited: str) -> None:
        """`task` failed once the run was verified: marked lost or spent, not restarted.

        Sync: a chief that ended 0 had passed the finish barrier, verified the final counters
        and written its model. A restarted task could not rejoin a finished run: a ps would
        come back empty and wait for done reports its predecessor already had, a worker (say,
        a backup the chief declared lost) would wait for updates that never come. The others
        finish without it, or fail on their own, and the run's code is theirs.
        """
        if _spare_left(self._tasks, task, self._spare):
            task.lost = True
            log.warning("%s; the backup workers carry on without it", exited)
        else:
            task.spent = True
            log.warning("%s after %s had verified the run and ended: not restarted; "
                        "the workers' results decide the run", exited,
                        "the chief" if _chief_ended_ok(self._tasks) else "a worker")

    def _restarted_with_its_fault(self, task: _Task, code: int, exited: str) -> bool:
        """Restarts the peers a timeout names as missing (charged); then `task`, at no charge,
        if it waited for (200), or lost (201), a peer restarted since it started. True when
        `task` was restarted so."""
        if code == config_lib.EXIT_TIMEOUT:
            for culprit in self._culprits(task):
                if not self._restart(culprit, f"{exited} naming {culprit.tag} as missing; "
                                              f"{culprit.tag}"):
                    break
            # Sync: it waited for a peer restarted since: part of that one fault
            mended, how = self._mended(task), "waiting for"
        elif code == config_lib.EXIT_PEER_LOST:
            # Sync: it lost that ps, outside a training step's recovery
            mended, how = self._ps_restarted_since(task), "after losing"
        else:
            return False
        if mended is None:
            return False
        self._restart(task, f"{exited} {how} {mended.tag}, restarted for that fault",
                      charged=False)
        return True

    def replace(self, waiter: _Task, names: list[str]) -> None:
        """Restarts (charged) the workers `names` that `waiter` said its update waits for past
        --timeout (report.WAITING_FOR_REPLACEMENT), not `waiter`, which waits for them. One
        still starting (another waiter named it first) is spared (_culprits)."""
        for culprit in self._culprits(waiter, names):
            if not self._restart(culprit, f"{waiter.tag} waited --timeout for an update that "
                                          f"waits for {culprit.tag}; {culprit.tag}"):
                return log.warning("%s waits for %s, and no restart is left (--max-restarts "
                                   "%d)", waiter.tag, culprit.tag, self._max)

    def _mended(self, task: _Task) -> _Task | None:
        """The peer that `task`'s timeout names as missing which the policy restarted after
        `task`'s process started, if any; if it names none, a ps restarted since."""
        named = _missing(task)
        if not named:  # Sync: its timeout looked after the ps it waited for was restarted
            return self._ps_restarted_since(task)  # (make chaos-short: ps 0 frozen, run 22)
        return next((t for t in self._tasks if t.tag in named and t is not task
                     and t.restarted is not None and t.restarted > task.spawned), None)

    def _ps_restarted_since(self, task: _Task) -> _Task | None:
        """A ps that the policy restarted after `task`'s process started, if any."""
        return next((t for t in self._tasks if t.role == "ps" and t.restarted is not None
                     and t.restarted > task.spawned), None)

    def _culprits(self, task: _Task, named: list[str] | None = None) -> list[_Task]:
        """The live tasks that `task`'s timeout names as missing (or `named`).

        A process still starting is spared, as its peers' waits are meant to spare it: one
        started after the cluster's latest progress line, within its start-up allowance
        (START_SECS + --timeout), that has not yet said it waits for the chief or is ready, is
        a replacement on its way, not the one that was waited for.
        """
        named = _missing(task) if named is None else named
        progressed = max((t.progressed for t in self._tasks if t.progressed), default=0.0)
        now = time.monotonic()
        return [t for t in self._tasks if t.tag in named and t is not task and not t.lost
                and t.poll() is None and (t.spawned < progressed or t.started_up()
                                          or now - t.spawned
                                          > config_lib.START_SECS + self._timeout)]

    def _restart(self, task: _Task, what: str, charged: bool = True) -> bool:
        if charged:
            if self._made >= self._max:
                return False
            self._made += 1
        count = f"fault {self._made} of {self._max}" + ("" if charged else ", no new fault")
        if task.poll() is None:
            log.warning("%s is still running: killing it and restarting it (%s)", what, count)
            task.kill()
        else:
            log.warning("%s; restarting it (%s)", what, count)
        task.restart()
        return True


def _missing(task: _Task) -> list[str]:
    """The peers ("worker N", "ps N") that `task`'s bounded wait, expired, was for: its
    record's structured field, filled from TaskTimeout.missing; never read from its message,
    which may be worded any way."""
    return task.result().missing or []


def _chief_ended_ok(tasks: list[_Task]) -> bool:
    return any(t.role == "worker" and t.index == 0 and t.poll() == config_lib.EXIT_OK
               for t in tasks)


def _verdict_read(tasks: list[_Task]) -> bool:
    """Whether a worker has read its verdict, past the finish barrier: it logged it, or ended
    with it."""
    return any(t.role == "worker" and (t.verdict_at is not None or t.poll() in _VERIFIED_OR_NOT)
               for t in tasks)


def _spare_left(tasks: list[_Task], task: _Task, spare: int) -> bool:
    """Whether `task` is a worker other than the chief that the backups (`spare` of them) can
    do without."""
    return task.role == "worker" and task.index != 0 and sum(t.lost for t in tasks) < spare


def _spared_at_the_end(tasks: list[_Task], live: list[_Task], spare: int) -> list[_Task]:
    """Of the tasks still running at the end (`live`), those a verified run did without: asked
    past the end bound, and (_wait) as soon as only ps and never-joined replacements run.

    Once the chief has ended 0: a backup (R < N) restarted after the chief declared its
    predecessor lost waits for a run that is over; so does a worker restarted that never
    joined (it lost a ps in its finish, and waits to be initialised by the chief); and a ps
    left with no worker running waits for done reports that no one is left to send (a
    worker gave up its report, or died, after the verdict, or reported to the ps this one
    replaced: it logged its verdict, or ended, before this one started). Its own bound
    allows for restarts that will not come. A ps that every worker reported done to is
    stuck, and stays overdue.
    """
    if not _chief_ended_ok(tasks):
        return []
    spared = []
    for t in live:
        if _spare_left(tasks, t, spare):
            t.lost = True  # counted by _spare_left for the next one
            spared.append(t)
        elif _never_joined(t):
            t.spent = True  # a replacement that waits for a chief who is gone: no judge
            spared.append(t)
    workers = [t for t in tasks if t.role == "worker"]
    if not all(t.role == "ps" for t in live if t not in spared):
        return spared
    unreported = any(t.spent or t.lost or t in spared or t.result().done_reported is False
                     for t in workers)
    for ps in (t for t in live if t.role == "ps"):
        if unreported or any(_done(w) < ps.spawned for w in workers):
            spared.append(ps)
    return spared


def _done(worker: _Task) -> float:
    """When (monotonic) `worker` was done with the ps: it logged its verdict, which it does
    after its done report, or it ended; infinity while neither."""
    for when in (worker.verdict_at, worker.ended):
        if when is not None:
            return when
    return math.inf


def _wait_until_waiting(tasks: list[_Task], others: list[_Task], timeout: float,
                        policy: _Policy) -> _Task | None:
    """Waits until each of `others` has logged that it waits for the chief (bounded: `timeout`
    from its latest start). A task that ends meanwhile goes to `policy`."""
    for task in others:
        while not task.lost and not task.waiting_for_chief.wait(0.1):
            for t in tasks:
                code = t.poll()
                if code is not None and not t.lost \
                        and not policy.after_exit(t, code, " before the chief started"):
                    return t
            if task.poll() is None and time.monotonic() > task.spawned + timeout:
                task.overdue = f"did not start waiting for the chief within {timeout:g} s"
                log.error("%s %s; stopping the cluster", task.tag, task.overdue)
                return task
    return None


def _wait(tasks: list[_Task], policy: _Policy, *, ps_serve_forever: bool,
          end_bound: float = float("inf"), stall_bound: float = float("inf"),
          preempted: list[float] = (), preempt_bound: float = float("inf")) -> _Task | None:
    """Waits for every task; on a failure that `policy` cannot mend, returns that task (the
    caller stops the rest).

    Each task bounds its own waits with --timeout, so this loop ends; should a task hang all
    the same, the loop ends `end_bound` seconds after the first worker ended by itself, or
    `stall_bound` seconds after the cluster's last sign of life (a task started or ended, a
    worker's progress line) while no worker has ended, or `preempt_bound` seconds after the
    launcher passed on a preemption (`preempted`: when), marking what still runs overdue. With
    ps_serve_forever (the question's server.join()), it ends when every worker has.
    """
    first_end: list[tuple[float, _Task]] = []  # when, and which worker, ended by itself
    while True:
        failed, running = _exits(tasks, policy, ps_serve_forever, first_end)
        if failed is not None:
            return failed
        if not running:
            return None
        live = [t for t in tasks if t.poll() is None
                and not (ps_serve_forever and t.role == "ps")]
        if not live:  # only a lost backup ended just now: the next round sees the rest
            time.sleep(0.1)
            continue
        if all(t.role == "ps" or _never_joined(t) for t in live):
            # After a verified run, a ps left waiting for done reports that no worker is left
            # to send, or a replacement waiting for a chief who is gone: no bound to wait out
            # (a chaos run took 82 s to end verified). spared_at_the_end marks the workers it
            # spares; here it spares every one (each never joined), so marks nothing else.
            spared = policy.spared_at_the_end(live)
            if spared and len(spared) == len(live):
                _mark_spared(spared, "still running after every worker that joined the run ended")
                return None
        why = _past_a_bound(tasks, first_end, preempted, end_bound=end_bound,
                            stall_bound=stall_bound, preempt_bound=preempt_bound)
        if why is None:
            time.sleep(0.1)
            continue
        return _overdue(policy, live, why)


def _exits(tasks: list[_Task], policy: _Policy, ps_serve_forever: bool,
           first_end: list[tuple[float, _Task]]) -> tuple[_Task | None, bool]:
    """One look at every task for _wait: the task whose exit `policy` cannot mend (or None),
    and whether a task it waits for still runs. The first worker seen ended by itself goes
    into `first_end`, with when."""
    running = False
    for task in tasks:
        while task.replacements:
            policy.replace(task, task.replacements.popleft())
    for task in tasks:
        code = task.poll()
        if code is None:
            running = running or not (ps_serve_forever and task.role == "ps")
        elif code == config_lib.EXIT_PREEMPTED and task.result().preempted_at is None:
            # Sync: stopped at once, before it trained: there was no update to stop on,
            # and the others cannot go on without it.
            log.error("%s exited with code %d before it trained (preempted); stopping the "
                      "cluster", task.tag, code)
            return task, running
        elif code in _ENDS:
            if not first_end and task.role == "worker":
                first_end.append((time.monotonic(), task))
        elif not task.lost and not task.spent:
            if not policy.after_exit(task, code):
                return task, running
            running = True
    return None, running


def _past_a_bound(tasks: list[_Task], first_end: list[tuple[float, _Task]],
                  preempted: list[float], *, end_bound: float, stall_bound: float,
                  preempt_bound: float) -> str | None:
    """Once one of _wait's bounds has passed, why the tasks still running are overdue;
    None before."""
    now = time.monotonic()
    if preempted and now - preempted[0] > preempt_bound:
        return f"still running {preempt_bound:g} s after the preemption was passed on"
    if first_end and now - first_end[0][0] > end_bound:
        return f"still running {end_bound:g} s after {first_end[0][1].tag} ended"
    if not first_end and now - max(t.last_sign_of_life() for t in tasks) > stall_bound:
        return (f"still running after {stall_bound:g} s in which no task started or ended "
                "and no worker logged progress")
    return None


def _overdue(policy: _Policy, live: list[_Task], why: str) -> _Task | None:
    """Past a bound (`why`): the tasks of `live` that a verified run did without are spared,
    the others marked overdue; returns the first overdue one, or None."""
    spared = policy.spared_at_the_end(live)
    _mark_spared(spared, why)
    live = [t for t in live if t not in spared]
    if not live:
        return None
    for t in live:
        t.overdue = f"{why}; stopped by the launcher"
    log.error("%s %s; stopping the cluster", ", ".join(t.tag for t in live), why)
    return live[0]


def _never_joined(task: _Task) -> bool:
    """A worker restarted that has not joined the run (not ready): after a verified run, it
    waits for a chief who is gone."""
    return task.role == "worker" and bool(task.restarts) and not task.ready


def _mark_spared(spared: list[_Task], why: str) -> None:
    """Marks and logs each of `spared` (from _Policy.spared_at_the_end), which still runs `why`."""
    for t in spared:
        t.spared = ("no worker is left to report done to it" if t.role == "ps"
                    else "a backup the run did without" if t.lost
                    else "a replacement that never joined the run")
        log.warning("%s %s, after the chief had verified the run and ended: %s; stopping it",
                    t.tag, why, t.spared)


def _stop(tasks: list[_Task]) -> None:
    """SIGINT every live task's process group, then SIGKILL what is left after a grace period.

    Not SIGTERM, which a task takes for a preemption, to stop on an update agreed with the
    others (preemption.py): these stop at once, and exit 130."""
    live = [t for t in tasks if t.poll() is None]
    for t in live:
        t.stopped = True
        t.signal_group(signal.SIGINT)
    deadline = time.monotonic() + KILL_GRACE_SECS
    for t in live:
        try:
            t.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            t.kill()
        t.poll()
    for t in tasks:
        t.reader.join(timeout=5)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
