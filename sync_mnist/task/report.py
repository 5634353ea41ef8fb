"""The result record every task returns and writes with --summary-json, and the launcher's table."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from sync_mnist.core import config as config_lib

# Logged by a non-chief worker just before it waits for the chief; the launcher starts the chief
# only once every other worker has said it, so both setups face the same start order.
WAITING_FOR_CHIEF = "waiting for the chief"
# Logged by a worker whose update waits past --timeout for other workers only, then the names
# ("worker 1, worker 2"): it waits --restart-grace more, and the launcher restarts those
# workers at once (replacements_wanted), not the ones that wait.
WAITING_FOR_REPLACEMENT = "waiting for the replacement of"
_REPLACEMENTS = re.compile(re.escape(WAITING_FOR_REPLACEMENT) + r" ((?:worker \d+)(?:, worker \d+)*)")


def replacements_wanted(line: str) -> list[str]:
    """The workers a WAITING_FOR_REPLACEMENT line names ("worker 1"), or none."""
    m = _REPLACEMENTS.search(line)
    return m[1].split(", ") if m else []


@dataclasses.dataclass
class TaskResult:
    role: str
    index: int
    mode: str
    global_step: int | None = None
    target_steps: int | None = None  # updates planned (sync); local steps per worker (async)
    replicas_to_aggregate: int | None = None
    local_steps: int | None = None  # this worker's steps; None on a ps
    contributions: list[int] | None = None  # accepted gradients per worker, read on the ps
    pushed: list[int] | None = None  # gradients each worker pushed
    dropped: list[int] | None = None  # pushed but never averaged (stale, or left at the end)
    solo_updates: int | None = None  # updates made of a single worker's gradients
    # Updates that averaged two or more gradients of one worker (the counter the verdict reads;
    # 0 in lockstep), so that a reader of the record need not parse the verdict.
    repeat_updates: int | None = None
    synchronous: bool | None = None
    verdict: str | None = None
    # The data verdict (core/coverage.py): whether each example of the input went to exactly one
    # worker (None: not proved), and its line.
    data_covered: bool | None = None
    data_verdict: str | None = None
    test_accuracy: float | None = None  # chief only
    test_loss: float | None = None  # chief only: mean loss on the evaluation data
    test_metrics: dict | None = None  # chief only: every eval_metric_ops value of the model
    dataset: str | None = None
    model: str | None = None  # --model: the SPEC it was given
    dataset_description: str | None = None
    ready_at: float | None = None  # unix time the training session was ready
    # The launcher, for a task it restarted: unix time its first life's session was ready (when
    # it read that life's `ready after` line); ready_at is then its last life's.
    first_ready_at: float | None = None
    finished_at: float | None = None  # unix time the last step returned
    startup_s: float | None = None  # process start to session ready
    chief_wait_s: float | None = None  # a non-chief's wait for the chief's initialisation
    train_s: float | None = None  # session ready to last step
    examples_per_sec: float | None = None
    blocked: bool = False  # still blocked at the end: released by its timeout, or stopped
    start_step: int | None = None  # the local step this worker started at (after any rejoin)
    rejoined: bool = False  # restarted into a running cluster; took its predecessor's token
    sessions: int | None = None  # sessions created; more than 1: a ps was lost and came back
    lost: list[int] | None = None  # workers the chief declared lost at the finish
    # Sync: the peers a bounded wait that expired was for ("worker N", "ps N"; TaskTimeout's
    # `missing`): the launcher restarts them rather than this task. It reads this field, never
    # the wording of `error`.
    missing: list[str] | None = None
    # The launcher: why it stopped this task after a verified run that did without it.
    spared: str | None = None
    restarts: int = 0  # times the launcher restarted this task (--max-restarts)
    peak_rss_mb: float | None = None  # this process's peak resident memory (ru_maxrss)
    # Sync: the global step after the update this worker's last push joined (its last token);
    # every worker of a synchronous run ends on the same one.
    last_token: int | None = None
    # Time to accuracy (early_stop.py), chief only: every --eval-every updates, a point
    # [global_step, seconds since training started, test accuracy, test loss].
    evaluations: list[list] | None = None
    # --eval-at-start, chief only: the model as training started, before the first update:
    # {"global_step": S, "loss": the mean loss, and the model's metrics}.
    evaluation_at_start: dict | None = None
    target_accuracy: float | None = None  # --target-accuracy
    time_to_target_s: float | None = None  # seconds to the first evaluation at or above it
    updates_to_target: int | None = None  # the global step of that evaluation
    accuracy_at_target: float | None = None  # its test accuracy
    stop_step: int | None = None  # the update the cluster stopped on (async: the stop's step)
    # Preemption (preemption.py): the update the cluster stopped on because a task was sent
    # SIGTERM or SIGUSR1; the chief saved it with --logdir. The task exits 143.
    preempted_at: int | None = None
    # Streamed input (core/stream.py), the cluster stopped where the first worker's input
    # ended: whether this worker's input had examples the run did not use (None: no such stop).
    input_left: bool | None = None
    # False: the ps did not take this worker's done report within --timeout, after the run was
    # complete and its verdict read (the ps then ends by its own bound); see finish.say_done.
    done_reported: bool | None = None
    # Chief: checkpoint saves that failed for want of room under --logdir, and the last one's
    # warning. The run trained on (the model is on the ps), so they leave its exit code alone.
    failed_saves: int = 0
    save_error: str | None = None
    # Chief: where it initialised the model from --warm-start-from, {"from": the checkpoint it
    # read, "variables": how many}; None when it initialised afresh, resumed or continued.
    warm_started: dict | None = None
    exit_code: int = config_lib.EXIT_OK
    error: str | None = None

    def record_counters(self, counters) -> None:
        """Takes the counters this task read from the ps (a verdict.Counters) into the record:
        the one place they are copied, for workers, the ps and the question's workers alike."""
        self.global_step = counters.global_step
        self.contributions, self.pushed = counters.accepted, counters.pushed
        self.dropped = counters.unused
        self.solo_updates, self.repeat_updates = counters.solo_updates, counters.repeat_updates

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write_json(self, path: Path) -> None:
        """Writes atomically, so a reader never sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)


def exit_code_for(result: TaskResult) -> int:
    """0 when the run did what its mode promises; 3 when sync training was not synchronous;
    4 when the data verdict found an example given to two workers or to none; 143 when a
    preemption stopped it before its end."""
    if result.exit_code != config_lib.EXIT_OK:
        return result.exit_code
    if result.mode == "sync" and result.synchronous is False:
        return config_lib.EXIT_NOT_SYNCHRONOUS
    if result.data_covered is False:
        return config_lib.EXIT_DATA_NOT_COVERED
    if result.preempted_at is not None:
        return config_lib.EXIT_PREEMPTED
    return config_lib.EXIT_OK


def format_table(results: list[TaskResult]) -> str:
    """Per-task table: when each worker was ready, its steps, and the counters read on the ps.

    A `restarts` column is added when the launcher restarted any task (--max-restarts).
    """
    workers = sorted((r for r in results if r.role == "worker"), key=lambda r: r.index)
    chief_ready = next((started(r) for r in workers if r.index == 0), None)
    restarts = any(r.restarts for r in results)
    lines = [f"{'task':<10}{'exit':>5}{format('restarts', '>9') if restarts else ''}{'ready':>9}"
             f"{'local steps':>13}{'pushed':>9}{'accepted':>10}{'unused':>8}{'examples/s':>12}"
             f"{'peak MB':>9}  note"]
    reading = latest_reading(results)

    def restarted(r: TaskResult) -> str:
        return f"{r.restarts:>9}" if restarts else ""

    for w in workers:
        i = w.index
        ready = (f"{started(w) - chief_ready:+.1f}s" if started(w) and chief_ready else "-")
        pushed = reading.pushed[i] if reading else None
        accepted = reading.contributions[i] if reading else None
        dropped = reading.dropped[i] if reading else None
        lines.append(f"{f'worker {i}':<10}{w.exit_code:>5}{restarted(w)}{ready:>9}"
                     f"{_fmt(w.local_steps):>13}{_fmt(pushed):>9}{_fmt(accepted):>10}"
                     f"{_fmt(dropped):>8}{_fmt(w.examples_per_sec, '.0f'):>12}"
                     f"{_fmt(w.peak_rss_mb, '.0f'):>9}  {_note(w, chief_ready)}")
    for p in sorted((r for r in results if r.role == "ps"), key=lambda r: r.index):
        lines.append(f"{f'ps {p.index}':<10}{p.exit_code:>5}{restarted(p)}{'':>61}"
                     f"{_fmt(p.peak_rss_mb, '.0f'):>9}  {_note(p)}")
    return "\n".join(lines)


def latest_reading(results: list[TaskResult]) -> TaskResult | None:
    """The worker whose counter reading came last, so saw the most.

    In the fixed setup every worker reads after the finish barrier, so all readings agree; in
    the question's setup the chief reads long before the blocked workers do.
    """
    readers = [r for r in results if r.role == "worker" and r.contributions is not None]
    return max(readers, key=lambda r: (r.finished_at or 0.0, -r.index), default=None)


def started(result: TaskResult) -> float | None:
    """When a worker was first ready: its first life's session, where the launcher restarted it
    (the `ready` column and ready_lag are the start-up's, not a restart's)."""
    return result.first_ready_at or result.ready_at


def _note(result: TaskResult, chief_ready: float | None = None) -> str:
    restart = _restart_note(result, chief_ready)
    note = _outcome_note(result)
    return "; ".join(n for n in (restart, note) if n)


def _restart_note(result: TaskResult, chief_ready: float | None) -> str:
    """A worker restarted after its first life was ready: when its last life was, and that its
    local steps are that life's while pushed and accepted count every life's (on the ps)."""
    if not (result.first_ready_at and result.ready_at):
        return ""
    again = (f" at {result.ready_at - chief_ready:+.1f}s" if chief_ready else "")
    since = f", from local step {result.start_step}" if result.start_step is not None else ""
    return (f"restarted: ready again{again}; local steps are its last life's{since}, pushed "
            "and accepted every life's")


def _outcome_note(result: TaskResult) -> str:
    if result.spared:
        return f"stopped after the verified run: {result.spared}"
    if result.blocked:
        return f"BLOCKED: {result.error}" if result.error else "BLOCKED"
    if result.error:
        return f"error: {result.error}"
    return f"{result.failed_saves} checkpoint saves failed" if result.failed_saves else ""


def _fmt(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


# The cluster record's keys that come straight from the latest counter reading, and from the
# chief's own record (None where there is none).
_READING_KEYS = ("global_step", "target_steps", "contributions", "pushed", "dropped", "verdict",
                 "solo_updates", "repeat_updates", "data_covered", "data_verdict")
_CHIEF_KEYS = ("mode", "test_accuracy", "test_loss", "test_metrics", "dataset",
               "dataset_description", "model",
               # time to accuracy: the chief's evaluations, and when the target was reached
               "target_accuracy", "time_to_target_s", "updates_to_target", "accuracy_at_target",
               "stop_step", "evaluations", "evaluation_at_start", "preempted_at")


def cluster_summary(results: list[TaskResult], tasks, wall: float) -> dict:
    """The whole cluster's record: the task keys (from the chief's reading) plus wall_s, tasks.

    `tasks` are the launcher's: each has role, index, restarts, pids, exited_at (unix time),
    spent and lost (launch._Task).
    """
    workers = sorted((r for r in results if r.role == "worker"), key=lambda r: r.index)
    chief = next((r for r in workers if r.index == 0), None)
    reading = latest_reading(results)
    # Sync: a worker the chief declared lost (a backup, R < N) has no verdict of its own; the
    # others' verdicts, read from the ps after the finish barrier, name it and stand for the run.
    lost = reading.lost if reading and reading.lost else []
    # Nor has a worker the launcher let go: one that died after the chief had verified the run
    # and ended (spent: its final reading cut short, say), or a backup it carried on without
    # (lost). The chief's verdict came after the finish barrier.
    let_go = [t.index for t in tasks if t.role == "worker" and (t.spent or t.lost)]
    judges = [r for r in workers if r.index not in lost and r.index not in let_go]
    verdicts = {r.verdict for r in workers if r.verdict}
    return {
        "role": "cluster", "index": None,
        **{key: getattr(reading, key) if reading else None for key in _READING_KEYS},
        **{key: getattr(chief, key) if chief else None for key in _CHIEF_KEYS},
        "local_steps": [r.local_steps for r in workers],
        # The verdict of the latest reading; the fixed setup's workers all read the same final
        # counters, so there a disagreement between tasks is itself a failure.
        "synchronous": bool(judges) and all(r.synchronous for r in judges),
        "verdicts_agree": len(verdicts) <= 1,
        "examples_per_sec": sum(r.examples_per_sec or 0 for r in workers),
        **_timings(workers, chief, tasks),
        "blocked": [f"{r.role} {r.index}" for r in results if r.blocked],
        # Sync: workers the chief declared lost at the finish, and the launcher's restarts.
        "lost": lost,
        "restarts": {f"{t.role} {t.index}": t.restarts for t in tasks if t.restarts},
        # Every process the launcher started for each task, in order (the last one is running
        # or ended the task): a tool that injects faults finds its victims here and in the
        # launcher's "started worker 1 (pid N)" lines.
        "pids": {f"{t.role} {t.index}": list(t.pids) for t in tasks},
        "wall_s": wall,
        "peak_rss_mb": max((r.peak_rss_mb for r in results if r.peak_rss_mb), default=None),
        "tasks": [r.to_dict() for r in results],
    }


def _timings(workers: list[TaskResult], chief, tasks) -> dict:
    """The cluster record's times: the slowest start-up and training, and the lags."""
    # Sync: each worker's first life (started): a restart is not a slow start-up.
    ready = [started(r) for r in workers if started(r)]
    chief_ready = started(chief) if chief else None
    finished = [r.finished_at for r in workers if r.finished_at]
    exits = [t.exited_at for t in tasks if t.exited_at]
    return {
        "startup_s": max((r.startup_s for r in workers if r.startup_s), default=None),
        "train_s": max((r.train_s for r in workers if r.train_s), default=None),
        # Sync: how long after the first worker the last was ready (the chief among them: a
        # late chief holds every other up), and how long after the last step the last process
        # exited.
        "ready_lag_s": max(ready) - min(ready) if ready else None,
        "ready_after_chief_s": [started(r) - chief_ready if started(r) else None
                                for r in workers] if chief_ready else None,
        "chief_wait_s": [r.chief_wait_s for r in workers],
        "exit_lag_s": max(exits) - max(finished) if exits and finished else None,
    }


