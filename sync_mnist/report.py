"""The result record every task returns and writes with --summary-json, and the launcher's table."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from sync_mnist import config as config_lib


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
    synchronous: bool | None = None
    verdict: str | None = None
    test_accuracy: float | None = None  # chief only
    dataset: str | None = None
    dataset_description: str | None = None
    ready_at: float | None = None  # unix time the training session was ready
    finished_at: float | None = None  # unix time the last step returned
    startup_s: float | None = None  # process start to session ready
    train_s: float | None = None  # session ready to last step
    examples_per_sec: float | None = None
    exit_code: int = config_lib.EXIT_OK
    error: str | None = None

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
    """0 when the run did what its mode promises; 3 when sync training was not synchronous."""
    if result.exit_code != config_lib.EXIT_OK:
        return result.exit_code
    if result.mode == "sync" and result.synchronous is False:
        return config_lib.EXIT_NOT_SYNCHRONOUS
    return config_lib.EXIT_OK


def format_table(results: list[TaskResult]) -> str:
    """Per-worker table: local steps, pushed, accepted and unused gradients."""
    workers = sorted((r for r in results if r.role == "worker"), key=lambda r: r.index)
    lines = [f"{'task':<10}{'exit':>5}{'local steps':>13}{'pushed':>9}{'accepted':>10}"
             f"{'unused':>8}{'examples/s':>12}"]
    # Every task reads the same counters on the ps after the finish barrier; take the chief's
    # reading (or any task's) for the per-worker columns.
    reading = next((r for r in results if r.contributions is not None), None)
    for w in workers:
        i = w.index
        pushed = reading.pushed[i] if reading else None
        accepted = reading.contributions[i] if reading else None
        dropped = reading.dropped[i] if reading else None
        lines.append(f"{f'worker {i}':<10}{w.exit_code:>5}{_fmt(w.local_steps):>13}"
                     f"{_fmt(pushed):>9}{_fmt(accepted):>10}{_fmt(dropped):>8}"
                     f"{_fmt(w.examples_per_sec, '.0f'):>12}")
    for p in sorted((r for r in results if r.role == "ps"), key=lambda r: r.index):
        lines.append(f"{f'ps {p.index}':<10}{p.exit_code:>5}")
    return "\n".join(lines)


def _fmt(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)
