"""The chaos soak: the localhost cluster many times, each run with one fault at a random moment.

    python -m lab.chaos [--minutes 15] [--runs N] [--seed S] [--quick]
                                           [--timeout 20] [--json chaos-results/chaos.json]
    make chaos [ARGS=...]

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
The network and disk faults need root; elsewhere they are left out, and the soak says so.
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

It prints one line per run, then the outcomes by (victim, fault) and by phase, and writes every
run, with its plan and what was seen, to --json, and each run's output beside it
(chaos-run-N.log). Exit codes: 0 no defect; 1 some defect; 2 bad
arguments; 130 interrupted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from sync_mnist.core import config as config_lib
from lab import loopback_faults
from sync_mnist.launcher import launch, progress

WORKERS = 3
SIGNAL_FAULTS = ("kill", "stop-short", "stop-long", "term")
NETWORK_FAULTS = ("partition-short", "partition-long", "loss", "delay")
DISK_FAULTS = ("disk-full",)
FAULTS = SIGNAL_FAULTS + NETWORK_FAULTS + DISK_FAULTS
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
    victim: str  # "ps 1", "worker 0" (the chief), "worker 2"
    fault: str  # one of FAULTS (disk-full: the victim is the chief, which writes --logdir)
    phase: str  # one of PHASES: when the fault is meant to land
    pause: float  # seconds between SIGSTOP and SIGCONT (0 for a kill)
    at_step: int  # training: the global step after which it lands
    delay: float  # seconds after the moment that starts its phase
    timeout: float
    train_steps: int
    log_every: int

    @property
    def victim_kind(self) -> str:
        return "chief" if self.victim == "worker 0" else self.victim.split()[0]


def plan_runs(rng: random.Random, count: int, *, timeout: float, train_steps: int,
              log_every: int, max_restarts: int, faults: Sequence[str] = FAULTS) -> list[Plan]:
    """`count` runs, each configuration, victim, fault (of `faults`) and moment drawn at
    random."""
    plans = []
    for run in range(1, count + 1):
        ps = rng.choice((1, 2))
        victim_kind = rng.choice(("ps", "chief", "worker"))
        victim = {"ps": f"ps {rng.randrange(ps)}", "chief": "worker 0",
                  "worker": f"worker {rng.randrange(1, WORKERS)}"}[victim_kind]
        fault = rng.choice(faults)
        if fault in DISK_FAULTS:
            victim = "worker 0"
        span = SPANS[fault]
        phase = rng.choice(PHASES)
        plans.append(Plan(
            run=run, ps=ps, replicas=rng.choice((WORKERS, WORKERS - 1)),
            max_restarts=rng.choice((0, max_restarts)), victim=victim, fault=fault, phase=phase,
            pause=round(rng.uniform(*span) * timeout, 1),
            at_step=rng.randrange(log_every, train_steps - log_every, log_every),
            delay=round(rng.uniform(0, {"startup": STARTUP_SPAN_SECS, "training": 0.3,
                                        "end": END_SPAN_SECS}[phase]), 2),
            timeout=timeout, train_steps=train_steps, log_every=log_every))
    return plans


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

    def __init__(self, argv: list[str]):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

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
    return (f"run {plan.run:>3}  ps={plan.ps} R={plan.replicas}/{WORKERS} "
            f"restarts<={plan.max_restarts}  {plan.victim} ({plan.victim_kind}) {fault} "
            f"{plan.phase}->{landed}  exit {seen['code']} in {seen['wall_s']:g}s  {category}"
            + (f" [{', '.join(defects)}]" if defects else "")
            + (f" restarted {restarts}" if restarts else ""))


def tables(records: list[dict]) -> str:
    """The outcomes by (victim, fault) and by the phase the fault landed in."""
    columns = ("verified", "restarted", "preempted", "failed-named", "defect")
    out = []
    for title, key in (("victim  fault", lambda r: f"{r['victim_kind']:<7} {r['fault']:<15}"),
                       ("phase", lambda r: r["phase_seen"] or "missed")):
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
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.chaos",
                                description="Run the localhost cluster many times, each with "
                                            "one random fault, and classify every outcome.")
    p.add_argument("--minutes", type=float, default=15.0,
                   help="start runs until this much time has gone (default: 15)")
    p.add_argument("--runs", type=int, default=None,
                   help="exactly this many runs instead (default: as --minutes allow)")
    p.add_argument("--quick", action="store_true",
                   help="four fixed runs, one of each signal (the soak tier's form)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from time)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="each cluster's --timeout (default: 20)")
    p.add_argument("--train-steps", type=int, default=100, help="updates per run (default: 100)")
    p.add_argument("--max-restarts", type=int, default=1,
                   help="the launcher's --max-restarts in the runs that have one: 1, one "
                        "restart for the one fault (default: 1)")
    p.add_argument("--json", type=Path, default=Path("chaos-results/chaos.json"),
                   help="where every run is written (default: chaos-results/chaos.json)")
    args = p.parse_args(argv)
    log_every = 10
    if args.train_steps < 3 * log_every or args.timeout <= 0 or (args.runs or 1) < 1:
        p.error(f"--train-steps must be at least {3 * log_every}, --timeout and --runs positive")
    seed = args.seed if args.seed is not None else int(time.time())
    options = dict(timeout=args.timeout, train_steps=args.train_steps, log_every=log_every,
                   max_restarts=args.max_restarts)
    left_out = loopback_faults.unavailable()
    net_class = None
    if left_out is None and not args.quick:
        try:
            net_class = loopback_faults.NetClass()
        except loopback_faults.FaultError as e:
            left_out = f"no net_cls cgroup: {e}"
    if left_out and not args.quick:
        print(f"chaos: network and disk faults left out: {left_out}", flush=True)
    plans = quick_plans(**options) if args.quick else plan_runs(
        random.Random(seed), args.runs or 10_000, **options,
        faults=SIGNAL_FAULTS if left_out else FAULTS)
    budget = None if args.quick or args.runs else args.minutes * 60
    print(f"chaos: seed {seed}; {len(plans) if budget is None else 'for'} "
          f"{'runs' if budget is None else f'{args.minutes:g} minutes'}; --timeout "
          f"{args.timeout:g}, --train-steps {args.train_steps}, {WORKERS} workers", flush=True)
    records = []
    started = time.monotonic()
    # SIGTERM unwinds like Ctrl-C, through run_one's finally, which stops the current run.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with tempfile.TemporaryDirectory(prefix="sync-mnist-chaos-") as tmp:
            for plan in plans:
                mean = (time.monotonic() - started) / len(records) if records else 0.0
                if budget is not None and time.monotonic() - started + mean > budget:
                    break
                seen = run_one(plan, Path(tmp), net_class=net_class)
                if seen["code"] == config_lib.EXIT_PREEMPTED:  # it must resume, and finish
                    again = run_one(plan, Path(tmp), fault=False)
                    seen["rerun"] = {k: again[k] for k in ("code", "summary", "wall_s")}
                    seen["lines"] += ["--- the rerun, with the same --logdir ---",
                                      *again["lines"]]
                category, defects = classify(plan, seen)
                print(run_line(plan, seen, category, defects), flush=True)
                output = args.json.with_name(f"{args.json.stem}-run-{plan.run}.log")
                output.parent.mkdir(parents=True, exist_ok=True)
                output.write_text("\n".join(seen["lines"]) + "\n")
                records.append({**dataclasses.asdict(plan), "victim_kind": plan.victim_kind,
                                "category": category, "defects": defects, "log": str(output),
                                **{k: v for k, v in seen.items() if k != "lines"},
                                "alerts": [line for line in seen["lines"]
                                           if _ALERT.search(line)][:40]})
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return config_lib.EXIT_INTERRUPTED
    finally:
        if net_class is not None:
            net_class.close()
        if records:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"seed": seed, "settings": options,
                                             "runs": records}, indent=2) + "\n")
    print(tables(records), flush=True)
    print(f"{len(records)} runs in {time.monotonic() - started:.0f} s; written to {args.json}")
    return config_lib.EXIT_FAILED if any(r["defects"] for r in records) else config_lib.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
