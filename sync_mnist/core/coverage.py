"""The data verdict: whether each example of a pass was given to exactly one worker, judged from
what every worker said it reads (its plan, published on ps 0) and from the ps's counters.

Pure arithmetic, no TensorFlow, like verdict.py. A worker's plan names each source it reads (a
file, or the rows in memory) with its part of it: [k, n], part k of n of its records (a file
cut by record: every n-th from k; rows in memory: a disjoint slice of a shared permutation), or
[0, 1], the whole source. A source is covered once when the parts that read it are 0, 1, ..., n-1
of one n: every worker's part distinct, together the whole. A source no worker reads, though a
worker's input lists it, is not covered; nor is one read whole by two workers.

The examples each worker used are the ps's: `accepted[w]` batches of `batch_size`, each fed one
applied update (the gradient verdict proves no update took a batch twice).

With --count-examples, the ps also counts each id's uses in the applied updates (sync.py's
example_uses), whatever the optimizer, and in which passes: each use adds 1 and 2**p, p the
pass of the batch that used it (its worker knows). `judge_ids` checks them: as many uses as
examples used (no use uncounted, none counted twice), and each id's uses as many as the bits of
its sum, which holds only where no pass used an id twice (two 2**p make a carry).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

WHOLE = (0, 1)
# --count-examples tells the passes apart up to this many: an id's 2**p summed in a float32
# stays a whole number (sync.example_uses_delta)
COUNTED_PASSES = 16
UNSEEN = "its input function cuts its data where the package cannot see (no .shard() in its " \
         "dataset, no file its graph lists)"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one worker reads of its input: how it is cut (the same words on every worker of a
    run), each source's part, and the files its input lists before any cut."""

    cut: str
    reads: dict[str, tuple[int, int]]
    listed: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"cut": self.cut, "reads": {k: list(v) for k, v in self.reads.items()},
                           "listed": list(self.listed)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        value = json.loads(text)
        return cls(value["cut"], {k: tuple(v) for k, v in value["reads"].items()},
                   tuple(value["listed"]))


@dataclasses.dataclass(frozen=True)
class DataVerdict:
    covered: bool | None  # None: not proved (a plan missing, or a cut the package cannot see)
    line: str


def judge(plans: Sequence[Plan | None], accepted: Sequence[int], batch_size: int) -> DataVerdict:
    """The data verdict of a run whose worker w published plans[w] (None: never published) and
    had accepted[w] of its batches averaged into applied updates."""
    used = _used(accepted, batch_size)
    missing = [w for w, p in enumerate(plans) if p is None]
    if missing:
        return DataVerdict(None, f"not proved: {_workers(missing)} published no reading plan; "
                                 f"{used}")
    cuts = sorted({p.cut for p in plans})
    if len(cuts) > 1:  # join.py refuses a mix before training; a plan is read back here
        return DataVerdict(False, "NOT covered once: the workers cut their input differently ("
                           + "; ".join(f"{_workers([w for w, p in enumerate(plans) if p.cut == c])}"
                                       f": {c}" for c in cuts) + f"); {used}")
    cut = cuts[0]
    readers: dict[str, dict[int, tuple[int, int]]] = {}
    for w, plan in enumerate(plans):
        for source, part in plan.reads.items():
            readers.setdefault(source, {})[w] = tuple(part)
    if not readers:
        return DataVerdict(None, f"not proved: {UNSEEN}; {used}")
    problems: dict[str, list[str]] = {}
    for source in sorted(readers):
        if (why := _not_once(readers[source])) is not None:
            problems.setdefault(why, []).append(source)
    unread = sorted({f for p in plans for f in p.listed} - set(readers))
    if unread:
        problems.setdefault("read by no worker", []).extend(unread)
    if problems:
        return DataVerdict(False, "NOT covered once: " + "; ".join(
            f"{_count(sources)} {why} ({_names(sources)})"
            for why, sources in problems.items()) + f" (cut {cut}); {used}")
    if len(readers) == 1 and (name := next(iter(readers))).startswith("<"):
        shared = f"{name[1:-1]}, cut into {len(readers[name])} disjoint parts, one a worker"
    else:
        shared = f"each of {_count(list(readers))} {_shared(readers)}"
    return DataVerdict(True, f"{shared}, covered once (cut {cut}); {used}")


