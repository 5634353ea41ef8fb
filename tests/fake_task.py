"""A stand-in for `python -m sync_mnist` in launcher tests: no TensorFlow, no server.

    fake_task.py BEHAVIOUR DIR --role R --index I ... --summary-json PATH

Every worker but the chief waits (bounded) until the ps has started, then says it waits for
the chief and waits (bounded) until the chief has started, as real ones do, so the launcher
goes through its whole start order. Marks in DIR: `chief-started`, `ps-started`, and
`ROLE-INDEX-runs`, one line per process started for that task (so a behaviour can differ in a
restarted task). Every task's first process writes its pid to `ROLE-INDEX.pid`. BEHAVIOUR:
  ok               every task ends by itself; the workers' records say synchronous; exit 0.
  hanging-ps       the workers finish, synchronous, and exit 0; the ps never exits.
  not-synchronous  every task ends by itself; the workers' records say "not synchronous"
                   and they exit 3, as real workers of the question's replay do.
  bad-input-chief  the chief rejects its input as a real one does (one `error:` line, a
                   record with the error, exit 2); the other tasks wait to be stopped.
  timeout          every worker exits 200 (a bounded wait) naming nobody as missing.
  frozen-worker    every worker's first process logs a progress line, then worker 1's stops
                   itself (SIGSTOP); the others then wait --timeout and exit 200 naming worker
                   1 as missing, as real ones do (in the message, and in the record's
                   `missing`, which is what the launcher reads). Restarted, every worker ends
                   as in `ok`.
  frozen-worker-waited  as frozen-worker, but the others then say they wait for the
                   replacement of worker 1 (report.WAITING_FOR_REPLACEMENT), as real ones do
                   with --restart-grace, and wait (--restart-grace) until a second process of
                   worker 1 has started; then every worker ends as in `ok`, none restarted.
  slow-replacement every worker's first process logs a progress line, then worker 1's kills
                   itself (SIGKILL); its second process takes 3 x --timeout to start, while the
                   others' first processes exit 200 after 2 x --timeout naming worker 1 as
                   missing (it has not said it waits for the chief yet). Restarted, every
                   worker ends as in `ok`.
  lost-backup      worker 2 kills itself (SIGKILL) once the chief has started; the others end
                   synchronous and name it lost, as with --replicas-to-aggregate 2.
  ps-dies-at-start the ps's first process exits 201 at once, before the chief has started;
                   restarted, it ends as in `ok`.
  no-end           no task ever ends, and no worker logs progress.
  chatty           as `ok`, but every worker first prints 2 MB of lines.
  ps-dies-at-end   as `ok`, but the ps kills itself (SIGKILL) once the chief has exited.
  late-backup      as `ok` with worker 2 lost, except that worker 2 exits 200 once the chief
                   has exited (a frozen backup the chief declared lost, woken up at the end).
  preempted        every task says it is ready, then waits for SIGTERM and ends as a preempted
                   task does: stopped on update 2 of 4, exit 143 (SIGINT ends it at once, 130).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from sync_mnist.core import config as config_lib
from sync_mnist.task import report

START_SECS = 30.0  # a bare Python start-up, bounded generously for a loaded machine
BAD_INPUT = "--logdir /nowhere/logdir is not writable: Permission denied"  # bad-input-chief's


def _wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + START_SECS
    while not path.exists():
        if time.monotonic() > deadline:
            print(f"{what} did not start within {START_SECS:g} s", flush=True)
            sys.exit(config_lib.EXIT_TIMEOUT)
        time.sleep(0.05)


def _ended(pid: int) -> bool:
    """Exited: gone, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def main() -> int:
    behaviour, marks = sys.argv[1], Path(sys.argv[2])
    parser = argparse.ArgumentParser()
    parser.add_argument("--role")
    parser.add_argument("--index", type=int)
    parser.add_argument("--worker-hosts")
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--restart-grace", type=float, default=5.0)
    parser.add_argument("--summary-json", type=Path)
    args, _ = parser.parse_known_args(sys.argv[3:])
    workers = len(args.worker_hosts.split(","))
    me = f"{args.role}-{args.index}"
    with open(marks / f"{me}-runs", "a") as runs:
        runs.write(f"{os.getpid()}\n")
    run = len((marks / f"{me}-runs").read_text().split())  # 1: the task's first process
    if run == 1:
        (marks / f"{me}.pid").write_text(str(os.getpid()))
    if args.role == "ps":
        if behaviour == "ps-dies-at-start" and run == 1:
            return config_lib.EXIT_PEER_LOST
        (marks / "ps-started").touch()
    if args.role == "worker" and args.index == 0:
        (marks / "chief-started").touch()
        if behaviour == "bad-input-chief":
            print(f"error: {BAD_INPUT}", flush=True)
            result = report.TaskResult(role="worker", index=0, mode="sync", error=BAD_INPUT,
                                       exit_code=config_lib.EXIT_USAGE)
            result.write_json(args.summary_json)
            return config_lib.EXIT_USAGE
    else:
        if args.role == "worker":
            _wait_for(marks / "ps-started", "the ps")
            if behaviour == "slow-replacement" and run > 1 and args.index == 1:
                time.sleep(3 * args.timeout)  # a start-up under load: importing TensorFlow
            print(f"[worker {args.index}] {report.WAITING_FOR_CHIEF}", flush=True)
        _wait_for(marks / "chief-started", "the chief")
    if behaviour == "preempted":
        return _preempted(args, workers)
    while behaviour in ("no-end", "bad-input-chief") or (behaviour == "hanging-ps"
                                                          and args.role == "ps"):
        time.sleep(3600)  # until the launcher stops it
    if args.role == "ps":
        if behaviour == "ps-dies-at-end":
            chief = int(_read_when_written(marks / "worker-0.pid"))
            while not _ended(chief):
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        return config_lib.EXIT_OK
    if behaviour == "timeout":
        return _fail(args, config_lib.EXIT_TIMEOUT,
                     f"worker {args.index}: waited {args.timeout:g} s for an update")
    if behaviour == "late-backup" and args.index == 2:
        chief = int(_read_when_written(marks / "worker-0.pid"))
        while not _ended(chief):
            time.sleep(0.05)
        return _fail(args, config_lib.EXIT_TIMEOUT,
                     "worker 2: waited 1 s for an update after local step 2; missing: ps 0 "
                     "(nothing listens at localhost:1)", missing=["ps 0"])
    if behaviour == "lost-backup" and args.index == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour in ("frozen-worker", "frozen-worker-waited") and run == 1:
        _wait_for_frozen_worker_1(args, marks)
        if behaviour == "frozen-worker":
            return _fail(args, config_lib.EXIT_TIMEOUT,
                         f"worker {args.index}: waited {args.timeout:g} s for an update after "
                         "local step 2; contributions so far [2, 2, 2]; missing: worker 1 (no "
                         "gradient for update 3)", missing=["worker 1"])
        print(f"[worker {args.index}] warning: waited {args.timeout:g} s for an update after "
              "local step 2; contributions so far [2, 2, 2]; missing: worker 1 (no gradient "
              f"for update 3); {report.WAITING_FOR_REPLACEMENT} worker 1, for up to "
              f"--restart-grace {args.restart_grace:g} s more", flush=True)
        runs_of_1 = marks / "worker-1-runs"
        deadline = time.monotonic() + args.restart_grace
        while len(runs_of_1.read_text().split()) < 2:
            if time.monotonic() > deadline:
                return _fail(args, config_lib.EXIT_TIMEOUT, f"worker {args.index}: no "
                             "replacement of worker 1", missing=["worker 1"])
            time.sleep(0.05)
    if behaviour == "slow-replacement":
        if run == 1:
            print(f"[worker {args.index}] step=2 global_step=2/4 loss=0.1 accuracy=0.9 "
                  f"examples_per_sec=100 contributions=[2, 2, 2]", flush=True)
            (marks / f"progress-{args.index}").touch()
            if args.index == 1:
                for other in range(workers):  # dies after the last progress line, not before
                    _wait_for(marks / f"progress-{other}", f"worker {other}'s progress")
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)
            runs_of_1 = marks / "worker-1-runs"
            deadline = time.monotonic() + START_SECS
            while len(runs_of_1.read_text().split()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(2 * args.timeout)  # waited for worker 1's replacement, still starting
            return _fail(args, config_lib.EXIT_TIMEOUT,
                         f"worker {args.index}: waited {args.timeout:g} s for an update after "
                         "local step 2; contributions so far [2, 2, 2]; missing: worker 1 (no "
                         "gradient for update 3)", missing=["worker 1"])
    if behaviour == "chatty":
        for line in range(10_000):
            print(f"[worker {args.index}] line {line} " + "x" * 200, flush=True)
    synchronous = behaviour != "not-synchronous"
    steps = 2
    # Not synchronous as in the question's replay: the chief gave every gradient.
    contributions = [steps] * workers if synchronous else \
        [steps * workers] + [0] * (workers - 1)
    lost = [2] if behaviour in ("lost-backup", "late-backup") else None
    result = report.TaskResult(
        role="worker", index=args.index, mode="sync", global_step=steps, target_steps=steps,
        local_steps=steps, replicas_to_aggregate=workers, contributions=contributions,
        pushed=list(contributions), dropped=[0] * workers, synchronous=synchronous, lost=lost,
        verdict=("synchronous (fake)" + ("; worker 2 lost after 2 pushes" if lost else ""))
        if synchronous else "NOT synchronous (fake)",
        finished_at=time.time())
    result.exit_code = config_lib.EXIT_OK if synchronous else config_lib.EXIT_NOT_SYNCHRONOUS
    result.write_json(args.summary_json)
    return result.exit_code


def _wait_for_frozen_worker_1(args, marks: Path) -> None:
    """Logs a progress line (training has begun: the launcher has seen the cluster make progress
    with worker 1 in it); worker 1 then stops itself until the launcher kills it, and the others
    wait --timeout for the update it holds up."""
    print(f"[worker {args.index}] step=2 global_step=2/4 loss=0.1 accuracy=0.9 "
          f"examples_per_sec=100 contributions=[2, 2, 2]", flush=True)
    if args.index == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    frozen = int(_read_when_written(marks / "worker-1.pid"))
    deadline = time.monotonic() + START_SECS
    while not _stopped(frozen) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(args.timeout)


def _preempted(args, workers: int) -> int:
    term = []
    signal.signal(signal.SIGTERM, lambda signum, frame: term.append(signum))
    print(f"[{args.role} {args.index}] ready for a SIGTERM", flush=True)
    deadline = time.monotonic() + START_SECS
    while not term:
        if time.monotonic() > deadline:
            return _fail(args, config_lib.EXIT_TIMEOUT, "no SIGTERM came")
        time.sleep(0.05)
    result = report.TaskResult(role=args.role, index=args.index, mode="sync", preempted_at=2,
                               exit_code=config_lib.EXIT_PREEMPTED)
    if args.role == "worker":
        result = report.TaskResult(
            role="worker", index=args.index, mode="sync", global_step=2, target_steps=4,
            local_steps=2, replicas_to_aggregate=workers, contributions=[2] * workers,
            pushed=[2] * workers, dropped=[0] * workers, synchronous=True, stop_step=2,
            preempted_at=2, verdict="synchronous (fake)", exit_code=config_lib.EXIT_PREEMPTED)
    result.write_json(args.summary_json)
    return config_lib.EXIT_PREEMPTED


def _read_when_written(path: Path) -> str:
    _wait_for(path, path.name)
    while not (text := path.read_text().strip()):
        time.sleep(0.05)
    return text


def _fail(args, code: int, error: str, missing: list[str] | None = None) -> int:
    """Ends as a real task that failed: its `error:` line, and a record with the error and, for
    a timeout, the peers it names as missing (the launcher reads the field, not the words)."""
    print(f"[{args.role} {args.index}] error: {error}", flush=True)
    report.TaskResult(role=args.role, index=args.index, mode="sync", error=error,
                      missing=missing, exit_code=code).write_json(args.summary_json)
    return code


if __name__ == "__main__":
    sys.exit(main())
