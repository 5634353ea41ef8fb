"""Scale on paper, checked against runs (issue 12, part 4): a model of one synchronous update.

    python -m lab.scaling measure --out scaling-results          # the costs (~1-2 min)
    python -m lab.scaling sweep --costs scaling-results/costs.json --out scaling-results
    python -m lab.scaling recheck --costs scaling-results/costs.json --out scaling-results
    python -m lab.scaling predict --costs scaling-results/recheck.json --workers 8,32,100

`measure` takes the model's inputs on this machine (the benchmark's own runs, bench.py):
  t_single     one process: forward + backward + Adam at batch 100 (bench's `single` row)
  t_update     the ps's update: take the averaged gradient from the accumulators, apply Adam
  t_accum      the ps's work per gradient pushed: add it into the accumulators
  t_rpc        per tensor moved between two namespaces: the transport floor moving the model
               as 6 tensors each way (bench's `floor`) against 1 each way (`floor-packed`);
               a step moves one each way per ps (model.pulled, sync.to_ps)
  c_byte       per byte between two namespaces, uncapped: the packed floor, less its RPCs
  cpu_floor    CPU seconds (every process) per floor step: what moving the bytes costs cores
  efficiency   goodput over the tbf rate: the packed floor again, both ends' links capped
The last three run in a testbed (testbed.py), so root is needed.

The model (`predict`), per update, for N workers, P ps tasks and a link rate r (or none):
  B            the trainable bytes every worker pulls each step (1.08 MB); B_p: those on
               ps p, as --ps P places them (one slice of every
               variable per ps, read from the real graph, `partition`)
  s            bytes each pull and each push moves per byte of the float32 variables: 1, or
               0.5 with --wire-dtype bfloat16 (wire_share); B and B_p below are s times
               the variables' bytes
  t_fb         = t_single - t_update: a worker's forward and backward pass
  ps(p)        = (t_update + N t_accum) B_p / B: ps p's work per update
  fixed        = t_fb + 2 t_rpc + 2 B c_byte + max_p ps(p) + t_sync + (P - 1) t_ps_extra:
               the part of a step that is not the wire: compute, one pull and one push per
               ps (the ps tasks in parallel), the ps's work, and a fixed overhead t_sync (the
               token, the counters, one RunGraph per task), calibrated on the 1-worker 1-ps
               uncapped wall time; each ps beyond the first adds t_ps_extra (its RunGraph
               calls and the hops between ps tasks; fitted over every 1-worker uncapped
               point, a line through the origin against P - 1)
  latency      = fixed + 2 wire(B): one worker's step, its pull and push through its own link
               one after the other
  link         = fixed + 2 wire(N B_x) - overlap (wire(N B_x) - wire(B_x)), B_x = max_p B_p:
               the busiest ps's link sends every worker's pull and receives every push, the
               two directions of a full-duplex link, and idles while the rest of the step
               runs. overlap 0: every pull ends before any push starts (they start together,
               from the same update's tokens, and share the link), so the directions take
               turns; overlap 1: only the last worker's push cannot run beside another's
               pull. Calibrated on the capped 1-ps point with the most workers
  wire(S)      = 8 (S - burst) / (r eff): S bytes through tbf at rate r, less the bucket
               (testbed.TBF_BURST_BYTES, 0 between real hosts) that refills in between
  work(N)      = N (cpu_step + (P - 1) cpu_ps_step [+ 2 B cpu_capped]) + (P - 1) cpu_ps_extra
               + sum_p ps(p): CPU seconds per update of every task (only work(N) - work(1),
               the other workers' share, enters T below). cpu_step, a worker step's
               CPU with the transport and the sync machinery, from the 1-worker point's CPU
               (less the ps's work); uncalibrated, t_fb + cpu_floor. What each ps beyond the
               first costs, fitted like t_ps_extra, split into per update (cpu_ps_extra) and
               per worker step (cpu_ps_step) by the same fit at the most workers run
               uncapped on 1 ps and on more (`calibrate`). The bracket only where links are
               capped: moving a byte through a tbf-capped link costs more CPU than through
               an uncapped one (both ends; the capped floor against the packed one, both
               measured)
  T(N, P, r)   = max(latency, link) between hosts of their own (cores=None). On ONE machine
               the other workers' CPU, o = (work(N) - work(1)) / cores, competes with the
               step's own CPU-bound part: at a share o / T of the cores busy, `fixed` takes
               fixed / (1 - o / T), so T = W + fixed / (1 - o / T), W = max(latency, link)
               - fixed: the larger root of T^2 - (W + o + fixed) T + W o = 0. With no wire,
               T = fixed + o (the `cpu` term); with no other work, T = max(latency, link).
               The largest of latency, link and cpu names the bottleneck.
`sweep` runs the real synchronous cluster (bench.run_one's steady window, synthetic data) in a
testbed at each (N, P, cap), --repeats times in rounds, and prints the model's T next to each
point's median and spread. Each row also keeps each task's share of the cores over the middle of
its runs (/proc, `task_cores`).

`sweep --model ctr` runs the sparse model (models/ctr.py, `--model ctr`) instead of the MLP.
There B is not the trainable bytes (the 64 MB table never crosses whole) but what a worker step
moves, measured with the real graph and session (sparse_bytes.py, the default run's 1,000,000
rows and 200 ids a field): for each ps the mean of its two directions, which, summed, is what
the model's two wire phases carry. The other costs are the MLP's from --costs; calibrate them
on the ctr's own uncapped points (docs/scaling.md, "The sparse model").

Exit codes: 0 done; 1 a run failed (its row says so); 2 bad arguments, or no testbed (root,
ip, tc) for measure and sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

from sync_mnist.core import config as config_lib
from sync_mnist.bench import bench
from lab import ROOT, testbed

log = logging.getLogger("lab.scaling")

BATCH = 100
DEFAULT_CAP = "200mbit"  # slow enough to matter at 1 ps, fast enough for short runs
ACCUM_REPS = 50  # ps work measured over this many updates
MODELS = ("mlp", "ctr")  # what the sweep's tasks train: the question's MLP, or models/ctr.py
TASK_CPU_EVERY = 0.25  # seconds between readings of every task's CPU time
CTR_BYTES_TIMEOUT_SECS = 300.0  # sparse_bytes.py, one ps count


@dataclasses.dataclass(frozen=True)
class Costs:
    """The model's inputs, in seconds (c_byte: seconds per byte), as `measure` found them."""

    t_single: float
    t_update: float
    t_accum: float
    t_rpc: float
    c_byte: float
    cpu_floor: float
    efficiency: float = 1.0  # goodput / tbf rate
    t_sync: float = 0.0  # calibrated: see the module docstring
    cpu_step: float = 0.0  # calibrated: CPU s per worker step in the real cluster (0: unknown)
    t_ps_extra: float = 0.0  # calibrated: latency per update of each ps beyond the first
    cpu_ps_extra: float = 0.0  # calibrated: CPU per update of each ps beyond the first
    cpu_ps_step: float = 0.0  # calibrated: and per worker step (0: all of it per update)
    # calibrated: how far the pushes overlap other workers' pulls on a ps's full-duplex link,
    # 0 (every pull ends before any push starts) to 1 (each push beside the next pull)
    overlap: float = 0.0
    # CPU s per byte moved through a capped (tbf) link, beyond what an uncapped one costs:
    # the capped floor's CPU against the packed floor's, both ends of a pull and a push
    cpu_capped: float = 0.0
    cores: int = 2
    bytes_total: int = 0  # B
    tensors_total: int = 0  # K

    @property
    def t_fb(self) -> float:
        return max(0.0, self.t_single - self.t_update)


