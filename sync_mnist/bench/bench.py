"""`sync-mnist-bench` (`make bench`): the synchronous PS cluster against its peers, one sitting.

Rows, for 1, 2 and 3 workers where they apply, all on synthetic data, the question's MLP,
Adam and batch 100 per worker:

  floor         the transport floor: a model's bytes pulled from a ps and a gradient's pushed
                back per step, no training (bench_tasks.py)
  single        one process, same model, optimizer, batch and feed_dict input (bench_tasks.py)
  async         the real cluster, --mode async
  sync          the real cluster, the fixed setup (proof counters on, as users run it)
  sync-files    the same, the ctr model reading its clicks from TFRecord files (--files)
  sync-count    the same, the ctr model with --count-examples (each click's number counted on
                the ps: bench/counted.py), named in --setups
  sync-bf16     the same with --wire-dtype bfloat16: every pull and push in half the bytes
  sync-2ps      the same with 2 ps tasks, the model split evenly between them
  sync-noproof  the same without the counters (hidden --bench-no-proof): the price of the proof
  mwms          TF2 MultiWorkerMirroredStrategy, RING all-reduce on CPU (bench_tasks.py)
  ddp           PyTorch DistributedDataParallel over gloo on the CPU (bench/ddp.py), the same
                model, optimizer, batch and data; needs the `ddp` extra (PyTorch), and is
                left out, saying so, where it is not installed

`--model ctr` runs the sparse click-through-rate model (models/ctr.py: a 1,000,000 x 16 table
on the ps, Adagrad, batch 100 per worker, its planted clicks) in the rows that can hold it:
async, sync, sync-2ps, mwms (the same model, each worker holding the whole table; the
table's gradient all-gathered, bench_tasks.run_mwms_ctr) and ddp (`nn.Embedding(sparse=True)`,
its sparse gradient all-reduced by DDP). Each row also gets the log-loss of
the trained model on the same 50,000 evaluation clicks, worker 0's figure after the run,
beside the planted model's; and the peak RSS of the largest ps and of the largest worker.
`--model ctr --files` adds sync-files: the same sync cluster reading the same 600,000 clicks
from TFRecord files (models/clicklog.py; written once into OUT/clicks-tfrecord) through the
package's streamed input, instead of from memory; its target is at least 0.95x the examples/s
of sync at 2 and 3 workers.

Every run is timed over a steady window: from worker 0's first progress line to its line at
90% of the steps, so start-up, graph registration and the finish are left out. CPU time is
that of every process of the run over the same window (/proc/<pid>/stat). Start-up is from
spawning the processes to worker 0 being ready to step; peak RSS is summed over the run's
processes (getrusage of each child). Each setup is run --repeats times, interleaved (with
--files, in the reverse order every other round), and the table shows the median and the
min-max spread of the repeats.

Exit codes: 0 every run finished; 1 some run failed (its row says why); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

log = logging.getLogger("sync_mnist.bench.bench")

SETUPS = ("floor", "single", "async", "sync", "sync-files", "sync-count", "sync-bf16",
          "sync-2ps", "sync-noproof", "mwms", "ddp")
SETUP_PS = {"sync-2ps": 2}  # ps tasks of a setup, where not 1
MODELS = ("mlp", "ctr")
CTR_SETUPS = ("async", "sync", "sync-2ps", "mwms", "ddp")  # the rows that run the sparse model
FILE_SETUPS = ("sync-files",)  # the ctr model from files: with --files, or named in --setups
COUNT_SETUPS = ("sync-count",)  # the ctr model with --count-examples: named in --setups
# Compared with sync at each worker count, run back to back with it (in_round, plan)
PAIRED = FILE_SETUPS + COUNT_SETUPS
FILES_DIR = "clicks-tfrecord"  # under --out: the click log sync-files reads, written once
BATCH = 100
RUN_TIMEOUT_SECS = 240.0  # one run, start to finish; then its processes are killed
WINDOW_END = 0.9  # the window ends at worker 0's progress line at this fraction of the steps
_STEP_LINE = re.compile(r"\bstep=(\d+) global_step=(\d+)")
_READY_LINE = re.compile(r"ready after|ready to step")
# Worker 0's evaluation (the PS chief's and bench_tasks.run_mwms_ctr's): the model's log-loss
# and the planted model's on the same evaluation clicks.
_LOG_LOSS = re.compile(r"\blog_loss=([0-9.]+)")
_PLANTED_LOG_LOSS = re.compile(r"\bplanted_log_loss=([0-9.]+)")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    workers: tuple[int, ...] = (1, 2, 3)
    setups: tuple[str, ...] = SETUPS
    repeats: int = 2
    steps: int = 400  # steps of worker 0 per run (async: local steps of each worker)
    log_every: int = 40  # progress lines of worker 0: the window's ticks
    out: Path = Path("bench-results")
    quick: bool = False
    profile: bool = False
    model: str = "mlp"  # or "ctr": the sparse model, in CTR_SETUPS only
    files: bool = False  # ctr: also sync-files, the clicks from TFRecord files


def setups_of(model: str) -> tuple[str, ...]:
    """The setups that can run `model`, in the table's order."""
    return CTR_SETUPS + PAIRED if model == "ctr" else tuple(
        s for s in SETUPS if s not in PAIRED)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sync-mnist-bench",
        description="Benchmark the synchronous PS cluster against a single process, async "
                    "training, the transport floor and MultiWorkerMirroredStrategy. Takes "
                    "about 12 minutes on 2 cores (--quick: about 2).")
    p.add_argument("--model", choices=MODELS, default="mlp",
                   help="mlp: the question's MLP with Adam; ctr: the sparse click-through-rate "
                        f"model (models/ctr.py), in the setups {','.join(CTR_SETUPS)} only, with "
                        "the log-loss of each run (default: mlp)")
    p.add_argument("--files", action="store_true",
                   help="with --model ctr: also sync-files, the sync cluster reading the same "
                        f"clicks from TFRecord files (written once into OUT/{FILES_DIR}), "
                        "beside sync from memory (default: off)")
    p.add_argument("--quick", action="store_true",
                   help="only the runs the targets compare (mlp: floor, single and sync with 1 "
                        "worker; async, sync, sync-noproof and mwms with 2; ctr: sync and mwms "
                        "with 2 and 3), 1 repeat, 200 steps (default: off)")
    p.add_argument("--workers", default=None,
                   help="comma-separated worker counts (default: 1,2,3)")
    p.add_argument("--setups", default=None,
                   help=f"comma-separated subset of {','.join(SETUPS)} (default: all the "
                        "model's)")
    p.add_argument("--repeats", type=int, default=None,
                   help="runs of each setup; the table shows their median and spread "
                        "(default: 2; --quick: 1)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps of worker 0 per run (default: 400; --quick: 200)")
    p.add_argument("--profile", action="store_true",
                   help="instead of the benchmark, trace one synchronous step (1 ps + 1 "
                        "worker; of --model) and the chief's update with FULL_TRACE: Chrome "
                        "traces and a summary in OUT/profile (default: off)")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="directory for bench.json and bench.png (default: bench-results)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    """The command line, validated; --quick changes the defaults, not explicit values."""
    p = _parser()
    args = p.parse_args(argv)
    quick = args.quick
    try:
        workers = _ints(args.workers) if args.workers else (() if quick else (1, 2, 3))
    except ValueError:
        p.error(f"--workers {args.workers!r} is not a comma-separated list of whole numbers")
    valid = setups_of(args.model)
    if args.files and args.model != "ctr":
        p.error("--files is for --model ctr (the click model from TFRecord files)")
    setups = tuple(args.setups.split(",")) if args.setups else tuple(
        s for s in valid if s not in COUNT_SETUPS and (args.files or s not in FILE_SETUPS))
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        p.error(f"--setups: unknown {','.join(unknown)} (choose from {','.join(SETUPS)})")
    other = [s for s in setups if s not in valid]
    if other:
        p.error(f"--setups: {','.join(other)} cannot run --model {args.model} (choose from "
                f"{','.join(valid)})")
    if "ddp" in setups and not torch_installed():
        if args.setups:
            p.error(f"--setups ddp needs PyTorch, which is not installed: {DDP_EXTRA}")
        setups = tuple(s for s in setups if s != "ddp")
    if any(w < 1 or w > 8 for w in workers):
        p.error(f"--workers {args.workers}: each count must be 1-8")
    repeats = args.repeats if args.repeats is not None else (1 if quick else 2)
    steps = args.steps if args.steps is not None else (200 if quick else 400)
    if repeats < 1:
        p.error(f"--repeats must be at least 1, got {repeats}")
    if steps < 20:
        p.error(f"--steps must be at least 20 (the window needs progress lines), got {steps}")
    return BenchConfig(workers=workers, setups=setups, repeats=repeats, steps=steps,
                       log_every=max(1, steps // 10), out=args.out, quick=quick,
                       profile=args.profile, model=args.model, files=args.files)


DDP_EXTRA = "pip install -e '.[ddp]' (make bench does)"


def torch_installed() -> bool:
    """Whether PyTorch can be imported, for the ddp row (not imported here)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