def closing_lines(s: dict) -> str:
    """The lines after the table: the figures, the verification, and with --target-accuracy
    whether and when it was reached."""
    acc = "-" if s["test_accuracy"] is None else f"{s['test_accuracy']:.4f}"
    loss = "-" if s["test_loss"] is None else f"{s['test_loss']:.4f}"
    lag = "-" if s["ready_lag_s"] is None else f"{s['ready_lag_s']:.2f} s"
    exit_lag = "-" if s["exit_lag_s"] is None else f"{s['exit_lag_s']:.2f} s"
    verdict = s["verdict"] or "no verdict (training did not end)"
    return (f"global_step={s['global_step']} test_accuracy={acc} test_loss={loss} "
            f"model={s['model']}{'' if s['dataset'] is None else ' dataset=' + s['dataset']} "
            f"examples_per_sec={s['examples_per_sec']:.0f} wall={s['wall_s']:.1f} s "
            f"ready_lag={lag} exit_lag={exit_lag}\n{metrics_line(s)}"
            f"verification: {verdict}{data_line(s)}{target_line(s)}{preempted_line(s)}")


def data_line(s: dict) -> str:
    """The data verdict's closing line, where the run read one."""
    return f"\ndata: {s['data_verdict']}" if s.get("data_verdict") else ""


