"""The verdict: whether a run was synchronous, judged from the ps's counters alone.

Pure arithmetic, no TensorFlow: sync.py builds the counters into the graph, every task reads
them at the end (`Counters.read`), and `verify` says what they prove.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Counters:
    """A reading of SharedState, as plain numbers."""

    global_step: int
    pushed: list[int]
    accepted: list[int]
    repeat_updates: int
    solo_updates: int
    over_aggregated: int = 0

    @property
    def unused(self) -> list[int]:
        """Pushed gradients that no update averaged: dropped as stale, or left over at the end."""
        return [p - a for p, a in zip(self.pushed, self.accepted)]

    @classmethod
    def read(cls, session, state, **run_kwargs) -> Counters:
        """Reads sync.SharedState (its fields, in order) with session.run."""
        values = session.run(state, **run_kwargs)
        return cls(int(values.global_step), [int(v) for v in values.pushed],
                   [int(v) for v in values.accepted], int(values.repeat_updates),
                   int(values.solo_updates), int(values.over_aggregated))


@dataclasses.dataclass(frozen=True)
class Verdict:
    synchronous: bool  # every update averaged R gradients from R distinct workers, as planned
    as_promised: bool  # the run behaved as its mode promises (sync: synchronous; async: async)
    line: str


def verify(counters: Counters, *, mode: str, target_steps: int, replicas_to_aggregate: int,
           lost: Sequence[int] = ()) -> Verdict:
    """Judges a run from its counters alone. Pure: the same counters give the same verdict.

    `lost` lists the workers the chief declared lost at the end (dead or silent for
    --timeout): they are named with the pushes they made. A lost backup costs nothing; with
    R = N a worker can only be lost after its last push (otherwise training cannot end), so its
    contributions are complete and the verdict stands on the counters as for any run.
    """
    c, r = counters, replicas_to_aggregate
    n = len(c.accepted)
    lost_note = "".join(f"; worker {w} lost after {c.pushed[w]} push"
                        f"{'es' if c.pushed[w] != 1 else ''}" for w in sorted(lost))
    if mode == "async":
        total = sum(c.pushed)
        signature = c.global_step == total and c.accepted == c.pushed
        line = (f"asynchronous (--mode async): global_step {c.global_step} "
                f"{'=' if c.global_step == total else '!='} total local steps {total} "
                f"{c.pushed}; each update applied one worker's gradient alone")
        return Verdict(False, signature, line)
    problems = _problems(c, target_steps, r)
    if problems:
        return Verdict(False, False, "NOT synchronous: " + "; ".join(problems) + lost_note)
    return Verdict(True, True, _synchronous_line(c, r) + lost_note)


def _problems(c: Counters, target_steps: int, r: int) -> list[str]:
    """What keeps a sync-mode run with R = r from being synchronous (none: it is)."""
    n = len(c.accepted)
    problems = []
    if c.global_step != target_steps:
        problems.append(f"global_step {c.global_step} != {target_steps} planned")
    averaged = sum(c.accepted)
    # Each update averages R gradients, or more in the updates counted as over-aggregated
    # (with backups only: with R = N, more than N means some worker gave two).
    consistent = (averaged == r * c.global_step) == (c.over_aggregated == 0) and \
        averaged >= r * c.global_step + c.over_aggregated
    if not consistent or (r == n and averaged != r * c.global_step):
        problems.append(f"{averaged} gradients averaged, not {r} x {c.global_step}"
                        + (f" (+{c.over_aggregated} over-aggregated updates)"
                           if c.over_aggregated else ""))
    if r == n:
        off = [w for w, a in enumerate(c.accepted) if a != c.global_step]
        if off:
            problems.append(f"contributions {c.accepted} are not {c.global_step} for every worker "
                            f"(off: worker{'s' if len(off) > 1 else ''} "
                            f"{', '.join(map(str, off))})")
    if r == n and c.repeat_updates:
        # Lockstep promises one gradient per worker per update. With backups, SyncReplicas-
        # Optimizer averages the first R fresh gradients, whoever sent them: reported, not failed.
        problems.append(f"{c.repeat_updates} of {c.global_step} updates averaged more than one "
                        f"gradient of the same worker")
    if r == n and c.solo_updates:
        problems.append(f"{c.solo_updates} updates were made of a single worker's gradients")
    return problems


def _synchronous_line(c: Counters, r: int) -> str:
    """The verdict's line for a synchronous run: lockstep (R = N), or with backup workers."""
    n = len(c.accepted)
    if r == n:
        return (f"synchronous: each of {c.global_step} updates averaged exactly one gradient "
                f"from each of {n} workers; contributions {c.accepted}")
    unused = ", ".join(f"w{w} {u}" for w, u in enumerate(c.unused))
    # SyncReplicasOptimizer waits for R gradients but averages every fresh one that has
    # arrived by then, so an update can average more than R; say how often, not "exactly".
    extra = (f" ({c.over_aggregated} averaged more than {r}: {sum(c.accepted)} in all)"
             if c.over_aggregated else "")
    repeats = (f"; {c.repeat_updates} updates took two or more gradients from one worker"
               if c.repeat_updates else "")
    return (f"synchronous with {n - r} backup worker{'s' if n - r > 1 else ''}: each of "
            f"{c.global_step} updates averaged {'exactly' if not extra else 'at least'} "
            f"{r} fresh gradients{extra}; {sum(c.unused)} stale or left-over gradients "
            f"dropped ({unused}){repeats}")