# --quick: the runs issue 8's targets compare, once each.
QUICK_PLAN = (("floor", 1), ("single", 1), ("sync", 1), ("async", 2), ("sync", 2),
              ("sync-noproof", 2), ("mwms", 2), ("ddp", 2))
# --model ctr --quick: the runs issue 36's target compares (sync against MWMS, 2 and 3 workers).
CTR_QUICK_PLAN = (("sync", 2), ("mwms", 2), ("ddp", 2), ("sync", 3), ("mwms", 3), ("ddp", 3))
# --model ctr --files --quick: the same, and the ctr model from files beside sync from memory.
CTR_FILES_QUICK_PLAN = (("sync", 2), ("sync-files", 2), ("mwms", 2), ("ddp", 2), ("sync", 3),
                        ("sync-files", 3), ("mwms", 3), ("ddp", 3))


def plan(config: BenchConfig) -> list[tuple[str, int]]:
    """(setup, workers) pairs to run, in order; `single` runs once per repeat (1 worker).

    --quick without --workers runs QUICK_PLAN, or CTR_QUICK_PLAN for the ctr model
    (restricted to --setups).
    """
    if config.quick and config.workers == ():
        quick = QUICK_PLAN if config.model != "ctr" else (
            CTR_FILES_QUICK_PLAN if config.files else CTR_QUICK_PLAN)
        return [(s, n) for s, n in quick if s in config.setups]
    pairs = []
    for setup in (s for s in SETUPS if s in config.setups):
        counts = (1,) if setup == "single" else config.workers
        pairs += [(setup, n) for n in counts]
    if any(s in PAIRED for s in config.setups):
        # From files (or counted) right after from memory at each worker count: the pairs the
        # targets compare run back to back, under the same load.
        pairs.sort(key=lambda pair: pair[1])
    return pairs