def metrics_line(s: dict) -> str:
    """The model's other evaluation metrics, if it has any besides accuracy (ctr's log-loss,
    AUC and the planted model's), as a line of their own."""
    others = {k: v for k, v in (s.get("test_metrics") or {}).items() if k != "accuracy"}
    if not others:
        return ""
    return "test_metrics: " + " ".join(f"{k}={v:.4f}" for k, v in sorted(others.items())) + "\n"


def preempted_line(s: dict) -> str:
    """After a preemption, a closing line: where the cluster stopped, and how to go on."""
    if s.get("preempted_at") is None:
        return ""
    planned = (f"{s['target_steps']} planned" if s.get('target_steps') is not None else
               "those planned")
    return (f"\npreempted: every worker stopped on update {s['preempted_at']} of {planned}; "
            "rerun with the same --logdir to resume there")


def target_line(s: dict) -> str:
    """With --target-accuracy, a third closing line: when it was reached, or that it was not."""
    target = s.get("target_accuracy")
    if target is None:
        return ""
    if s.get("updates_to_target") is None:
        points = s.get("evaluations") or []
        best = max(points, key=lambda p: p[2], default=None)
        return (f"\ntarget: test_accuracy {target:g} NOT reached in {s['global_step']} updates "
                f"({len(points)} evaluations" + (f", best {best[2]:.4f} at global_step {best[0]}"
                                                  if best else "") +
                "); training ran the planned length")
    stop = s.get("stop_step")
    if s.get("mode") == "async":
        how = f"the workers stopped, global_step {s['global_step']}"
    elif stop:
        how = f"every worker stopped on update {stop}" + (
            f" of {s['target_steps']} planned" if s.get("target_steps") is not None else "")
    else:
        how = "that was the planned end"
    return (f"\ntarget: test_accuracy {s['accuracy_at_target']:.4f} >= {target:g} at "
            f"global_step {s['updates_to_target']}, {s['time_to_target_s']:.1f} s into "
            f"training; {how}")