def with_ids(data: DataVerdict, uses: np.ndarray, feature: str, accepted: Sequence[int],
             batch_size: int, most: int | None) -> DataVerdict:
    """`data` with the verdict of --count-examples' counts (uses[id]: its uses and its passes'
    bits, float, whole numbers) after it: False where they fail, else as `data` was."""
    ok, line = judge_ids(uses, feature, sum(accepted) * batch_size, most)
    return DataVerdict(False if not ok else data.covered, f"{data.line}; {line}")


def judge_ids(uses: np.ndarray, feature: str, examples: int,
              most: int | None) -> tuple[bool, str]:
    """(whether the counts hold, their line). uses[id] = (its uses, the sum of 2**p over them,
    p each use's pass from 0): `examples` used in the applied updates, each id at most once a
    pass (its uses as many as its bits: a pass that used it twice carries into another bit),
    and in none of the passes after `most` (--epochs; None: --train-steps)."""
    counts, bits = (np.rint(np.asarray(uses)[:, k]).astype(np.int64) for k in (0, 1))
    used = np.flatnonzero(counts)
    total = int(counts.sum())
    passes = [int(np.count_nonzero(bits[used] >> p & 1))
              for p in range(int(bits.max(initial=0)).bit_length())]
    full = (1 << len(passes)) - 1
    how = (f"each of {len(used):,} used exactly once in {_passes(len(passes))}"
           if len(used) and (bits[used] == full).all() else
           f"{len(used):,} used: " + ", ".join(f"{n:,} in pass {p + 1}"
                                              for p, n in enumerate(passes)))
    problems = []
    if total != examples:
        problems.append(f"{total:,} uses counted for {examples:,} examples used")
    twice = used[counts[used] != _bit_counts(bits[used])]
    if len(twice):
        problems.append(f"{len(twice):,} ids used twice in one pass ({_some(twice)})")
    if most is not None and len(passes) > most:
        late = used[bits[used] >> most > 0]
        problems.append(f"{len(late):,} ids used after the {_passes(most)} of --epochs {most} "
                        f"({_some(late)})")
    if problems:
        return False, f"NOT each once a pass: ids of {feature}: {how}; " + "; ".join(problems)
    return True, f"ids of {feature}: {how}; {total:,} uses, one for each example used"


def _passes(n: int) -> str:
    return "pass 1" if n == 1 else f"passes 1-{n}"


def _bit_counts(bits: np.ndarray) -> np.ndarray:
    return np.array([bin(b).count("1") for b in bits.tolist()], np.int64)


def _some(ids: np.ndarray) -> str:
    return f"id {', '.join(map(str, ids[:3].tolist()))}{' ...' if len(ids) > 3 else ''}"


def _not_once(parts: dict[int, tuple[int, int]]) -> str | None:
    """Why the parts the workers read of one source do not cover it once (None: they do)."""
    counts = {n for _, n in parts.values()}
    ks = sorted(k for k, _ in parts.values())
    if len(counts) == 1 and ks == list(range(next(iter(counts)))):
        return None
    return "read by " + ", ".join(f"worker {w} ({_part(part)})" for w, part in sorted(parts.items()))


def _part(part: tuple[int, int]) -> str:
    k, n = part
    return "whole" if (k, n) == WHOLE else f"part {k} of {n}"


def _shared(readers: dict[str, dict[int, tuple[int, int]]]) -> str:
    """How the sources were shared, where every one is covered once."""
    if all(len(parts) == 1 for parts in readers.values()):
        return "read whole by exactly one worker"
    return "read in disjoint parts by " + (
        "all its readers" if len({len(p) for p in readers.values()}) > 1 else
        f"{len(next(iter(readers.values())))} workers")


def _used(accepted: Sequence[int], batch_size: int) -> str:
    total = sum(accepted) * batch_size
    return (f"{total:,} examples used in applied updates ("
            + ", ".join(f"{a * batch_size:,}" for a in accepted) + " a worker)")


def _workers(ws: Sequence[int]) -> str:
    return ("worker " if len(ws) == 1 else "workers ") + ", ".join(map(str, ws))


def _count(sources: Sequence[str]) -> str:
    """"3 files", or "1 input" where a source is no file (rows in memory: named in <>)."""
    what = "input" if any(s.startswith("<") for s in sources) else "file"
    return f"{len(sources):,} {what}{'' if len(sources) == 1 else 's'}"


def _names(sources: Sequence[str], shown: int = 3) -> str:
    names = [s if s.startswith("<") else s.rsplit("/", 1)[-1] for s in sources[:shown]]
    return ", ".join(names) + (f" and {len(sources) - shown} more" if len(sources) > shown else "")