# ------------------------------------------------------------------------ measurements


@dataclasses.dataclass
class Sample:
    """One run of one setup."""

    setup: str
    workers: int
    updates: int | None = None  # updates (global steps) in the window
    examples: int | None = None  # examples trained in the window
    wall_s: float | None = None  # the window's length
    cpu_s: float | None = None  # CPU of every process of the run over the window
    ps_cpu_s: float | None = None  # of its ps tasks alone: the same work from memory or files
    startup_s: float | None = None
    peak_rss_mb: float | None = None  # summed over the run's processes
    ps_rss_mb: float | None = None  # the largest ps's peak RSS
    worker_rss_mb: float | None = None  # the largest worker's
    log_loss: float | None = None  # ctr: worker 0's evaluation after the run
    planted_log_loss: float | None = None  # the planted model's, same evaluation clicks
    error: str | None = None


def examples_per_update(setup: str, workers: int, batch: int = BATCH) -> int:
    """Examples one update trains on: every worker's batch in lockstep setups, one in async."""
    return batch if setup in ("single", "async") else batch * workers


@dataclasses.dataclass
class Row:
    setup: str
    workers: int
    runs: int
    examples_per_s: float | None = None
    examples_per_s_min: float | None = None
    examples_per_s_max: float | None = None
    updates_per_s: float | None = None
    ms_per_update: float | None = None
    ms_per_update_min: float | None = None
    ms_per_update_max: float | None = None
    cpu_ms_per_update: float | None = None
    cpu_ms_per_update_min: float | None = None
    cpu_ms_per_update_max: float | None = None
    vs_single: float | None = None  # examples/s over the single process's
    startup_s: float | None = None
    peak_rss_mb: float | None = None
    ps_rss_mb: float | None = None
    worker_rss_mb: float | None = None
    log_loss: float | None = None
    log_loss_min: float | None = None
    log_loss_max: float | None = None
    planted_log_loss: float | None = None
    errors: list[str] = dataclasses.field(default_factory=list)


def summarise(samples: Sequence[Sample]) -> list[Row]:
    """Median and min-max over the repeats of each (setup, workers); failed runs are listed."""
    groups: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.setup, s.workers), []).append(s)
    rows = []
    for (setup, workers), group in groups.items():
        good = [s for s in group if _measured(s)]
        row = Row(setup, workers, len(good), errors=[s.error for s in group if s.error])
        if good:
            eps = [_examples_per_s(s) for s in good]
            ms = [1000 * s.wall_s / s.updates for s in good]
            row.examples_per_s, row.examples_per_s_min, row.examples_per_s_max = _spread(eps)
            row.ms_per_update, row.ms_per_update_min, row.ms_per_update_max = _spread(ms)
            row.updates_per_s = statistics.median(s.updates / s.wall_s for s in good)
            cpu = [1000 * s.cpu_s / s.updates for s in good if s.cpu_s is not None]
            if cpu:
                (row.cpu_ms_per_update, row.cpu_ms_per_update_min,
                 row.cpu_ms_per_update_max) = _spread(cpu)
            row.startup_s = _median([s.startup_s for s in good])
            row.peak_rss_mb = _median([s.peak_rss_mb for s in good])
            row.ps_rss_mb = _median([s.ps_rss_mb for s in good])
            row.worker_rss_mb = _median([s.worker_rss_mb for s in good])
            losses = [s.log_loss for s in good if s.log_loss is not None]
            if losses:
                row.log_loss, row.log_loss_min, row.log_loss_max = _spread(losses)
            row.planted_log_loss = _median([s.planted_log_loss for s in good])
        rows.append(row)
    single = next((r.examples_per_s for r in rows if r.setup == "single"), None)
    for row in rows:
        if single and row.examples_per_s is not None:
            row.vs_single = row.examples_per_s / single
    order = {s: k for k, s in enumerate(SETUPS)}
    return sorted(rows, key=lambda r: (order.get(r.setup, len(order)), r.workers))


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def targets(rows: Sequence[Row], baseline_sync2: float | None = None) -> list[str]:
    """Issue 8's targets, as lines: each with the figures it compares."""
    by = {(r.setup, r.workers): r for r in rows}

    def eps(setup, n):
        row = by.get((setup, n))
        return row.examples_per_s if row else None

    lines = []
    sync2, async2, noproof2 = eps("sync", 2), eps("async", 2), eps("sync-noproof", 2)
    if sync2 and baseline_sync2:
        lines.append(f"sync 2 workers vs before the changes: {sync2 / baseline_sync2:.2f}x "
                     f"({sync2:,.0f} vs {baseline_sync2:,.0f} examples/s; target >= 1.6x)")
    if sync2 and async2:
        lines.append(f"sync / async, 2 workers: {sync2 / async2:.2f} (target >= 0.95)")
    if sync2 and noproof2:
        lines.append(f"price of the proof, 2 workers: {1 - sync2 / noproof2:+.1%} of throughput "
                     "(target <= 5%)")
    sync1, single, floor1 = by.get(("sync", 1)), by.get(("single", 1)), by.get(("floor", 1))
    if sync1 and single and floor1 and None not in (
            sync1.ms_per_update, single.ms_per_update, floor1.ms_per_update):
        bound = single.ms_per_update + floor1.ms_per_update
        lines.append(f"1 ps + 1 worker step: {sync1.ms_per_update:.2f} ms = "
                     f"{sync1.ms_per_update / bound:.2f}x compute + floor ({single.ms_per_update:.2f}"
                     f" + {floor1.ms_per_update:.2f} ms; target <= 1.3x)")
    mwms2, ddp2 = eps("mwms", 2), eps("ddp", 2)
    if sync2 and mwms2:
        lines.append(f"sync / MultiWorkerMirroredStrategy, 2 workers: {sync2 / mwms2:.2f}")
    if sync2 and ddp2:
        lines.append(f"sync / PyTorch DDP, 2 workers: {sync2 / ddp2:.2f}x ({sync2:,.0f} vs "
                     f"{ddp2:,.0f} examples/s; target >= 0.75x)")
    return lines