@dataclasses.dataclass(frozen=True)
class Prediction:
    total: float
    latency: float
    link: float
    cpu: float

    @property
    def bottleneck(self) -> str:
        return max(("latency", "link", "cpu"), key=lambda k: getattr(self, k))


def predict(costs: Costs, num_workers: int, bytes_per_ps: Sequence[int], *,
            rate_bits: float | None = None, cores: int | None = None,
            burst: int = 0, wire_share: float = 1.0) -> Prediction:
    """T(N, P, r): seconds per synchronous update (see the module docstring for each term).

    Args:
      costs: measured on this machine.
      num_workers: N.
      bytes_per_ps: B_p for each ps task (P = its length); they sum to B.
      rate_bits: every link's tbf rate in bits/s; None: uncapped.
      cores: cores shared by every task (one machine); None: each task on its own host.
      burst: tbf's bucket in bytes (testbed.TBF_BURST_BYTES in a testbed): each phase's first
        `burst` bytes pass at once, as the bucket refills while the other direction works.
      wire_share: bytes each pull and push moves per byte of bytes_per_ps: 1 in float32,
        0.5 with --wire-dtype bfloat16.
    """
    bytes_per_ps = [b * wire_share for b in bytes_per_ps]  # as they cross
    n, total = num_workers, sum(bytes_per_ps)
    if n < 1 or not bytes_per_ps or total <= 0:
        raise ValueError(f"need N >= 1 and ps bytes, got N={n}, bytes {list(bytes_per_ps)}")
    share = [b / total for b in bytes_per_ps]
    ps = [(costs.t_update + n * costs.t_accum) * s for s in share]
    def wire(nbytes: float) -> float:  # one phase (a pull, or a push) through one link
        return 8 * max(0.0, nbytes - burst) / (rate_bits * costs.efficiency) if rate_bits \
            else 0.0

    more_ps, busiest = len(bytes_per_ps) - 1, max(bytes_per_ps)
    # The part of a step that is not the wire: compute, the transfers' fixed and per-byte
    # costs, the ps's work, the token hand-out and counters (t_sync), and each further ps's
    # RunGraph calls and hops. One pull and one push per ps, the ps tasks in parallel
    # (model.pulled, sync.to_ps).
    fixed = (costs.t_fb + 2 * costs.t_rpc + 2 * total * costs.c_byte + max(ps) + costs.t_sync
             + more_ps * costs.t_ps_extra)
    latency = fixed + 2 * wire(total)  # a worker's own link: its pull, then its push
    # The busiest ps's link sends every worker's pull and receives every push: two directions
    # of a full-duplex link. overlap 0: the pulls all end before the pushes start (they share
    # the link from the same token), so one direction waits for the other; overlap 1: only
    # the last worker's push cannot run beside a pull. The link idles while the rest runs.
    link = fixed + 2 * wire(n * busiest) - costs.overlap * (wire(n * busiest) - wire(busiest))
    # A worker step's CPU, with each further ps's share of it (cpu_ps_step; its once-per-
    # update part, cpu_ps_extra, is in one worker's step like the rest of `fixed`).
    per_step = (costs.cpu_step or costs.t_fb + costs.cpu_floor) + more_ps * costs.cpu_ps_step
    if rate_bits:  # every worker's pull and push, through capped links at both ends
        per_step += 2 * total * costs.cpu_capped
    if not cores:
        return Prediction(total=max(latency, link), latency=latency, link=link, cpu=0.0)
    # On one machine the other N - 1 workers' steps (and their pushes into the accumulators)
    # compete for the cores with the step's own CPU-bound part (`fixed`): at a share u of the
    # cores busy with them, that part takes fixed / (1 - u), and u = o / T. With the wire's
    # part W = max(latency, link) - fixed, T = W + fixed / (1 - o / T): the larger root of
    # T^2 - (W + o + fixed) T + W o = 0. With no wire, T = fixed + o (the cores' bound); with
    # no other work, T = W + fixed. What a ps costs once per update is in every T alike.
    o = (n - 1) * (per_step + costs.t_accum) / cores
    w = max(latency, link) - fixed
    b = w + o + fixed
    total_s = (b + math.sqrt(b * b - 4 * w * o)) / 2
    return Prediction(total=total_s, latency=latency, link=link, cpu=fixed + o)


