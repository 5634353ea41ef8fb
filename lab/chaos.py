"""The chaos soak: the localhost cluster many times, each run with one fault at a random moment.

    python -m lab.chaos [--minutes 15] [--runs N] [--seed S] [--quick | --short]
                        [--skip KIND[,KIND]] [--timeout 20] [--json chaos-results/chaos.json]
    make chaos [ARGS=...]
    make chaos-short [ARGS=...]      (python -m lab.chaos --short; .ci/run runs it)

Each run starts `sync-mnist-cluster` (1 or 2 ps, 3 workers, R = N or R = N - 1, with or without
--max-restarts; synthetic data, a few steps, a --logdir saved every 10 updates) and gives one
task, picked at random (a ps, the chief or another worker), one fault at a random moment of the
start-up, the training or the end of the run:
  kill             SIGKILL
  stop-short/long  SIGSTOP, then SIGCONT after less or more than --timeout
  term             SIGTERM (a preemption)
  partition-short/long
                   every packet the task sends, and every one sent to its port, dropped for
                   less or more than --timeout (loopback_faults.py: in the launcher's
                   namespace, by the task's net_cls class and port). The fault is the
                   process's, as a stop is: a replacement the launcher starts is not cut off
  loss             5 % of those packets dropped, for longer than --timeout
  delay            each of those packets held 200 ms, for longer than --timeout
  disk-full        the run's --logdir (a 64 MB tmpfs) filled to its last block for less than
                   --timeout, then freed (the victim is the chief, which writes there)
The network faults need root, nftables and iptables; the full disk, root. A kind this machine
cannot make is an error (exit 2, naming it and why) unless --skip names it: nothing is left
out silently. The summary lists the kinds skipped.
A run that ends preempted (143) is run again with the same --logdir, with no fault: it must
resume and end verified, its contributions the whole plan. The victim is found by the pid the
launcher logs when it starts a task (`started worker 1 (pid N)`), and checked to be a child of
that launcher before each signal: the soak signals nothing else. What is left when the
launcher has ended is killed by process group.

Each run is classified against the README, from the launcher's exit code, its --summary-json
and its output:
  verified      exit 0, verified synchronous, the counters showing it
  restarted     the same, after the launcher restarted a task (--max-restarts)
  preempted     exit 143 (SIGTERM), and the rerun with the same --logdir resumed and ended
                verified with the contributions of the whole plan
  failed-named  a documented failure code (1, 200; 2 for no room for the first checkpoint),
                and a warning or error line names the victim
  defect        any of: hang (the launcher outlived every bound it has), overdue (a task missed
                its own bounds and the launcher's stopped it), leftover (a process of the run
                outlived its launcher), unexpected-code, traceback, contradiction (a verdict
                against the counters or the exit code, e.g. a verified run reported failed),
                verified-but-failed (a worker verified the run from the final counters, yet
                it ended as a failure), repeat (an update averaged two gradients of one
                worker, R = N), not-resumed (a preempted run's rerun did not end verified
                with the whole plan's contributions), restart-failed (a run with a restart
                allowed ended as a failure; not a full disk's documented exit 2 at the
                first checkpoint or exit 1 at the export), unnamed (a failure whose messages do not name the victim),
                survivable-failed (a stop or partition shorter than --timeout, the loss, the
                delay or a full disk failed the run, other than those exits), no-fault-failed
                (the fault never landed, and the run failed all the same)
A fault that lands after its victim has ended is "missed"; the run is classified all the same.

--short (make chaos-short, in CI) draws each fault kind once, in turn, its configuration,
victim and moment (in the start-up or the training) from a fixed seed (SHORT_SEED); then replays the end-of-run faults that full
runs drew rarely and that failed only under load (replay_plans: a ps frozen, a worker frozen,
the ps killed as the cluster finishes, each with a restart allowed), each beside fault-free
runs of a second cluster, one after another until it ends (run_beside). Every run, the load's
too, is classified as above.

It prints one line per run, then the outcomes by (victim, fault) and by phase, and writes every
run, with its plan and what was seen, to --json, and each run's output beside it
(chaos-run-N.log). Exit codes: 0 no defect, or only known ones (KNOWN_DEFECTS); 1 some other
defect; 2 bad arguments (a --skip name that is not a kind; a kind this machine cannot make and
--skip does not name); 130 interrupted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple, Sequence

from sync_mnist.core import config as config_lib
from lab import loopback_faults
from sync_mnist.launcher import launch, progress

WORKERS = 3
SIGNAL_FAULTS = ("kill", "stop-short", "stop-long", "term")
NETWORK_FAULTS = ("partition-short", "partition-long", "loss", "delay")
DISK_FAULTS = ("disk-full",)
FAULTS = SIGNAL_FAULTS + NETWORK_FAULTS + DISK_FAULTS
NO_FAULT = "none"  # a load run's victim, fault and phase: it runs beside a replay, untouched
# make chaos-short's draws: a fixed seed, the same runs every time; this one for their spread
# (each kind of victim at least twice, a network fault on each, both phases, 5 of 9 runs with
# a restart allowed, 1 and 2 ps).
SHORT_SEED = 2
PHASES = ("startup", "training", "end")
# What a stop or another lasting fault lasts, as a fraction of --timeout: well inside it, or
# well past it.
SHORT_STOP, LONG_STOP = (0.2, 0.6), (1.2, 1.6)
SPANS = {"kill": (0.0, 0.0), "stop-short": SHORT_STOP, "stop-long": LONG_STOP, "term": (0.0, 0.0),
         "partition-short": SHORT_STOP, "partition-long": LONG_STOP, "loss": LONG_STOP,
         "delay": LONG_STOP, "disk-full": SHORT_STOP}
# Faults a run must come through verified with no restart: a stop or a partition shorter than
# --timeout, LOSS of the victim's packets, DELAY_MS on each, the disk full while training.
SURVIVABLE = ("stop-short", "partition-short", "loss", "delay", "disk-full")
LOSS = 0.05  # tests/soak/test_network_soak.py: up to 5 % the run ends verified; 10 % may stall
DELAY_MS = 200.0
LOGDIR_SIZE = "64m"  # a disk-full run's --logdir, a tmpfs: checkpoints, summaries, the model
STARTUP_SPAN_SECS = 6.0  # a start-up fault lands this long at most after the victim started
END_SPAN_SECS = 2.5  # an end fault: at most this long after the last progress line
# The launcher's own exit codes that a fault may rightly cause (README, "Exit codes").
FAILURE_CODES = (config_lib.EXIT_FAILED, config_lib.EXIT_TIMEOUT)
_STARTED = re.compile(r"started (?P<task>ps \d+|worker \d+) \(pid (?P<pid>\d+)\)")
_HOLDER = re.compile(r"held by pid (?P<pid>\d+)")
_CLUSTER = re.compile(r"cluster: ps (?P<ps>\S+), workers (?P<workers>\S+);")
_TRACEBACK = ("Traceback (most recent call last)", "BrokenPipeError", "Exception ignored")
_REPEATS = re.compile(r"(\d+) of \d+ updates averaged more than one gradient of the same worker")
_ALERT = re.compile(r"\b(?:error|warning|critical):|exited with code|missing:")
LAUNCHER = [sys.executable, "-c",
            "import sys; from sync_mnist.launcher.cli import main; sys.exit(main())"]


@dataclasses.dataclass
class Plan:
    """One run: the cluster, the victim and its fault."""

    run: int
    ps: int
    replicas: int  # --replicas-to-aggregate; WORKERS: R = N
    max_restarts: int
    victim: str  # "ps 1", "worker 0" (the chief), "worker 2"; NO_FAULT for a load run
    fault: str  # one of FAULTS (disk-full: the victim is the chief, which writes --logdir)
    phase: str  # one of PHASES: when the fault is meant to land
    pause: float  # seconds between SIGSTOP and SIGCONT (0 for a kill)
    at_step: int  # training: the global step after which it lands
    delay: float  # seconds after the moment that starts its phase
    timeout: float
    train_steps: int
    log_every: int
    note: str = ""  # what a run is for, where it is not drawn: a replay, a load

    @property
    def victim_kind(self) -> str:
        return "chief" if self.victim == "worker 0" else self.victim.split()[0]


def _draw(rng: random.Random, run: int, faults: Sequence[str], *, timeout: float,
          train_steps: int, log_every: int, max_restarts: int,
          phases: Sequence[str] = PHASES) -> Plan:
    """One run's configuration, victim, fault (of `faults`) and moment (in one of `phases`),
    drawn at random."""
    ps = rng.choice((1, 2))
    victim_kind = rng.choice(("ps", "chief", "worker"))
    victim = {"ps": f"ps {rng.randrange(ps)}", "chief": "worker 0",
              "worker": f"worker {rng.randrange(1, WORKERS)}"}[victim_kind]
    fault = rng.choice(faults)
    if fault in DISK_FAULTS:
        victim = "worker 0"
    span = SPANS[fault]
    phase = rng.choice(phases)
    return Plan(
        run=run, ps=ps, replicas=rng.choice((WORKERS, WORKERS - 1)),
        max_restarts=rng.choice((0, max_restarts)), victim=victim, fault=fault, phase=phase,
        pause=round(rng.uniform(*span) * timeout, 1),
        at_step=rng.randrange(log_every, train_steps - log_every, log_every),
        delay=round(rng.uniform(0, {"startup": STARTUP_SPAN_SECS, "training": 0.3,
                                    "end": END_SPAN_SECS}[phase]), 2),
        timeout=timeout, train_steps=train_steps, log_every=log_every)


def plan_runs(rng: random.Random, count: int, *, timeout: float, train_steps: int,
              log_every: int, max_restarts: int, faults: Sequence[str] = FAULTS) -> list[Plan]:
    """`count` runs, each configuration, victim, fault (of `faults`) and moment drawn at
    random. The same seed draws the same runs: `--seed S` replays a run."""
    return [_draw(rng, run, faults, timeout=timeout, train_steps=train_steps,
                  log_every=log_every, max_restarts=max_restarts)
            for run in range(1, count + 1)]


def short_plans(rng: random.Random, *, timeout: float, train_steps: int, log_every: int,
                max_restarts: int, faults: Sequence[str] = FAULTS) -> list[Plan]:
    """`make chaos-short`: one run of each fault kind of `faults`, in FAULTS' order, its
    configuration, victim and moment drawn at random, in the start-up or the training, where
    a fault lands (one drawn for the end often comes after its victim has ended); then the
    end-of-run replays (replay_plans), each to be run beside fault-free runs for load."""
    drawn = [_draw(rng, run, (fault,), timeout=timeout, train_steps=train_steps,
                   log_every=log_every, max_restarts=max_restarts,
                   phases=("startup", "training"))
             for run, fault in enumerate((f for f in FAULTS if f in faults), start=1)]
    replays = [plan for plan in replay_plans(1, timeout=timeout, train_steps=train_steps,
                                             log_every=log_every) if plan.fault in faults]
    return drawn + [dataclasses.replace(plan, run=run)
                    for run, plan in enumerate(replays, start=len(drawn) + 1)]


def replay_plans(first_run: int, *, timeout: float, train_steps: int,
                 log_every: int) -> list[Plan]:
    """The end-of-run faults that full runs drew only rarely, and that failed only under
    load, each as its full run drew it (`--seed S` draws it again as run N), with one
    restart allowed, so each must end verified: ps 0 of 2 frozen past --timeout as the
    cluster finishes (run 37 of seed 1796431311: the workers' timeout at the finish named no
    ps; then a ps's read of the restarted one failed with CancelledError); worker 1 frozen at
    the finish, leaving both ps waiting for its done report (run 19 of the same seed); and the
    one ps killed as the cluster finishes, to come back empty (run 14 of seed 1796418640; the
    same fault under load found the finish barrier's NotFoundError). A stop's pause scales
    with --timeout."""
    common = dict(replicas=WORKERS, max_restarts=1, phase="end", timeout=timeout,
                  train_steps=train_steps, log_every=log_every)
    return [
        Plan(run=first_run, ps=2, victim="ps 0", fault="stop-long",
             pause=round(27.4 / 20 * timeout, 1), at_step=80, delay=0.56,
             note="replay: run 37 of seed 1796431311, a ps frozen at the finish", **common),
        Plan(run=first_run + 1, ps=2, victim="worker 1", fault="stop-long",
             pause=round(27.3 / 20 * timeout, 1), at_step=20, delay=0.25,
             note="replay: run 19 of seed 1796431311, a worker frozen at the finish",
             **common),
        Plan(run=first_run + 2, ps=1, victim="ps 0", fault="kill", pause=0.0, at_step=80,
             delay=0.16, note="replay: run 14 of seed 1796418640, the ps killed at the finish",
             **common),
    ]


def load_plan(run: int, *, timeout: float, train_steps: int, log_every: int) -> Plan:
    """A fault-free run, beside a replay for load: it must end verified like any other."""
    return Plan(run=run, ps=1, replicas=WORKERS, max_restarts=0, victim=NO_FAULT,
                fault=NO_FAULT, phase=NO_FAULT, pause=0.0, at_step=0, delay=0.0,
                timeout=timeout, train_steps=train_steps, log_every=log_every, note="load")


def quick_plans(*, timeout: float, train_steps: int, log_every: int,
                max_restarts: int) -> list[Plan]:
    """The short form (the soak tier): four fixed runs, one of each signal, in training."""
    common = dict(phase="training", at_step=train_steps // 2, delay=0.1, timeout=timeout,
                  train_steps=train_steps, log_every=log_every)
    return [
        Plan(run=1, ps=1, replicas=WORKERS, max_restarts=max_restarts, victim="worker 1",
             fault="kill", pause=0.0, **common),
        Plan(run=2, ps=2, replicas=WORKERS - 1, max_restarts=0, victim="worker 2",
             fault="stop-short", pause=round(0.3 * timeout, 1), **common),
        Plan(run=3, ps=1, replicas=WORKERS, max_restarts=0, victim="worker 1",
             fault="stop-long", pause=round(1.4 * timeout, 1), **common),
        Plan(run=4, ps=2, replicas=WORKERS, max_restarts=0, victim="ps 1", fault="term",
             pause=0.0, **common),
    ]


def launcher_args(plan: Plan, marker: Path, summary: Path, logdir: Path) -> list[str]:
    args = ["--ps", str(plan.ps), "--workers", str(WORKERS), "--base-port", "0",
            "--dataset", "synthetic", "--train-steps", str(plan.train_steps),
            "--timeout", f"{plan.timeout:g}", "--log-every", str(plan.log_every),
            "--logdir", str(logdir), "--save-steps", str(plan.log_every),
            # Not read with synthetic data: a mark in every command line of the run, to find
            # what is left of it.
            "--data-dir", str(marker), "--summary-json", str(summary)]
    if plan.replicas != WORKERS:
        args += ["--replicas-to-aggregate", str(plan.replicas)]
    if plan.max_restarts:
        args += ["--max-restarts", str(plan.max_restarts)]
    if plan.fault in NETWORK_FAULTS:
        args += ["--isolate", "on"]  # the namespace the faults are made in
    return args


def hang_bound(plan: Plan) -> float:
    """How long a run may last before the soak calls it a hang: every bound the launcher has,
    once per start and restart (each sign of life starts its stall bound again)."""
    stall = launch.STALL_ALLOWANCE_SECS + 2 * plan.timeout + launch.EXIT_GRACE_SECS
    return (2 + plan.max_restarts) * stall + plan.pause


class _Launcher:
    """One launcher process and its output, read line by line as it comes."""

    # Every launcher still running, of this thread or a load's beside it: an interrupt stops
    # them all (stop_all), and any started after it at once.
    _live: set[_Launcher] = set()
    _registry = threading.Lock()
    _halted = False

    def __init__(self, argv: list[str]):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        with _Launcher._registry:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, text=True,
                                         start_new_session=True)
            _Launcher._live.add(self)
            if _Launcher._halted:
                _kill_group(self.proc.pid)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def ended(self) -> None:
        with _Launcher._registry:
            _Launcher._live.discard(self)

    @classmethod
    def stop_all(cls) -> None:
        """Kills every launcher still running, by process group, and any started later: the
        soak was interrupted. Each run's own `finally` then sweeps what is left of it."""
        with cls._registry:
            cls._halted = True
            for launcher in cls._live:
                if launcher.proc.poll() is None:
                    _kill_group(launcher.proc.pid)

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, found, deadline: float):
        """The first line for which found(line) is true, or None once the launcher has ended
        or `deadline` (monotonic) has passed."""
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if found(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return None
                self._changed.wait(min(left, 0.5))

    def sleep(self, seconds: float) -> None:
        """Sleeps, but returns early if the launcher ends."""
        self._reader.join(timeout=seconds)

    def pids(self) -> dict[str, list[int]]:
        found = collections.defaultdict(list)
        for line in list(self.lines):
            m = _STARTED.search(line)
            if m:
                found[m["task"]].append(int(m["pid"]))
        return dict(found)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3 on of /proc/PID/stat (state, ppid, ...), or None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _identity(pid: int, parent: int) -> str | None:
    """The start time of `pid` if it is a live child of `parent`, else None: a pid is only
    signalled while this holds, so a pid reused by another process is never touched."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X") or int(stat[1]) != parent:
        return None
    return stat[19]  # field 22: start time, in clock ticks since boot


def _signal(pid: int, parent: int, identity: str | None, signum: int) -> bool:
    if identity is None or _identity(pid, parent) != identity:
        return False
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def _phase_now(lines: list[str], plan: Plan) -> str:
    """Where the run is, from what the launcher has printed so far."""
    end = False
    training = False
    for line in lines:
        reading = progress.parse(line)
        if reading:
            training = True
            end = end or reading.global_step >= reading.target - plan.log_every
        elif "test_accuracy=" in line or "verdict:" in line or "reported done" in line:
            end = True
    return "end" if end else "training" if training else "startup"


def _trigger(launcher: _Launcher, plan: Plan, deadline: float) -> bool:
    """Waits for the moment `plan` chose; False if the run ended (or the deadline came) first."""
    if plan.phase == "startup":
        found = launcher.wait_for(lambda line: (m := _STARTED.search(line)) is not None
                                  and m["task"] == plan.victim, deadline)
    elif plan.phase == "training":
        found = launcher.wait_for(lambda line: (r := progress.parse(line)) is not None
                                  and r.global_step >= plan.at_step, deadline)
    else:
        found = launcher.wait_for(lambda line: (r := progress.parse(line)) is not None
                                  and r.global_step >= r.target - plan.log_every, deadline)
    if found is None:
        return False
    launcher.sleep(plan.delay)
    return launcher.proc.poll() is None


def run_one(plan: Plan, workdir: Path, fault: bool = True,
            net_class: loopback_faults.NetClass | None = None) -> dict:
    """Runs `plan` (without its fault: the rerun of a preempted run); returns what was seen
    (the input of classify). A network fault needs `net_class`."""
    marker, summary_path = workdir / f"run-{plan.run}-marker", workdir / f"run-{plan.run}.json"
    logdir = workdir / f"run-{plan.run}-logdir"
    summary_path.unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        if fault and plan.fault in DISK_FAULTS:
            stack.enter_context(_tmpfs(logdir, LOGDIR_SIZE))
        return _run_one(plan, marker, summary_path, logdir, fault, net_class)


def run_beside(plan: Plan, workdir: Path, next_load,
               net_class: loopback_faults.NetClass | None = None
               ) -> tuple[dict, list[tuple[Plan, dict]]]:
    """Runs `plan` as run_one does, and beside it, for load, fault-free runs one after
    another (each plan from next_load()) until it has ended; the last of them runs to its end.
    Returns (what was seen of `plan`, [(load plan, what was seen of it)])."""
    done = threading.Event()
    loads: list[tuple[Plan, dict]] = []
    failed: list[BaseException] = []

    def load() -> None:
        try:
            while not done.is_set():
                load_plan = next_load()
                loads.append((load_plan, run_one(load_plan, workdir, fault=False)))
        except BaseException as e:  # raised again in the caller's thread
            failed.append(e)

    beside = threading.Thread(target=load, name="chaos-load", daemon=True)
    beside.start()
    try:
        seen = run_one(plan, workdir, net_class=net_class)
        done.set()
        beside.join()
    except BaseException:  # Ctrl-C or SIGTERM (main): the load's run goes too
        done.set()
        _Launcher.stop_all()
        beside.join()
        raise
    if failed:
        raise failed[0]
    return seen, loads


def _run_one(plan: Plan, marker: Path, summary_path: Path, logdir: Path, fault: bool,
             net_class: loopback_faults.NetClass | None) -> dict:
    started = time.monotonic()
    deadline = started + hang_bound(plan)
    launcher = _Launcher([*LAUNCHER, *launcher_args(plan, marker, summary_path, logdir)])
    seen = {"fault_landed": False, "phase_seen": None, "fault_at_s": None, "victim_pid": None,
            "hang": False}
    undo: threading.Timer | None = None
    try:
        if fault and _trigger(launcher, plan, deadline):
            pid = (launcher.pids().get(plan.victim) or [None])[-1]
            identity = _identity(pid, launcher.proc.pid) if pid else None
            seen.update(victim_pid=pid, phase_seen=_phase_now(list(launcher.lines), plan),
                        fault_at_s=round(time.monotonic() - started, 2))
            seen["fault_landed"], heal = _inject(plan, launcher, pid, identity, logdir,
                                                 net_class)
            if heal is not None:
                undo = threading.Timer(plan.pause, heal)
                undo.start()
        try:
            launcher.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            seen["hang"] = True
    finally:  # also on Ctrl-C or SIGTERM (main): nothing of the run outlives the soak
        if undo is not None:
            undo.cancel()
            undo.function()  # nothing of the run stays stopped, cut off or full
        if launcher.proc.poll() is None:
            _kill_group(launcher.proc.pid)
            launcher.proc.wait()
        launcher.ended()
        launcher.sleep(5)  # the rest of its output
        leftovers = _leftovers(marker, launcher.lines)
    seen["wall_s"] = round(time.monotonic() - started, 1)
    seen["code"] = launcher.proc.returncode
    seen["pids"] = launcher.pids()
    seen["leftovers"] = leftovers
    try:
        seen["summary"] = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        seen["summary"] = None
    seen["lines"] = launcher.lines
    return seen


def _inject(plan: Plan, launcher: _Launcher, pid: int | None, identity: str | None,
            logdir: Path, net_class: loopback_faults.NetClass | None):
    """Makes `plan`'s fault on its victim, process `pid`; returns (whether it landed, what
    undoes it after the pause, or None)."""
    parent = launcher.proc.pid
    if plan.fault in ("kill", "term"):
        return _signal(pid, parent, identity, {"kill": signal.SIGKILL,
                                               "term": signal.SIGTERM}[plan.fault]), None
    if plan.fault in ("stop-short", "stop-long"):
        if not _signal(pid, parent, identity, signal.SIGSTOP):
            return False, None
        return True, lambda: _signal(pid, parent, identity, signal.SIGCONT)
    if plan.fault == "disk-full":
        disk = loopback_faults.DiskFull(logdir)
        disk.fill()
        return True, disk.free
    # A network fault: in the launcher's namespace, on the victim's packets and its port.
    if identity is None or _identity(pid, parent) != identity:
        return False, None
    lines = list(launcher.lines)
    holder = next(int(m["pid"]) for line in lines if (m := _HOLDER.search(line)))
    fault = loopback_faults.LoopbackFault(net_class, holder)
    port = victim_port(lines, plan.victim)
    try:
        if plan.fault == "loss":
            fault.lose(pid, port, LOSS)
        elif plan.fault == "delay":
            fault.delay(pid, port, DELAY_MS)
        else:
            fault.partition(pid, port)
    except BaseException:
        fault.heal()  # what was made of it; the error is the soak's own, and ends it
        raise

    def release_at_the_restart():  # the fault is the process's, as a stop is
        if launcher.wait_for(lambda line: (m := _STARTED.search(line)) is not None
                             and m["task"] == plan.victim and int(m["pid"]) != pid,
                             time.monotonic() + plan.pause):
            fault.release_port()

    threading.Thread(target=release_at_the_restart, daemon=True).start()
    return True, fault.heal


def victim_port(lines: list[str], victim: str) -> int:
    """The server port of task `victim` ("ps 1", "worker 0"), from the launcher's cluster
    line."""
    role, index = victim.split()
    m = next(m for line in lines if (m := _CLUSTER.search(line)))
    hosts = m["ps" if role == "ps" else "workers"].split(",")
    return int(hosts[int(index)].rsplit(":", 1)[1])


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    """A tmpfs of `size` mounted at `path` for the block: a disk that can be filled."""
    path.mkdir(parents=True, exist_ok=True)
    loopback_faults.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "sync-mnist-chaos",
                         str(path)])
    try:
        yield path
    finally:
        loopback_faults.run(["umount", "--lazy", str(path)])


def _leftovers(marker: Path, lines: list[str]) -> list[str]:
    """Processes of the run still alive after its launcher ended; each is killed, by group."""
    holders = {int(m["pid"]) for line in lines if (m := _HOLDER.search(line))}
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        if str(marker) in argv or pid in holders:
            left.append(f"{pid}: {argv.strip()}")
            _kill_group(pid)
    return left


def _kill_group(pid: int) -> None:
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def classify(plan: Plan, seen: dict) -> tuple[str, list[str]]:
    """(category, defects) of one run, against the README; see the module docstring."""
    defects = []
    code, summary, lines = seen["code"], seen["summary"], seen["lines"]
    if seen["hang"]:
        defects.append("hang")
    if seen["leftovers"]:
        defects.append("leftover")
    if any(mark in line for line in lines for mark in _TRACEBACK):
        defects.append("traceback")
    if summary and any(t.get("blocked") and "stopped by the launcher" in (t.get("error") or "")
                       and "still running at the end" not in (t.get("error") or "")
                       for t in summary.get("tasks", [])):
        defects.append("overdue")
    repeats = [int(n) for n in _REPEATS.findall(summary.get("verdict") or "")] if summary else []
    if summary and summary.get("repeat_updates") is not None:
        repeats.append(int(summary["repeat_updates"]))
    if plan.replicas == WORKERS and any(repeats):
        defects.append("repeat")
    verified = bool(summary) and summary.get("synchronous") is True and _counters_agree(
        plan, summary)
    if summary and summary.get("synchronous") is True and not _counters_agree(plan, summary):
        defects.append("contradiction")
    disk_full = plan.fault in DISK_FAULTS and _documented_full_disk(code, lines)
    if code == config_lib.EXIT_OK:
        if not verified:
            defects.append("contradiction")
        category = "restarted" if summary and summary.get("restarts") else "verified"
    elif code in FAILURE_CODES or disk_full:
        category = "failed-named"
        if disk_full:
            pass  # documented, whatever the counters say
        elif verified:
            defects.append("contradiction")  # the counters verified it, yet it failed
        elif summary and any(t.get("role") == "worker" and t.get("synchronous") is True
                             for t in summary.get("tasks", [])) \
                and not _model_lost(plan, code, summary):
            # A worker read the final counters and verified the run; then something failed.
            # (Not the model lost before the chief ended: its evaluation and SavedModel are
            # lost, and the README documents the failure.)
            defects.append("verified-but-failed")
        if plan.max_restarts and not disk_full:
            defects.append("restart-failed")  # issue 35: one restart mends any one fault
        if not seen["fault_landed"]:
            defects.append("no-fault-failed")
        elif plan.fault in SURVIVABLE and not disk_full:
            defects.append("survivable-failed")
        elif not _names(lines, plan):
            defects.append("unnamed")
    elif code == config_lib.EXIT_PREEMPTED and plan.fault == "term" and seen["fault_landed"]:
        category = "preempted"
        rerun = seen.get("rerun") or {}
        done = rerun.get("summary") or {}
        if not (rerun.get("code") == config_lib.EXIT_OK and done.get("synchronous") is True
                and _counters_agree(plan, done)):
            defects.append("not-resumed")
    elif code == config_lib.EXIT_NOT_SYNCHRONOUS:
        category = "not-synchronous"
        if "repeat" not in defects:
            defects.append("unexpected-code")
    else:
        category = f"exit {code}"
        if not seen["hang"]:
            defects.append("unexpected-code")
    return ("defect" if defects else category), sorted(set(defects))


class KnownDefect(NamedTuple):
    """A defect found and filed, not fixed yet: the runs it shows in (their victim and fault,
    the defects classify finds), and its signature, a line of their output."""

    victim: str
    faults: tuple[str, ...]
    defects: frozenset[str]
    signature: re.Pattern


# Defects found and filed, not fixed yet: a run whose defects are all one of these's, with its
# signature, is recorded and printed as known ("known": the name), and fails neither `make
# chaos` nor `make chaos-short`; any other defect, or this one's without its signature, does.
# None now: the last, the zombie update, is fixed (issue 56; tests/network/
# test_zombie_update.py). An entry names the issue filed for it.
KNOWN_DEFECTS: dict[str, KnownDefect] = {}


def known_defect(plan: Plan, seen: dict, defects: Sequence[str],
                 known: dict[str, KnownDefect] | None = None) -> str | None:
    """The name, among `known` (KNOWN_DEFECTS), of a run whose defects are that one's and only
    that one's, its signature among the run's lines."""
    if not defects:
        return None
    matches = [name for name, d in (KNOWN_DEFECTS if known is None else known).items()
               if plan.victim == d.victim and plan.fault in d.faults
               and set(defects) <= d.defects
               and any(d.signature.search(line) for line in seen["lines"])]
    return matches[0] if matches else None


def _model_lost(plan: Plan, code: int, summary: dict) -> bool:
    """A documented failure after a worker verified the counters (README, "When something
    goes wrong"): before the chief ended, the fault took what it still needed. The chief,
    killed or frozen past --timeout, not restarted; or a ps, whose variables are the model,
    killed (restarted, it comes back empty) or frozen past --timeout and not restarted."""
    chief = next((t for t in summary.get("tasks", [])
                  if t.get("role") == "worker" and t.get("index") == 0), {})
    if code not in FAILURE_CODES or plan.fault == "stop-short" or chief.get("exit_code") == 0:
        return False
    if plan.victim_kind == "chief":
        return plan.max_restarts == 0
    return plan.victim_kind == "ps" and (plan.fault == "kill" or plan.max_restarts == 0)


def _documented_full_disk(code: int, lines: list[str]) -> bool:
    """The documented failures of a full --logdir (README, "When something goes wrong"): no
    room for the very first checkpoint, exit 2 naming the directory; or no room for the
    trained model at the end, exit 1, however the counters verified the run. No restart
    frees a disk."""
    mark = {config_lib.EXIT_FAILED: "No space left on device",
            config_lib.EXIT_USAGE: "has no room for a checkpoint"}.get(code)
    return mark is not None and any("error:" in line and mark in line for line in lines)


def _counters_agree(plan: Plan, s: dict) -> bool:
    """Whether the summary's counters show what a synchronous verdict claims."""
    step, target, accepted = s.get("global_step"), s.get("target_steps"), s.get("contributions")
    if step is None or accepted is None or step != (s.get("stop_step") or target):
        return False
    if plan.replicas == WORKERS:
        return accepted == [step] * WORKERS
    return sum(accepted) >= plan.replicas * step


def _names(lines: list[str], plan: Plan) -> bool:
    """Whether a warning or error line names the victim."""
    name = re.compile(rf"\b{plan.victim}\b" + (r"|\bthe chief\b" if plan.victim == "worker 0"
                                              else r"|\bthe ps\b" if plan.ps == 1
                                              and plan.victim == "ps 0" else ""))
    return any(_ALERT.search(line) and name.search(line) for line in lines)


def run_line(plan: Plan, seen: dict, category: str, defects: list[str]) -> str:
    fault = plan.fault + (f" {plan.pause:g}s" if plan.pause else "")
    landed = (f"{seen['phase_seen']}@{seen['fault_at_s']:g}s" if seen["fault_landed"]
              else "missed")
    restarts = (seen["summary"] or {}).get("restarts") or {}
    what = ("no fault" if plan.fault == NO_FAULT
            else f"{plan.victim} ({plan.victim_kind}) {fault} {plan.phase}->{landed}")
    return (f"run {plan.run:>3}  ps={plan.ps} R={plan.replicas}/{WORKERS} "
            f"restarts<={plan.max_restarts}  {what}  exit {seen['code']} in "
            f"{seen['wall_s']:g}s  {category}"
            + (f" [{', '.join(defects)}]" if defects else "")
            + (f" restarted {restarts}" if restarts else "")
            + (f"  ({plan.note})" if plan.note else ""))


def tables(records: list[dict], skipped: Sequence[str] = ()) -> str:
    """The outcomes by (victim, fault) and by the phase the fault landed in; the kinds
    skipped."""
    columns = ("verified", "restarted", "preempted", "failed-named", "defect")
    out = []
    for title, key in (("victim  fault", lambda r: f"{r['victim_kind']:<7} {r['fault']:<15}"),
                       ("phase", lambda r: "no fault" if r["fault"] == NO_FAULT
                        else r["phase_seen"] or "missed")):
        counts = collections.defaultdict(collections.Counter)
        for r in records:
            counts[key(r)][r["category"] if r["category"] in columns else "defect"] += 1
        out.append(f"{title:<24}{'runs':>6}" + "".join(f"{c:>14}" for c in columns))
        for row in sorted(counts):
            c = counts[row]
            out.append(f"{row:<24}{sum(c.values()):>6}" + "".join(f"{c[k]:>14}" for k in columns))
        out.append("")
    kinds = collections.Counter(d for r in records for d in r["defects"])
    out.append("defects: " + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"))
    known = collections.Counter(r["known"] for r in records if r.get("known"))
    if known:
        out.append("of which known (KNOWN_DEFECTS, filed, not fixed): "
                   + ", ".join(f"{k} {n}" for k, n in sorted(known.items())))
    missed = [f"run {r['run']} {r['fault']}" for r in records
              if r["fault"] != NO_FAULT and not r["fault_landed"]]
    if missed:
        out.append("missed (the victim had ended): " + ", ".join(missed))
    if skipped:
        out.append("skipped (--skip): " + ", ".join(skipped))
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.chaos",
                                description="Run the localhost cluster many times, each with "
                                            "one random fault, and classify every outcome.")
    p.add_argument("--minutes", type=float, default=15.0,
                   help="start runs until this much time has gone (default: 15)")
    p.add_argument("--runs", type=int, default=None,
                   help="exactly this many runs instead (default: as --minutes allow)")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--quick", action="store_true",
                      help="four fixed runs, one of each signal (the soak tier's form)")
    form.add_argument("--short", action="store_true",
                      help="one run of each fault kind, then the end-of-run replays, each "
                           f"beside fault-free runs for load (make chaos-short; --seed "
                           f"{SHORT_SEED} unless given)")
    p.add_argument("--skip", default="", metavar="KIND[,KIND]",
                   help="fault kinds not to draw, e.g. those this machine cannot make "
                        f"(default: none; the kinds: {', '.join(FAULTS)})")
    p.add_argument("--seed", type=int, default=None,
                   help=f"random seed (default: from time; {SHORT_SEED} with --short)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="each cluster's --timeout (default: 20)")
    p.add_argument("--train-steps", type=int, default=100, help="updates per run (default: 100)")
    p.add_argument("--max-restarts", type=int, default=1,
                   help="the launcher's --max-restarts in the runs that have one: 1, one "
                        "restart for the one fault (default: 1)")
    p.add_argument("--json", type=Path, default=None,
                   help="where every run is written (default: chaos-results/chaos.json; "
                        "chaos-results/chaos-short.json with --short)")
    return p


def parse_skip(text: str) -> list[str]:
    """The fault kinds named by --skip, in FAULTS' order; ValueError naming any that is not a
    kind, and the kinds."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in FAULTS]
    if unknown:
        raise ValueError(f"--skip: {', '.join(map(repr, unknown))} "
                         f"{'is not a fault kind' if len(unknown) == 1 else 'are not fault kinds'}"
                         f" (the kinds: {', '.join(FAULTS)})")
    return [kind for kind in FAULTS if kind in names]


def cannot_draw(kinds: Sequence[str]) -> dict[str, str]:
    """Each kind of `kinds` this machine cannot make, and why. Signals it always can; the
    network faults need root and nftables, iptables (loopback_faults.unavailable), the disk
    fault root for its tmpfs. The net_cls cgroup is tried apart (main)."""
    network = loopback_faults.unavailable()
    disk = ("it needs root (a tmpfs of its own)" if os.geteuid() != 0
            else "`mount` is not installed" if shutil.which("mount") is None else None)
    why = {}
    for kind in kinds:
        reason = network if kind in NETWORK_FAULTS else disk if kind in DISK_FAULTS else None
        if reason:
            why[kind] = reason
    return why


def undrawable_message(why: dict[str, str]) -> str:
    """The error for fault kinds that cannot be drawn: each with why, and the --skip that
    leaves them out."""
    by_reason: dict[str, list[str]] = collections.defaultdict(list)
    for kind, reason in why.items():
        by_reason[reason].append(kind)
    return ("cannot draw these fault kinds here: "
            + "; ".join(f"{', '.join(kinds)}: {reason}" for reason, kinds in by_reason.items())
            + f". Skip them by name to run without them: --skip {','.join(why)}")


def _drawable(p: argparse.ArgumentParser, kinds: list[str]) -> loopback_faults.NetClass | None:
    """Exits 2 (p.error) naming the kinds of `kinds` this machine cannot make; else the
    net_cls class the network faults need, if any is among them."""
    why = cannot_draw(kinds)
    net_class = None
    if not why and any(kind in NETWORK_FAULTS for kind in kinds):
        try:
            net_class = loopback_faults.NetClass()
        except loopback_faults.FaultError as e:
            why = {kind: f"no net_cls cgroup: {e}" for kind in kinds if kind in NETWORK_FAULTS}
    if why:
        p.error(undrawable_message(why))
    return net_class


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    log_every = 10
    if args.train_steps < 3 * log_every or args.timeout <= 0 or (args.runs or 1) < 1:
        p.error(f"--train-steps must be at least {3 * log_every}, --timeout and --runs positive")
    try:
        skipped = parse_skip(args.skip)
    except ValueError as e:
        p.error(str(e))
    kinds = [kind for kind in FAULTS if kind not in skipped]
    if not kinds:
        p.error("--skip leaves no fault kind to draw")
    seed = args.seed if args.seed is not None else SHORT_SEED if args.short else int(time.time())
    json_path = args.json or Path("chaos-results/chaos-short.json" if args.short
                                  else "chaos-results/chaos.json")
    options = dict(timeout=args.timeout, train_steps=args.train_steps, log_every=log_every,
                   max_restarts=args.max_restarts)
    if args.quick:  # signals only
        net_class = None
        plans = [plan for plan in quick_plans(**options) if plan.fault in kinds]
    else:
        net_class = _drawable(p, kinds)
        plans = (short_plans if args.short else plan_runs)(
            random.Random(seed), **({} if args.short else {"count": args.runs or 10_000}),
            **options, faults=kinds)
    budget = None if args.quick or args.short or args.runs else args.minutes * 60
    print(f"chaos: seed {seed}; {len(plans) if budget is None else 'for'} "
          f"{'runs' if budget is None else f'{args.minutes:g} minutes'}; --timeout "
          f"{args.timeout:g}, --train-steps {args.train_steps}, {WORKERS} workers"
          + (f"; skipped: {', '.join(skipped)}" if skipped else ""), flush=True)
    started = time.monotonic()
    records: list[dict] = []
    # SIGTERM unwinds like Ctrl-C, through run_one's finally, which stops the current run.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        _run_plans(plans, records, json_path, budget, net_class)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return config_lib.EXIT_INTERRUPTED
    finally:
        if net_class is not None:
            net_class.close()
        if records:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps({"seed": seed, "settings": options,
                                             "skipped": skipped, "runs": records},
                                            indent=2) + "\n")
    print(tables(records, skipped), flush=True)
    print(f"{len(records)} runs in {time.monotonic() - started:.0f} s; written to {json_path}")
    failed = any(r["defects"] and not r.get("known") for r in records)
    return config_lib.EXIT_FAILED if failed else config_lib.EXIT_OK


def _run_plans(plans: list[Plan], records: list[dict], json_path: Path, budget: float | None,
               net_class: loopback_faults.NetClass | None) -> None:
    """Runs each plan in turn (a replay beside fault-free runs for load) until the budget of
    seconds, if any, would be passed; appends each run's record to `records` as it ends."""
    started = time.monotonic()
    next_run = itertools.count(max((plan.run for plan in plans), default=0) + 1)
    with tempfile.TemporaryDirectory(prefix="sync-mnist-chaos-") as tmp:
        workdir = Path(tmp)
        for plan in plans:
            mean = (time.monotonic() - started) / len(records) if records else 0.0
            if budget is not None and time.monotonic() - started + mean > budget:
                break
            if plan.note.startswith("replay"):
                seen, loads = run_beside(plan, workdir, lambda: load_plan(
                    next(next_run), timeout=plan.timeout, train_steps=plan.train_steps,
                    log_every=plan.log_every), net_class=net_class)
            else:
                seen, loads = run_one(plan, workdir, net_class=net_class), []
            for run_plan, run_seen in [(plan, seen), *loads]:
                records.append(_judge(run_plan, run_seen, workdir, json_path))


def _judge(plan: Plan, seen: dict, workdir: Path, json_path: Path) -> dict:
    """Classifies one run (a preempted one first run again with the same --logdir, which must
    resume), prints its line, writes its output beside `json_path`; returns its record."""
    if seen["code"] == config_lib.EXIT_PREEMPTED:  # it must resume, and finish
        again = run_one(plan, workdir, fault=False)
        seen["rerun"] = {k: again[k] for k in ("code", "summary", "wall_s")}
        seen["lines"] += ["--- the rerun, with the same --logdir ---", *again["lines"]]
    category, defects = classify(plan, seen)
    known = known_defect(plan, seen, defects)
    print(run_line(plan, seen, category, defects)
          + (f" (known: {known}, filed, not fixed)" if known else ""), flush=True)
    output = json_path.with_name(f"{json_path.stem}-run-{plan.run}.log")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(seen["lines"]) + "\n")
    return {**dataclasses.asdict(plan), "victim_kind": plan.victim_kind,
            "category": category, "defects": defects, "known": known, "log": str(output),
            **{k: v for k, v in seen.items() if k != "lines"},
            "alerts": [line for line in seen["lines"] if _ALERT.search(line)][:40]}


if __name__ == "__main__":
    sys.exit(main())