def ctr_targets(rows: Sequence[Row], samples: Sequence[Sample] = ()) -> list[str]:
    """Issue 36's and 58's targets, as lines: sync against MultiWorkerMirroredStrategy and
    against PyTorch DDP on the ctr model at each worker count from 2 that both ran, examples/s
    and log-loss side by side. (At 1 worker MWMS is one process with no all-reduce, a
    baseline and not the target.)"""
    by = {(r.setup, r.workers): r for r in rows}
    lines = []
    for n in sorted({r.workers for r in rows if r.workers >= 2}):
        sync, mwms, ddp = by.get(("sync", n)), by.get(("mwms", n)), by.get(("ddp", n))
        if not (sync and sync.examples_per_s):
            continue
        if mwms and mwms.examples_per_s:
            line = (f"sync / MultiWorkerMirroredStrategy, ctr, {n} workers: "
                    f"{sync.examples_per_s / mwms.examples_per_s:.2f}x "
                    f"({sync.examples_per_s:,.0f} vs {mwms.examples_per_s:,.0f} examples/s; "
                    "target >= 1.5x at equal or better log-loss)")
            if sync.log_loss is not None and mwms.log_loss is not None:
                line += (f"; log-loss {sync.log_loss:.4f} vs {mwms.log_loss:.4f}"
                         + (f", planted {sync.planted_log_loss:.4f}"
                            if sync.planted_log_loss is not None else ""))
            lines.append(line)
        if ddp and ddp.examples_per_s:
            line = (f"sync / PyTorch DDP, ctr, {n} workers: "
                    f"{sync.examples_per_s / ddp.examples_per_s:.2f}x "
                    f"({sync.examples_per_s:,.0f} vs {ddp.examples_per_s:,.0f} examples/s; "
                    f"target >= {DDP_CTR_TARGETS.get(n, 1.0):g}x)")
            if sync.log_loss is not None and ddp.log_loss is not None:
                line += f"; log-loss {sync.log_loss:.4f} vs {ddp.log_loss:.4f}"
            lines.append(line)
    return lines + files_targets(rows, samples) + files_targets(rows, samples, "sync-count")


# sync against DDP on the ctr model, by workers (issue 58)
DDP_CTR_TARGETS = {2: 1.0, 3: 1.3}

# The paired setups' target lines: what each is, against sync from memory
_PAIR_NAMES = {"sync-files": ("files / memory", "files", "memory"),
               "sync-count": ("--count-examples / without", "counted", "not")}