def overlap_from(costs: Costs, num_workers: int, bytes_per_ps: Sequence[int], measured: float,
                 *, rate_bits: float, burst: int = 0, wire_share: float = 1.0) -> float:
    """The overlap (0-1) that makes a point's predicted link time its measured update time.

    Only a point whose link is the bottleneck with no overlap says anything about it; any
    other returns the overlap the costs already have.
    """
    none = dataclasses.replace(costs, overlap=0.0)
    full = dataclasses.replace(costs, overlap=1.0)
    kw = dict(rate_bits=rate_bits, burst=burst, wire_share=wire_share)
    at_none = predict(none, num_workers, bytes_per_ps, **kw)
    at_full = predict(full, num_workers, bytes_per_ps, **kw)
    if at_none.bottleneck != "link" or at_none.link <= at_full.link:
        return costs.overlap
    return min(1.0, max(0.0, (at_none.link - measured) / (at_none.link - at_full.link)))


def ps_needed(costs: Costs, num_workers: int, rate_bits: float, *, max_ps: int = 64,
              within: float = 0.1, wire_share: float = 1.0) -> int:
    """The fewest ps tasks whose update time is within `within` of the best up to max_ps.

    Each task on its own host, the model split evenly over the ps tasks, as --ps K does
    (one slice of every variable per ps; see `partition`).
    """
    times = [predict(costs, num_workers, [costs.bytes_total / p] * p, rate_bits=rate_bits,
                     wire_share=wire_share).total for p in range(1, max_ps + 1)]
    best = min(times)
    return next(p for p, t in enumerate(times, start=1) if t <= (1 + within) * best)


# ------------------------------------------------------------------------ measurements


def partition(num_ps: int, num_workers: int = 1) -> tuple[list[int], list[int]]:
    """Trainable bytes and tensors on each ps task, from the real worker graph (no session)."""
    import tensorflow as tf

    from sync_mnist.core import cluster as cluster_lib
    from sync_mnist.models import data
    from sync_mnist.core import tfcompat
    from sync_mnist.task.graph import build_graph
    from sync_mnist.core.config import TaskConfig, TrainConfig
    from sync_mnist.models import mlp

    tfcompat.graph_mode(verbose=False)
    # Without a session the optimizer's ops go unused, which TensorFlow reports at exit.
    tf.get_logger().setLevel(logging.CRITICAL)
    layout = cluster_lib.ClusterLayout.parse(
        ",".join(f"ps{i}:2222" for i in range(num_ps)),
        ",".join(f"w{i}:2222" for i in range(num_workers)))
    config = TaskConfig(role="worker", index=0, cluster=layout,
                        train=TrainConfig(train_steps=10, params={"dataset": "synthetic"}))
    nbytes, tensors = [0] * num_ps, [0] * num_ps
    with tf.Graph().as_default():
        dataset = data.make_synthetic(0)
        build_graph(config, mlp.MODEL, (dataset.train_images[:1], dataset.train_labels[:1]))
        for v in tf.compat.v1.trainable_variables():
            p = tf.DeviceSpec.from_string(v.device).task
            nbytes[p] += v.shape.num_elements() * v.dtype.size
            tensors[p] += 1
    return nbytes, tensors


def measure_ps_work(reps: int = ACCUM_REPS) -> tuple[float, float]:
    """(t_accum, t_update) in one plain process: the ps's ops on the model's variables.

    Gradients go into one ConditionalAccumulator per variable (as SyncReplicasOptimizer's
    do); an update takes their average and applies Adam. No RPC: that is the floor's part.
    """
    import numpy as np
    import tensorflow as tf

    from sync_mnist.core import tfcompat
    from sync_mnist.models import mlp

    tfcompat.graph_mode(verbose=False)
    tf.get_logger().setLevel(logging.CRITICAL)  # as in partition: graph_mode resets it
    tf1 = tf.compat.v1
    shapes = mlp.variable_shapes()
    with tf.Graph().as_default() as graph:
        params = [tf1.get_variable(f"w{k}", s) for k, s in enumerate(shapes)]
        grads = [tf.constant(np.random.default_rng(k).normal(size=s).astype("float32"))
                 for k, s in enumerate(shapes)]
        accs = [tf1.ConditionalAccumulator(tf.float32, shape=s) for s in shapes]
        # local_step far ahead of the accumulators' own step, so no gradient counts as stale
        push = tf.group(*[a.apply_grad(g, local_step=2**40) for a, g in zip(accs, grads)])
        taken = [a.take_grad(1) for a in accs]
        update = tf1.train.AdamOptimizer(0.001).apply_gradients(zip(taken, params))
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for _ in range(5):  # warm-up
            sess.run(push)
            sess.run(update)
        pushing, updating = [], []
        for _ in range(reps):
            t = time.perf_counter()
            sess.run(push)
            pushing.append(time.perf_counter() - t)
            t = time.perf_counter()
            sess.run(update)
            updating.append(time.perf_counter() - t)
    return statistics.median(pushing), statistics.median(updating)