def files_targets(rows: Sequence[Row], samples: Sequence[Sample] = (),
                  setup: str = "sync-files") -> list[str]:
    """A paired setup's target, as lines: the ctr model from TFRecord files (sync-files, issue
    44), or with --count-examples (sync-count, issue 55), against sync from memory, at each
    worker count from 2 that both ran, with the spread of the repeats; given the samples, also
    each round's ratio (the k-th run of each, which the plan ran one after the other) and
    their median: the host's drift cancels within a round."""
    by = {(r.setup, r.workers): r for r in rows}
    lines = []
    for n in sorted({r.workers for r in rows if r.workers >= 2}):
        memory, files = by.get(("sync", n)), by.get((setup, n))
        if not (memory and files and memory.examples_per_s and files.examples_per_s):
            continue
        spread = [_range(r.examples_per_s_min, r.examples_per_s_max, ",.0f")
                  for r in (files, memory)]
        lines.append(
            f"{_PAIR_NAMES[setup][0]}, ctr, {n} workers: "
            f"{files.examples_per_s / memory.examples_per_s:.2f}x"
            f" ({files.examples_per_s:,.0f} {spread[0]} vs {memory.examples_per_s:,.0f} "
            f"{spread[1]} examples/s, {files.runs} and {memory.runs} runs; target >= 0.95x)")
        if len(rounds := round_ratios(samples, setup, "sync", n)) > 1:
            lines[-1] += (f"; round by round {', '.join(f'{r:.2f}x' for r in rounds)}: median "
                          f"{statistics.median(rounds):.2f}x")
        over = [workers_over_ps(samples, s, n) for s in (setup, "sync")]
        if None not in over:
            ours, theirs = _PAIR_NAMES[setup][1:]
            lines[-1] += (f"; the workers' CPU over the ps's (medians): {ours} {over[0]:.3f}, "
                          f"{theirs} {over[1]:.3f}: {100 * (over[0] / over[1] - 1):+.1f}%")
    return lines


def workers_over_ps(samples: Sequence[Sample], setup: str, n: int) -> float | None:
    """The median over the runs of `setup` at n workers of the workers' CPU over the ps's in
    the window. The ps does the same work an update from memory or from files, so this ratio
    cancels the host's speed, which drifts between runs; None without such runs."""
    ratios = [(s.cpu_s - s.ps_cpu_s) / s.ps_cpu_s for s in _runs(samples, setup, n)
              if _measured(s) and s.ps_cpu_s]
    return statistics.median(ratios) if ratios else None


def round_ratios(samples: Sequence[Sample], setup: str, baseline: str, n: int) -> list[float]:
    """examples/s of each run of `setup` at n workers over the baseline's run of the same round
    (the k-th of each); a round where either failed is left out."""
    return [_examples_per_s(a) / _examples_per_s(b)
            for a, b in zip(_runs(samples, setup, n), _runs(samples, baseline, n))
            if _measured(a) and _measured(b)]


def _runs(samples: Sequence[Sample], setup: str, n: int) -> list[Sample]:
    """The runs of `setup` at n workers, in the order they ran."""
    return [s for s in samples if s.setup == setup and s.workers == n]


def _measured(sample: Sample) -> bool:
    """Whether the run ended well and its window holds updates."""
    return sample.error is None and bool(sample.updates) and bool(sample.wall_s)


def _examples_per_s(sample: Sample) -> float:
    return sample.examples / sample.wall_s


def format_table(rows: Sequence[Row]) -> str:
    """The table on stdout: medians, with the min-max spread of the repeats; the log-loss
    columns where some row has one (the ctr model)."""
    losses = any(r.log_loss is not None for r in rows)
    head = (f"{'setup':<13}{'workers':>7}{'runs':>5}{'examples/s':>11} {'(min-max)':<15}"
            f"{'updates/s':>10}{'ms/update':>10} {'(min-max)':<12}{'CPU ms/upd':>11}"
            f"{'x single':>9}{'start s':>8}{'RSS MB':>8}{'ps MB':>7}{'wkr MB':>7}"
            + (f"{'log-loss':>9} {'(min-max)':<16}{'planted':>8}" if losses else ""))
    lines = [head]
    for r in rows:
        if r.examples_per_s is None:
            lines.append(f"{r.setup:<13}{r.workers:>7}{r.runs:>5}  failed: "
                         f"{'; '.join(r.errors) or 'no run'}")
            continue
        lines.append(
            f"{r.setup:<13}{r.workers:>7}{r.runs:>5}{r.examples_per_s:>11,.0f} "
            f"{_range(r.examples_per_s_min, r.examples_per_s_max, ',.0f'):<15}"
            f"{r.updates_per_s:>10,.0f}{r.ms_per_update:>10.2f} "
            f"{_range(r.ms_per_update_min, r.ms_per_update_max, '.2f'):<12}"
            f"{_fmt(r.cpu_ms_per_update, '.2f'):>11}{_fmt(r.vs_single, '.2f'):>9}"
            f"{_fmt(r.startup_s, '.1f'):>8}{_fmt(r.peak_rss_mb, ',.0f'):>8}"
            f"{_fmt(r.ps_rss_mb, ',.0f'):>7}{_fmt(r.worker_rss_mb, ',.0f'):>7}"
            + (f"{_fmt(r.log_loss, '.4f'):>9} "
               f"{_range(r.log_loss_min, r.log_loss_max, '.4f'):<16}"
               f"{_fmt(r.planted_log_loss, '.4f'):>8}" if losses else "")
            + (f"  ({len(r.errors)} failed)" if r.errors else ""))
    return "\n".join(lines)


def _range(lo, hi, spec: str) -> str:
    return "-" if lo is None else f"({format(lo, spec)}-{format(hi, spec)})"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def to_json(config: BenchConfig, rows: Sequence[Row], samples: Sequence[Sample],
            extra: dict | None = None) -> dict:
    return {
        "config": {**dataclasses.asdict(config), "out": str(config.out), "batch": BATCH},
        "rows": [dataclasses.asdict(r) for r in rows],
        "samples": [dataclasses.asdict(s) for s in samples],
        "targets": ctr_targets(rows, samples) if config.model == "ctr" else targets(rows),
        **(extra or {}),
    }


def plot(rows: Sequence[Row], path: Path, model: str = "mlp") -> str | None:
    """Throughput against workers, one line per setup; returns why not, if it cannot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[bench]'); no plot"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for setup in SETUPS:
        mine = [r for r in rows if r.setup == setup and r.examples_per_s is not None]
        if not mine:
            continue
        if setup == "single":
            ax.axhline(mine[0].examples_per_s, color="grey", linestyle="--",
                       label="single process")
            continue
        xs = [r.workers for r in mine]
        ys = [r.examples_per_s for r in mine]
        err = [[y - r.examples_per_s_min for y, r in zip(ys, mine)],
               [r.examples_per_s_max - y for y, r in zip(ys, mine)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3,
                    label="transport floor (N x batch per step)" if setup == "floor" else setup)
    ax.set_xlabel("workers")
    ax.set_ylabel("examples/s (median, min-max of repeats)")
    ax.set_xticks(sorted({r.workers for r in rows}))
    ax.set_title(f"sync_mnist bench, {model} model ({os.cpu_count()} CPUs)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


# ------------------------------------------------------------------------------ runs


class _Proc:
    """A child in its own process group; lines read as they come, CPU read from /proc."""

    def __init__(self, name: str, argv: list[str], env: dict, on_line=None, entry=None):
        self.name, self.lines, self.on_line = name, [], on_line
        self.exit_code: int | None = None
        self.maxrss_kb = 0
        self.final_ticks: int | None = None
        from sync_mnist.launcher import launch  # no orphans even if we are killed

        self.popen, self._reader = launch.spawn(argv, env, entry, os.getpid(), self._line)

    def _line(self, line: str) -> None:
        self.lines.append(line)
        if self.on_line:
            self.on_line(line)

    def reap(self) -> bool:
        """Collects the exit status and peak RSS once it has exited (wait4 gives both)."""
        if self.exit_code is not None:
            return True
        pid, status, usage = os.wait4(self.popen.pid, os.WNOHANG)
        if not pid:
            return False
        self.exit_code = os.waitstatus_to_exitcode(status)
        self.popen.returncode = self.exit_code
        self.maxrss_kb = usage.ru_maxrss
        # /proc/<pid> is gone once reaped: keep its final CPU time for later readings.
        self.final_ticks = round((usage.ru_utime + usage.ru_stime) * os.sysconf("SC_CLK_TCK"))
        self._reader.join(timeout=5)
        return True

    def cpu_ticks(self) -> int:
        """User + system CPU time so far, in clock ticks; the final figure once reaped."""
        if self.final_ticks is not None:
            return self.final_ticks
        try:
            fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0
        return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)

    def peak_rss_kb(self) -> int:
        """VmHWM while it runs (for tasks that are killed, not reaped with wait4)."""
        try:
            for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return self.maxrss_kb

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.exit_code is None:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def tail(self, n: int = 3) -> str:
        return " | ".join(self.lines[-n:])


def _task_argvs(setup: str, n: int, ps: list[str], workers: list[str],
                config: BenchConfig) -> list[tuple[str, list[str]]]:
    """(name, argv) of each process; worker 0 (the timer) first among the workers."""
    py = sys.executable
    steps, every = str(config.steps), str(config.log_every)
    hosts = ["--ps-hosts", ",".join(ps), "--worker-hosts", ",".join(workers)]
    own = [py, "-m", "sync_mnist.bench.tasks"]
    if setup == "single":
        return [("worker 0", own + ["single", "--steps", steps, "--log-every", every])]
    if setup in ("floor", "floor-packed"):
        packed = ["--packed"] if setup == "floor-packed" else []
        return [("ps 0", own + ["floor-ps", *hosts])] + [
            (f"worker {i}", own + ["floor-worker", "--index", str(i), *hosts, "--steps", steps,
                                   "--log-every", every, *packed]) for i in range(n)]
    if setup == "mwms":
        return [(f"worker {i}", own + ["mwms", "--index", str(i), "--worker-hosts",
                                       ",".join(workers), "--steps", steps,
                                       "--log-every", every, "--model", config.model])
                for i in range(n)]
    if setup == "ddp":
        return [(f"worker {i}", [py, "-m", "sync_mnist.bench.ddp", "--rank", str(i),
                                 "--worker-hosts", ",".join(workers), "--steps", steps,
                                 "--log-every", every, "--model", config.model])
                for i in range(n)]
    extra = {"async": ["--mode", "async"], "sync": [], "sync-2ps": [],
             "sync-files": ["--data-dir", str(config.out / FILES_DIR)],
             "sync-count": ["--model", "sync_mnist.bench.counted:CTR", "--count-examples",
                            "example", "--count-examples-ids", "1000000"],
             "sync-bf16": ["--wire-dtype", "bfloat16"],
             "sync-noproof": ["--bench-no-proof"]}[setup]
    data = ["--model", "ctr"] if config.model == "ctr" else ["--dataset", "synthetic"]
    common = [*hosts, *data, "--train-steps", steps, "--log-every", every,
              "--timeout", "120", *extra]
    return [(f"ps {i}", [py, "-m", "sync_mnist", "--role", "ps", "--index", str(i), *common])
            for i in range(len(ps))] + [
        (f"worker {i}", [py, "-m", "sync_mnist", "--role", "worker", "--index", str(i),
                         *common]) for i in range(n)]


def run_one(setup: str, n: int, config: BenchConfig, *, num_ps: int = 1,
            network=None) -> Sample:
    """Runs one setup once; every process is killed (by process group) before it returns.

    `network` (testbed.py, for scaling.py) puts each process in a namespace of its own, as
    launch.run_cluster's does; else every process is on localhost. The floor's and mwms's
    processes use one ps at most.
    """
    sample = Sample(setup, n)
    ps, workers = _hosts(n, num_ps, network)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    procs: list[_Proc] = []
    # (time, CPU ticks of every process, worker 0's step, global_step, CPU ticks of the ps)
    ticks: list[tuple[float, int, int, int, int]] = []
    ready: list[float] = []
    lock = threading.Lock()

    def on_timer_line(line: str) -> None:
        now = time.monotonic()
        match = _STEP_LINE.search(line)
        if match:
            with lock:
                cpu = [(p.name, p.cpu_ticks()) for p in procs]
                ps = sum(t for name, t in cpu if name.startswith("ps"))
                ticks.append((now, sum(t for _, t in cpu), int(match.group(1)),
                              int(match.group(2)), ps))
        elif not ready and _READY_LINE.search(line):
            ready.append(now)

    started = time.monotonic()
    try:
        with lock:
            for name, argv in _task_argvs(setup, n, ps, workers, config):
                role, index = name.split()
                procs.append(_Proc(name, argv, env,
                                   on_timer_line if name == "worker 0" else None,
                                   network.entry(role, int(index)) if network else None))
        sample.error = _wait_for_workers(setup, procs, started + RUN_TIMEOUT_SECS)
        _fill_rss(sample, procs)
    finally:
        for p in procs:
            p.kill()
    if sample.error is None:
        fill_window(sample, ticks, config.steps, os.sysconf("SC_CLK_TCK"))
        if ready:
            sample.startup_s = ready[0] - started
        chief = next(p for p in procs if p.name == "worker 0")
        sample.log_loss, sample.planted_log_loss = read_log_loss(chief.lines)
    return sample


def _hosts(n: int, num_ps: int, network) -> tuple[list[str], list[str]]:
    """(ps hosts, worker hosts) of one run: free ports on localhost, or `network`'s."""
    from sync_mnist.core import cluster as cluster_lib

    if network is None:
        ports = cluster_lib.free_ports(n + num_ps)
        return ([f"localhost:{p}" for p in ports[:num_ps]],
                [f"localhost:{p}" for p in ports[num_ps:]])
    ps, workers = (list(hosts) for hosts in network.hosts(num_ps, n))
    return ps, workers