def _bench_config(steps: int, model: str = "mlp") -> bench.BenchConfig:
    return bench.BenchConfig(workers=(1,), setups=(), repeats=1, steps=steps,
                             log_every=max(1, steps // 10), out=Path("."), model=model)


def _seconds_per_update(sample) -> float:
    if sample.error:
        raise RuntimeError(f"{sample.setup} x{sample.workers}: {sample.error}")
    return sample.wall_s / sample.updates


def measure(steps: int = 200, cap: str = DEFAULT_CAP) -> dict:
    """Every input of the model, measured here; a JSON-ready dict (the Costs and the raw runs)."""
    config = _bench_config(steps)
    t_single = _seconds_per_update(bench.run_one("single", 1, config))
    log.info("single process: %.2f ms per step", 1000 * t_single)
    floor = {}
    for name, links in (("floor", None), ("floor-packed", None), ("floor-capped", cap)):
        slow = {t: testbed.Slowdown(link_rate=links) for t in (("ps", 0), ("worker", 0))}
        with testbed.Testbed(1, 1, slow) as bed:
            # Capped, the packed floor: one tensor each way, so the pull and the push cannot
            # overlap (with 6, a tensor's push may start while the next is pulled).
            setup = "floor-packed" if name == "floor-capped" else name
            sample = bench.run_one(setup, 1, config if not links else _bench_config(
                max(20, steps // 4)), network=bed)
        floor[name] = (_seconds_per_update(sample), sample.cpu_s / sample.updates)
        log.info("%s: %.2f ms per step, %.2f CPU ms", name, 1000 * floor[name][0],
                 1000 * floor[name][1])
    t_accum, t_update = measure_ps_work()
    log.info("ps: %.2f ms to accumulate a gradient, %.2f ms to take and apply Adam",
             1000 * t_accum, 1000 * t_update)
    nbytes, tensors = partition(1)
    total, k = sum(nbytes), sum(tensors)
    t_rpc = max(0.0, (floor["floor"][0] - floor["floor-packed"][0]) / (2 * (k - 1)))
    c_byte = max(0.0, (floor["floor-packed"][0] - 2 * t_rpc) / (2 * total))
    wire = floor["floor-capped"][0] - floor["floor-packed"][0]  # a pull, a push at the cap
    ideal = 2 * 8 * (total - testbed.TBF_BURST_BYTES) / testbed.rate_bits(cap)
    efficiency = ideal / wire if wire > 0 else 1.0
    costs = Costs(t_single=t_single, t_update=t_update, t_accum=t_accum, t_rpc=t_rpc,
                  c_byte=c_byte, cpu_floor=floor["floor"][1], efficiency=efficiency,
                  cpu_capped=capped_cpu(floor, total), cores=os.cpu_count() or 1,
                  bytes_total=total, tensors_total=k)
    return {"costs": dataclasses.asdict(costs), "floor_s": floor, "cap": cap, "steps": steps,
            "load_average": os.getloadavg()}


WIRE_SHARE = {"float32": 1.0, "bfloat16": 0.5}  # bytes crossing per float32 byte


def measure_point(num_workers: int, num_ps: int, cap: str | None, steps: int,
                  wire_dtype: str = "float32", model: str = "mlp"
                  ) -> tuple[float, float, dict[str, float]]:
    """Seconds, and CPU seconds of every process, per update of the real synchronous cluster
    in a testbed (bench's steady window); and each task's cores over the middle of the run
    (`steady_cores`)."""
    slow = {t: testbed.Slowdown(link_rate=cap) for t in
            [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]}
    with testbed.Testbed(num_ps, num_workers, slow) as bed:
        with TaskCpu(bed) as cpu:
            sample = bench.run_one("sync" if wire_dtype == "float32" else "sync-bf16",
                                   num_workers, _bench_config(steps, model), num_ps=num_ps,
                                   network=bed)
    return (_seconds_per_update(sample), sample.cpu_s / sample.updates,
            steady_cores(cpu.samples))


class TaskCpu:
    """Every task's CPU time, read from /proc every TASK_CPU_EVERY s while a run goes on (a
    thread); `samples`: [(time, {"ps 0": CPU seconds so far, ...})], only the tasks running."""

    def __init__(self, bed: testbed.Testbed):
        import threading

        self._bed, self._stop = bed, threading.Event()
        self._task = {ns: f"{role} {index}" for (role, index), ns in bed.namespace.items()}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples: list[tuple[float, dict[str, float]]] = []

    def __enter__(self) -> TaskCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        pids: dict[str, list[int]] = {}
        while not self._stop.wait(TASK_CPU_EVERY):
            if len(pids) < len(self._task):  # `ip netns pids` only until every task is up
                pids = {self._task[ns]: p for ns, p in self._bed.pids().items()}
            now, found = time.monotonic(), {}
            for task, task_pids in pids.items():
                ticks = [_cpu_ticks(pid) for pid in task_pids]
                if all(t is not None for t in ticks):
                    found[task] = sum(ticks) / tick
            self.samples.append((now, found))


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of a live process, in clock ticks; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def steady_cores(samples: Sequence[tuple[float, dict[str, float]]],
                 middle: tuple[float, float] = (0.4, 0.8)) -> dict[str, float]:
    """Each task's CPU seconds per second (cores) between the `middle` fractions of the time
    every task was running: past the start-up (building graphs, generating data) and before
    the chief's evaluation and the exits. {} with fewer than two such readings.
    """
    tasks = set().union(*(found for _, found in samples)) if samples else set()
    whole = [(t, found) for t, found in samples if tasks and set(found) == tasks]
    if len(whole) < 2:
        return {}
    start, end = whole[0][0], whole[-1][0]
    lo, hi = (start + f * (end - start) for f in middle)
    inside = [(t, found) for t, found in whole if lo <= t <= hi]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return {}
    (t0, first), (t1, last) = inside[0], inside[-1]
    return {task: (last[task] - first[task]) / (t1 - t0) for task in sorted(tasks)}


def ctr_bytes(num_ps: int) -> dict:
    """sparse_bytes.py's measure for the ctr model as `--model ctr` trains it (its table's rows
    and ids a field), 1 worker on `num_ps` ps, in a process of its own (its in-process
    servers cannot be stopped); the dict it prints."""
    import subprocess

    from sync_mnist.models import ctr

    argv = [sys.executable, "-m", "lab.sparse_bytes", "--rows",
            str(ctr.PARAMS["rows"]), "--vocabulary", str(ctr.PARAMS["vocabulary"]),
            "--ps", str(num_ps), "--json"]
    out = subprocess.run(argv, capture_output=True, text=True,
                         timeout=CTR_BYTES_TIMEOUT_SECS, cwd=ROOT,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if out.returncode:
        raise RuntimeError(f"`{' '.join(argv[1:])}` exited {out.returncode}: "
                           f"{out.stderr.strip().splitlines()[-1:] or ''}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_ps_bytes(moved: dict) -> list[int]:
    """B_p for each ps from sparse_bytes' measure: the mean of what a worker step pushes to ps
    p and pulls from it. The model charges every byte of B once in each of its two phases, so
    the mean of the two directions gives the right sum of both."""
    return [round((push + pull) / 2)
            for push, pull in zip(moved["per_ps_pushed"], moved["per_ps_pulled"])]


def sweep(costs: Costs, points: Sequence[tuple[int, int, str | None]],
          steps: int, wire_dtype: str = "float32",
          repeats: int = 1, model: str = "mlp") -> tuple[list[dict], Costs]:
    """Measures each (N, P, cap) `repeats` times and sets the prediction beside its median;
    returns the rows (the calibrating ones first) and the costs as calibrated (`calibrate`).

    The runs go in rounds, every point once a round, so that the machine's drift over the
    sweep falls on every point alike. A point whose run fails is not run again; its row keeps
    the error (and the median of the runs before it, if any).
    """
    moved = {p: ctr_bytes(p) for p in sorted({p for _, p, _ in points})} \
        if model == "ctr" else {}
    layouts = {p: per_ps_bytes(moved[p]) if moved else partition(p, 1)[0]
               for p in {p for _, p, _ in points}}
    runs: dict[tuple, list[tuple[float, float, dict]]] = {point: [] for point in points}
    errors: dict[tuple, str] = {}
    for round_ in range(1, repeats + 1):
        for point in [pt for pt in points if pt not in errors]:
            t = time.monotonic()
            try:
                runs[point].append(measure_point(*point, steps, wire_dtype, model))
            except RuntimeError as e:
                errors[point] = str(e)
            log.info("round %d/%d N=%d P=%d cap=%s: %s ms (%.0f s)", round_, repeats,
                     point[0], point[1], point[2] or "none",
                     _ms(runs[point][-1][0]) if point not in errors else "failed",
                     time.monotonic() - t)
    rows = []
    for point in points:
        n, p, cap = point
        row = {"workers": n, "ps": p, "cap": cap, "bytes_per_ps": layouts[p],
               "wire_dtype": wire_dtype, "model": model}
        if moved:  # what crossed each way, per worker step
            row["bytes_each_way"] = {k: moved[p][k] for k in (
                "pushed", "pulled", "per_ps_pushed", "per_ps_pulled")}
        if runs[point]:
            row["measured_s"] = statistics.median(s for s, _, _ in runs[point])
            row["measured_cpu_s"] = statistics.median(c for _, c, _ in runs[point])
            row["runs_s"] = [s for s, _, _ in runs[point]]
            row["runs_cpu_s"] = [c for _, c, _ in runs[point]]
            row["task_cores"] = [cores for _, _, cores in runs[point]]
        if point in errors:
            row["error"] = errors[point]
        rows.append(row)
    return _predicted_all(costs, rows)


def calibration_points(points: Sequence[tuple[int, int, str | None]]
                       ) -> dict[str, list[tuple[int, int, str | None]]]:
    """{the terms a set of points calibrates: those points} (see `calibrate`); a set only
    where the sweep has its points. Uncapped: (1, 1) for t_sync and cpu_step; every 1-worker
    point on more ps for t_ps_extra and cpu_ps_extra; the most workers N > 1 run on 1 ps and
    on more for cpu_ps_step. Capped: the 1-ps point with the most workers at the sweep's first
    cap for the overlap."""
    uncapped = {(n, p) for n, p, cap in points if cap is None}
    found = {}
    if (1, 1) in uncapped:
        found["t_sync, cpu_step"] = [(1, 1, None)]
    more_ps = sorted(p for n, p in uncapped if n == 1 and p > 1)
    if found and more_ps:
        found["t_ps_extra, cpu_ps_extra"] = [(1, p, None) for p in [1, *more_ps]]
        split = [n for n, p in uncapped if n > 1 and p > 1 and (n, 1) in uncapped]
        if split:
            n = max(split)
            found["cpu_ps_step"] = sorted((n, p, None) for m, p in uncapped if m == n)
    capped = [pt for pt in points if pt[1] == 1 and pt[2] and pt[0] > 1]
    if capped:
        found["overlap"] = [max(pt for pt in capped if pt[2] == capped[0][2])]
    return found


def _slope(pairs: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of y against x through the origin."""
    return sum(x * y for x, y in pairs) / sum(x * x for x, _ in pairs)


def calibrate(costs: Costs, rows: Sequence[dict]) -> Costs:
    """The costs with the calibrated terms taken from the rows' measurements (each row's median,
    with --repeats), from the points calibration_points names; each such row gains
    "calibrates", the terms it entered. Every other point is a prediction.

    t_sync: (1, 1)'s wall time beyond the modelled latency; cpu_step: its CPU less the ps's
    work. What each ps beyond the first adds, fitted over every 1-worker point (a line through
    the origin against P - 1, not one difference, so that no single run sets it):
    t_ps_extra from the wall time beyond the modelled latency, cpu_ps_extra from the CPU
    beyond (1, 1)'s. The same fit of the CPU at the most workers N (beyond (N, 1)'s) gives
    what an extra ps adds with N workers: cpu_ps_extra + N cpu_ps_step splits it into per
    update and per worker step. The overlap: the one that makes the capped 1-ps point's
    predicted link time its measured one.
    """
    points = calibration_points([(r["workers"], r["ps"], r["cap"]) for r in rows])
    at = {(r["workers"], r["ps"], r["cap"]): r for r in rows if "measured_s" in r}
    # A term one of whose runs failed stays as it was, and so do those that build on it (the
    # sweep's exit code says a run failed).
    needs = {"t_ps_extra, cpu_ps_extra": "t_sync, cpu_step",
             "cpu_ps_step": "t_ps_extra, cpu_ps_extra"}
    for term in list(points):
        if any(pt not in at for pt in points[term]) or needs.get(term, term) not in points:
            del points[term]
    share = WIRE_SHARE[rows[0].get("wire_dtype", "float32")] if rows else 1.0

    def bare(c: Costs, row: dict) -> float:  # 1 worker's modelled latency
        return predict(c, 1, row["bytes_per_ps"], wire_share=share).latency

    def mark(term: str) -> None:
        for pt in points[term]:
            at[pt].setdefault("calibrates", []).append(term)

    if "t_sync, cpu_step" in points:
        one = at[(1, 1, None)]
        costs = dataclasses.replace(costs, t_sync=0.0)
        costs = dataclasses.replace(
            costs, t_sync=max(0.0, one["measured_s"] - bare(costs, one)),
            cpu_step=max(0.0, one["measured_cpu_s"] - costs.t_update - costs.t_accum))
        mark("t_sync, cpu_step")
    if "t_ps_extra, cpu_ps_extra" in points:
        more = [at[pt] for pt in points["t_ps_extra, cpu_ps_extra"][1:]]
        costs = dataclasses.replace(costs, t_ps_extra=0.0)
        per_ps = _slope([(r["ps"] - 1, r["measured_cpu_s"] - one["measured_cpu_s"])
                         for r in more])
        costs = dataclasses.replace(
            costs, t_ps_extra=max(0.0, _slope([(r["ps"] - 1, r["measured_s"] - bare(costs, r))
                                               for r in more])),
            cpu_ps_extra=max(0.0, per_ps), cpu_ps_step=0.0)
        mark("t_ps_extra, cpu_ps_extra")
    if "cpu_ps_step" in points:
        base, *more = [at[pt] for pt in points["cpu_ps_step"]]
        n = base["workers"]
        at_n = _slope([(r["ps"] - 1, r["measured_cpu_s"] - base["measured_cpu_s"])
                       for r in more])
        step = min(costs.cpu_ps_extra, max(0.0, (at_n - costs.cpu_ps_extra) / (n - 1)))
        costs = dataclasses.replace(costs, cpu_ps_step=step,
                                    cpu_ps_extra=costs.cpu_ps_extra - step)
        mark("cpu_ps_step")
    if "overlap" in points:
        row = at[points["overlap"][0]]
        costs = dataclasses.replace(costs, overlap=overlap_from(
            costs, row["workers"], row["bytes_per_ps"], row["measured_s"],
            rate_bits=testbed.rate_bits(row["cap"]), burst=testbed.TBF_BURST_BYTES,
            wire_share=share))
        mark("overlap")
    return costs


def predicted(costs: Costs, row: dict) -> dict:
    """`row` with the model's prediction for its point beside what was measured."""
    pred = predict(costs, row["workers"], row["bytes_per_ps"],
                   rate_bits=testbed.rate_bits(row["cap"]) if row["cap"] else None,
                   cores=costs.cores, burst=testbed.TBF_BURST_BYTES,
                   wire_share=WIRE_SHARE[row.get("wire_dtype", "float32")])
    out = {**row, "predicted_s": pred.total, "bottleneck": pred.bottleneck,
           "terms": dataclasses.asdict(pred)}
    if "measured_s" in row:
        out["error_rel"] = pred.total / row["measured_s"] - 1
    return out


def capped_cpu(floor: dict, total: int) -> float:
    """cpu_capped from measure's floors ({name: (s, CPU s) per step}): the capped packed floor's
    CPU beyond the uncapped one's, per byte of its pull and push."""
    return max(0.0, (floor["floor-capped"][1] - floor["floor-packed"][1]) / (2 * total))


def recheck(result: dict, floor: dict) -> tuple[list[dict], Costs]:
    """A sweep's rows (scaling.json) predicted again with this model, calibrated again from
    the measured points (the sweep's own, and those of the sweep whose scaling.json it took as
    --costs), with cpu_capped from `floor` (measure's floor_s); no new runs. Returns the rows
    and the costs as calibrated again."""
    rows, measured = [dict(r) for r in result["rows"]], result["measured"]
    while "rows" in measured:  # --costs was a calibrating sweep's scaling.json
        rows, measured = [dict(r) for r in measured["rows"]] + rows, measured["measured"]
    costs = Costs(**measured["costs"])
    costs = dataclasses.replace(costs, cpu_capped=capped_cpu(floor, costs.bytes_total))
    for row in rows:
        row.pop("calibrates", None)
    return _predicted_all(costs, rows)


def _predicted_all(costs: Costs, rows: list[dict]) -> tuple[list[dict], Costs]:
    """(the rows with their predictions, the calibrating ones first; the costs calibrated)."""
    costs = calibrate(costs, rows)
    rows = sorted(rows, key=lambda r: "calibrates" not in r)
    return [predicted(costs, r) for r in rows], costs


def format_sweep(rows: Sequence[dict]) -> str:
    lines = [f"{'workers':>7}{'ps':>4}{'cap':>9}{'measured ms':>13}{'spread':>11}"
             f"{'predicted ms':>14}{'error':>8}  bottleneck"]
    for r in rows:
        err = f"{100 * r['error_rel']:+.0f}%" if "error_rel" in r else "-"
        runs = r.get("runs_s", [])
        spread = f"{1000 * min(runs):.0f}-{1000 * max(runs):.0f}" if len(runs) > 1 else "-"
        lines.append(f"{r['workers']:>7}{r['ps']:>4}{r['cap'] or 'none':>9}"
                     f"{_ms(r.get('measured_s')):>13}{spread:>11}"
                     f"{1000 * r['predicted_s']:>14.1f}{err:>8}"
                     f"  {r['bottleneck']}" + (f"  FAILED: {r['error']}" if 'error' in r
                                               else "") +
                     (f"  (calibrates {', '.join(r['calibrates'])})" if "calibrates" in r
                      else ""))
    errors = [abs(r["error_rel"]) for r in rows if "error_rel" in r
              and "calibrates" not in r]
    if errors:
        lines.append(f"relative error over {len(errors)} predicted points: median "
                     f"{100 * statistics.median(errors):.0f}%, max {100 * max(errors):.0f}%")
    return "\n".join(lines)


def plot(rows: Sequence[dict], path: Path) -> str | None:
    """Measured (points) and predicted (lines) ms per update against workers: a panel per link
    cap, a colour per ps count. Returns why not, if it cannot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[plot]'); no plot"
    caps = sorted({r["cap"] or "none" for r in rows}, key=lambda c: c != "none")
    fig, axes = plt.subplots(1, len(caps), figsize=(5 * len(caps), 4), squeeze=False)
    for ax, cap in zip(axes[0], caps):
        for colour, ps in zip(("tab:blue", "tab:orange", "tab:green"),
                              sorted({r["ps"] for r in rows})):
            mine = sorted((r for r in rows if (r["cap"] or "none") == cap and r["ps"] == ps),
                          key=lambda r: r["workers"])
            ax.plot([r["workers"] for r in mine], [1000 * r["predicted_s"] for r in mine],
                    color=colour, label=f"{ps} ps, predicted")
            done = [r for r in mine if "measured_s" in r]
            ax.plot([r["workers"] for r in done], [1000 * r["measured_s"] for r in done], "o",
                    color=colour, label=f"{ps} ps, measured")
        ax.set_title(f"links: {cap}")
        ax.set_xlabel("workers")
        ax.set_ylabel("ms per update")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def format_predictions(costs: Costs, workers: Sequence[int], rates: Sequence[str],
                       wire_share: float = 1.0) -> str:
    """Hosts of their own: update time at 1 ps, where one ps saturates, the ps a cluster needs."""
    g = wire_share
    lines = [f"{'workers':>7}{'link':>9}{'1 ps: ms/update':>17}{'bottleneck':>12}"
             f"{'ps needed':>11}{'then ms/update':>16}"]
    for rate in rates:
        r = testbed.rate_bits(rate)
        for n in workers:
            one = predict(costs, n, [costs.bytes_total], rate_bits=r, wire_share=g)
            p = ps_needed(costs, n, r, wire_share=g)
            then = predict(costs, n, [costs.bytes_total / p] * p, rate_bits=r, wire_share=g)
            lines.append(f"{n:>7}{rate:>9}{1000 * one.total:>17.1f}{one.bottleneck:>12}"
                         f"{p:>11}{1000 * then.total:>16.1f}")
        lines.append(f"  one ps saturates (its link the bottleneck) from "
                     f"{_saturation(costs, r, g)} workers at {rate}")
    lines.append("ps needed: the fewest ps tasks within 10% of the best update time, the model "
                 "split evenly over them (as --ps K splits it)")
    return "\n".join(lines)


def _saturation(costs: Costs, rate_bits: float, wire_share: float = 1.0) -> int:
    for n in range(1, 10_001):
        if predict(costs, n, [costs.bytes_total], rate_bits=rate_bits,
                   wire_share=wire_share).bottleneck != "latency":
            return n
    return 10_001


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


# ------------------------------------------------------------------------ command line


def _points(workers: Sequence[int], ps: Sequence[int], caps: Sequence[str | None]):
    return [(n, p, c) for c in caps for p in ps for n in workers]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.scaling", allow_abbrev=False,
                                description="Measure the update-time model's inputs, check "
                                            "it against real runs, predict larger clusters.")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="measure the costs (root: a testbed); writes costs.json")
    m.add_argument("--steps", type=int, default=200, help="steps per run (default: 200)")
    m.add_argument("--cap", default=DEFAULT_CAP,
                   help=f"tbf rate for the capped floor (default: {DEFAULT_CAP})")
    s = sub.add_parser("sweep", help="measured vs predicted update time (root: a testbed)")
    s.add_argument("--costs", type=Path, default=None,
                   help="costs.json from measure (default: measure first)")
    s.add_argument("--workers", default="1,2,3,4,5,6", help="worker counts (default: 1-6)")
    s.add_argument("--ps", default="1,2", help="ps counts (default: 1,2)")
    s.add_argument("--caps", default=f"none,{DEFAULT_CAP}",
                   help=f"link caps, none for uncapped (default: none,{DEFAULT_CAP})")
    s.add_argument("--steps", type=int, default=40,
                   help="updates per point (default: 40: about 20 s a point)")
    s.add_argument("--wire-dtype", default="float32", choices=tuple(WIRE_SHARE),
                   help="the cluster's --wire-dtype at every point (default: float32)")
    s.add_argument("--model", default="mlp", choices=MODELS,
                   help="what the tasks train: mlp, the question's MLP on synthetic data; ctr, "
                        "the sparse click-through-rate model (models/ctr.py), its bytes per "
                        "step measured first (sparse_bytes.py) (default: mlp)")
    s.add_argument("--repeats", type=int, default=1,
                   help="runs of each point, in rounds; the table gives each point's median "
                        "and spread (default: 1)")
    g = sub.add_parser("plot", help="OUT/scaling.png again, from OUT/scaling.json")
    c = sub.add_parser("recheck", help="OUT/scaling.json's points predicted again by this "
                                       "model, calibrated again (no runs); with measure's "
                                       "costs.json; writes OUT/recheck.json")
    c.add_argument("--costs", type=Path, required=True,
                   help="costs.json from measure (its floors give cpu_capped)")
    r = sub.add_parser("predict", help="hosts of their own: 1 ps and the ps needed")
    r.add_argument("--costs", type=Path, required=True,
                   help="scaling.json from sweep (calibrated), or costs.json from measure")
    r.add_argument("--workers", default="8,32,100", help="worker counts (default: 8,32,100)")
    r.add_argument("--rates", default="1gbit,10gbit",
                   help="link rates (default: 1gbit,10gbit)")
    r.add_argument("--wire-dtype", default="float32", choices=tuple(WIRE_SHARE),
                   help="what the pulls and pushes cross in (default: float32)")
    for sp in (m, s, g, c, r):
        sp.add_argument("--out", type=Path, default=Path("scaling-results"),
                        help="output directory (default: scaling-results)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s [scaling] %(message)s", datefmt="%H:%M:%S")
    try:
        ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
        workers = ints(args.workers) if args.command in ("sweep", "predict") else []
        ps = ints(args.ps) if args.command == "sweep" else []
        caps = [None if c == "none" else c for c in args.caps.split(",")] \
            if args.command == "sweep" else []
        for rate in [c for c in caps if c] + (args.rates.split(",")
                                               if args.command == "predict" else []):
            testbed.rate_bits(rate)
        if any(n < 1 for n in workers + ps):
            raise ValueError(f"worker and ps counts must be at least 1: {workers} {ps}")
        if args.command in ("measure", "sweep") and args.steps < 20:
            raise ValueError(f"--steps must be at least 20, got {args.steps}")
        if args.command == "sweep" and args.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    except ValueError as e:
        p.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command in ("plot", "recheck") and not (args.out / "scaling.json").is_file():
        print(f"error: no {args.out / 'scaling.json'}: run the sweep first", file=sys.stderr)
        return config_lib.EXIT_USAGE
    try:
        costs_file = _read_costs(args.costs, "floor_s" if args.command == "recheck" else "costs") \
            if getattr(args, "costs", None) else None
    except ValueError as e:
        p.error(str(e))
    if args.command == "plot":
        return _plot(json.loads((args.out / "scaling.json").read_text())["rows"], args.out)
    if args.command == "recheck":
        result = json.loads((args.out / "scaling.json").read_text())
        rows, costs = recheck(result, costs_file["floor_s"])
        (args.out / "recheck.json").write_text(json.dumps(
            {"costs": dataclasses.asdict(costs), "rows": rows}, indent=2) + "\n")
        print(format_sweep(rows))
        print(f"wrote {args.out / 'recheck.json'} (its costs: predict --costs)")
        return config_lib.EXIT_OK
    if args.command == "predict":
        costs = Costs(**costs_file["costs"])
        print(format_predictions(costs, workers, args.rates.split(","),
                                 WIRE_SHARE[args.wire_dtype]))
        return config_lib.EXIT_OK
    try:
        testbed.check(cpu=False)
    except testbed.Unavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    # Ctrl-C and SIGTERM unwind through the finallys that kill the runs and remove testbeds.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    try:
        if args.command == "measure" or args.costs is None:
            measured = measure(args.steps if args.command == "measure" else 200,
                               args.cap if args.command == "measure" else DEFAULT_CAP)
            (args.out / "costs.json").write_text(json.dumps(measured, indent=2) + "\n")
            print(json.dumps(measured["costs"], indent=2))
            print(f"wrote {args.out / 'costs.json'}")
            if args.command == "measure":
                return config_lib.EXIT_OK
        else:
            measured = costs_file
        costs = Costs(**measured["costs"])
        rows, costs = sweep(costs, _points(workers, ps, caps), args.steps, args.wire_dtype,
                            args.repeats, args.model)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return config_lib.EXIT_INTERRUPTED
    except testbed.Unavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    # "costs": as calibrated, what `predict --costs scaling.json` reads; "measured": as measured
    result = {"costs": dataclasses.asdict(costs), "measured": measured, "rows": rows,
              "wall_s": time.monotonic() - started,
              "load_average_at_end": os.getloadavg()}
    (args.out / "scaling.json").write_text(json.dumps(result, indent=2) + "\n")
    print(format_sweep(rows))
    print(f"wrote {args.out / 'scaling.json'} ({result['wall_s']:.0f} s; load average "
          f"{result['load_average_at_end'][0]:.1f})")
    _plot(rows, args.out)
    return config_lib.EXIT_FAILED if any("error" in r for r in rows) else config_lib.EXIT_OK


def _read_costs(path: Path, key: str) -> dict:
    """--costs's JSON, which must hold `key`; a ValueError naming the file and what is wrong."""
    try:
        found = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"--costs {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"--costs {path} is not JSON ({e})") from e
    if not isinstance(found, dict) or key not in found:
        wanted = "measure's costs.json" if key == "floor_s" else \
            "measure's costs.json or a sweep's scaling.json"
        raise ValueError(f"--costs {path} has no {key!r}: give {wanted}")
    return found


def _plot(rows: Sequence[dict], out: Path) -> int:
    why_not = plot(rows, out / "scaling.png")
    print(why_not or f"wrote {out / 'scaling.png'}")
    return config_lib.EXIT_FAILED if why_not else config_lib.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