def _wait_for_workers(setup: str, procs: list[_Proc], deadline: float) -> str | None:
    """Waits until every worker has ended (and a real ps has ended by itself, up to 15 s
    more); returns the run's error (a task that failed, or the deadline passed) or None."""
    error = None
    must_end = [p for p in procs if p.name.startswith("worker")]
    while not all(p.reap() for p in must_end):
        failed = next((p for p in procs if p.reap() and p.exit_code != 0), None)
        if failed:
            error = f"{failed.name} exited {failed.exit_code}: {failed.tail()}"
            break
        if time.monotonic() > deadline:
            error = f"not done after {RUN_TIMEOUT_SECS:g} s"
            break
        time.sleep(0.05)
    for p in procs:  # the real ps exits by itself once every worker has reported done
        if p.name.startswith("ps"):
            end = time.monotonic() + 15
            while setup != "floor" and not p.reap() and time.monotonic() < end:
                time.sleep(0.05)
    if error is None:
        bad = next((p for p in must_end if p.exit_code != 0), None)
        if bad:
            error = f"{bad.name} exited {bad.exit_code}: {bad.tail()}"
    return error


def _fill_rss(sample: Sample, procs: list[_Proc]) -> None:
    """The run's peak resident memory: the sum over its processes, the largest ps and
    worker."""
    peak = {p.name: (p.maxrss_kb if p.exit_code is not None else p.peak_rss_kb()) / 1024
            for p in procs}
    sample.peak_rss_mb = sum(peak.values())
    sample.ps_rss_mb = max((v for k, v in peak.items() if k.startswith("ps")), default=None)
    sample.worker_rss_mb = max(v for k, v in peak.items() if k.startswith("worker"))


def read_log_loss(lines: Sequence[str]) -> tuple[float | None, float | None]:
    """(log_loss, planted_log_loss) from worker 0's evaluation line, where it has one."""
    for line in reversed(lines):
        model, planted = _LOG_LOSS.search(line), _PLANTED_LOG_LOSS.search(line)
        if model and planted:
            return float(model.group(1)), float(planted.group(1))
    return None, None


def fill_window(sample: Sample, ticks: Sequence[tuple[float, int, int, int, int]], steps: int,
                clock_ticks: int) -> None:
    """Sets the sample's window from worker 0's progress-line readings (pure arithmetic).

    The window runs from the first reading to the last one at or before WINDOW_END of the
    steps: every worker is still training then, in async mode too.
    """
    if len(ticks) < 2:
        sample.error = f"only {len(ticks)} progress lines from worker 0"
        return
    first = ticks[0]
    inside = [t for t in ticks[1:] if t[2] <= WINDOW_END * steps] or [ticks[-1]]
    last = inside[-1]
    updates = last[3] - first[3]
    if updates <= 0:
        sample.error = f"global_step did not advance in the window ({first[3]} to {last[3]})"
        return
    sample.updates = updates
    sample.wall_s = last[0] - first[0]
    sample.cpu_s = (last[1] - first[1]) / clock_ticks
    sample.ps_cpu_s = (last[4] - first[4]) / clock_ticks
    sample.examples = updates * examples_per_update(sample.setup, sample.workers)


def click_files(config: BenchConfig) -> Path:
    """The click log sync-files reads: the ctr model's 600,000 + 50,000 clicks of seed 0 (what
    the other rows draw in memory), as TFRecords in 12 files under --out, written once, and
    again where an earlier run wrote them in an earlier format."""
    from sync_mnist.models import clickformat, clickwriter, ctr

    directory = config.out / FILES_DIR
    manifest = directory / clickformat.MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()).get("features") != list(
            clickformat.RECORD_KEYS):
        log.info("%s holds clicks of an earlier format: writing them again", directory)
        shutil.rmtree(directory)
    if not manifest.exists():
        log.info("writing the ctr model's clicks as TFRecords into %s, once (about a minute)",
                 directory)
        clickwriter.write(directory, {**ctr.PARAMS, "seed": 0}, model="ctr", kind="tfrecord",
                          compress=False, train_examples=ctr.PARAMS["train_examples"],
                          eval_examples=ctr.PARAMS["eval_examples"], train_files=12,
                          eval_files=1)
    return directory


def in_round(pairs: Sequence[tuple[str, int]], repeat: int) -> list[tuple[str, int]]:
    """The plan's pairs in the order of round `repeat` (from 0). With files, every other round
    runs each worker count's setups in reverse (memory, files; then files, memory), so that
    neither side of the files target always runs second, after the other's processes."""
    if repeat % 2 == 0 or not any(s in PAIRED for s, _ in pairs):
        return list(pairs)
    counts = list(dict.fromkeys(n for _, n in pairs))
    return [pair for n in counts for pair in reversed([p for p in pairs if p[1] == n])]


def run_all(config: BenchConfig) -> list[Sample]:
    samples = []
    pairs = plan(config)
    if any(s in FILE_SETUPS for s, _ in pairs):
        click_files(config)
    for repeat in range(config.repeats):
        for setup, n in in_round(pairs, repeat):  # interleaved: the machine's drift spreads out
            t = time.monotonic()
            sample = run_one(setup, n, config, num_ps=SETUP_PS.get(setup, 1))
            samples.append(sample)
            rate = (f"{sample.examples / sample.wall_s:,.0f} examples/s"
                    if sample.error is None else f"FAILED: {sample.error}")
            log.info("repeat %d/%d %s x%d: %s (%.0f s)", repeat + 1, config.repeats, setup, n,
                     rate, time.monotonic() - t)
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    # Ctrl-C and SIGTERM unwind through run_one's finally, which kills the runs' processes
    # (a shell's background job would otherwise ignore SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s [bench] %(message)s", datefmt="%H:%M:%S")
    if config.profile:
        from sync_mnist.bench import profiling as bench_profile

        return bench_profile.main(config.out / "profile", config.model)
    log.info("%s model, %d runs: %s x %d repeats, %d steps each; figures from a shared "
             "machine are indicative only", config.model, len(plan(config)) * config.repeats,
             ", ".join(f"{s} x{n}" for s, n in plan(config)), config.repeats, config.steps)
    if not torch_installed():
        log.info("ddp left out: PyTorch is not installed (%s)", DDP_EXTRA)
    started = time.monotonic()
    samples = run_all(config)
    rows = summarise(samples)
    config.out.mkdir(parents=True, exist_ok=True)
    result = to_json(config, rows, samples, {
        "wall_s": time.monotonic() - started,
        "load_average_at_end": os.getloadavg(),
        "cpus": os.cpu_count()})
    stem = "bench" if config.model == "mlp" else f"bench-{config.model}"
    (config.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(rows))
    for line in result["targets"]:
        print(line)
    why_not = plot(rows, config.out / f"{stem}.png", config.model)
    print(f"wrote {config.out / f'{stem}.json'}" +
          (f"; {why_not}" if why_not else f" and {config.out / f'{stem}.png'}"))
    print(f"took {result['wall_s']:.0f} s; load average at the end "
          f"{result['load_average_at_end'][0]:.1f} on {result['cpus']} CPUs")
    return 1 if any(s.error for s in samples) else 0


if __name__ == "__main__":
    sys.exit(main())
