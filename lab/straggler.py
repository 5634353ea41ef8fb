"""Stragglers on demand (issue 12): the real cluster in network namespaces, one worker slowed.

    python -m lab.straggler --workers 4 --slow-link 20mbit --repeats 3 \\
        --out straggler-results --epochs 12 --eval-every 100 --target-accuracy 0.97

Each run starts ps + N workers with launch.run_cluster (the normal `python -m sync_mnist` task
processes, killed by process group at the end), each task in a network namespace of its own
(testbed.py), with the straggler's link rate capped (tbf) and/or its CPU share capped (cgroup
v1 cpu). Training options (--epochs, --dataset, ...: those of sync-mnist-cluster) go to every
task unchanged; the setup's --mode and --replicas-to-aggregate are added after them.

Setups, each run --repeats times, interleaved, with the straggler and, unless --no-baseline,
without it:
  sync    R = N: every update waits for every worker, so for the straggler
  backup  R = N - 1: one backup worker; each update takes the first N - 1 gradients
  async   --mode async: no waiting, and no averaging

Writes OUT/<setup>-<straggler|baseline>-<repeat>.log (every task's lines), OUT/straggler.json
(every run's cluster summary, and the kernel's view of each task's link: bytes, tbf, CPU quota)
and prints one table. With --logdir DIR each run writes its summaries to DIR/<run name>, and
OUT/accuracy.png shows test accuracy against wall time (`python -m lab.straggler plot
OUT` draws it again). Root only.

Exit codes: 0 every run exited 0; 1 some run did not; 2 bad arguments, not root, or no ip, tc
or cgroup cpu controller; 130 interrupted. Namespaces, qdiscs and cgroups are removed in every
case.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

from sync_mnist.task import options
from sync_mnist.launcher import launch
from lab import testbed
from sync_mnist.core import config as config_lib

log = logging.getLogger("lab.straggler")

SETUPS = ("sync", "backup", "async")
# Options of this command that a task must not get: everything else before `--` is a
# training option, as sync-mnist-cluster takes them.
OWN_OPTIONS = ("--ps", "--workers", "--straggler", "--slow-link", "--slow-cpu", "--cap-links",
               "--setups", "--repeats", "--out")


@dataclasses.dataclass(frozen=True)
class Experiment:
    num_ps: int
    num_workers: int
    straggler: int
    slow: testbed.Slowdown
    cap_links: str | None  # every task's link, the straggler's too unless --slow-link
    setups: tuple[str, ...]
    baseline: bool
    repeats: int
    out: Path
    task_args: tuple[str, ...]  # for every task, as given (but --logdir)
    verbose: bool = False
    logdir: Path | None = None  # each run writes its summaries to logdir/<run name>


def setup_args(setup: str, num_workers: int) -> list[str]:
    """The task options that make `setup` (appended after the user's, so they win)."""
    if setup == "backup":
        if num_workers < 2:
            raise config_lib.ConfigError("the backup setup needs at least 2 workers")
        return ["--mode", "sync", "--replicas-to-aggregate", str(num_workers - 1)]
    if setup == "sync":
        return ["--mode", "sync", "--replicas-to-aggregate", str(num_workers)]
    return ["--mode", "async"]


def parse_args(argv: Sequence[str]) -> tuple[Experiment, dict]:
    """The command line; returns the experiment and each setup's TrainConfig (validated)."""
    p = options.Parser(
        prog="python -m lab.straggler",
        description="Run the cluster in network namespaces with one worker slowed (link rate "
                    "or CPU share), for each setup (sync R=N, backup R=N-1, async), with and "
                    "without the straggler. Root only. Task options (--epochs, --dataset, "
                    "...) are passed to every task.")
    p.add_argument("--ps", type=int, default=1, help="ps tasks (default: 1)")
    p.add_argument("--workers", type=int, default=4, help="worker tasks (default: 4)")
    p.add_argument("--straggler", type=int, default=None,
                   help="the worker to slow (default: the last one)")
    p.add_argument("--slow-link", default=None, metavar="RATE",
                   help="cap the straggler's link at RATE each way, in tc's units: 20mbit, "
                        "500kbit (default: no cap)")
    p.add_argument("--slow-cpu", type=float, default=None, metavar="CORES",
                   help="cap the straggler's CPU at this share of one core, e.g. 0.25 "
                        "(default: no cap)")
    p.add_argument("--cap-links", default=None, metavar="RATE",
                   help="cap every task's link at RATE, e.g. 1gbit, as between hosts; the "
                        "straggler's --slow-link replaces it for the straggler (default: none)")
    p.add_argument("--setups", default=",".join(SETUPS),
                   help=f"comma-separated subset of {','.join(SETUPS)} (default: all)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the runs without the straggler (default: run them)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each setup (default: 1)")
    p.add_argument("--out", type=Path, default=Path("straggler-results"),
                   help="directory for the logs and straggler.json (default: "
                        "straggler-results)")
    options.add_training_options(p)
    args = p.parse_args(argv)
    # --logdir is per run (a logdir holding a checkpoint would be resumed): see run_one.
    task_args = options.task_arguments(
        list(argv), OWN_OPTIONS + ("--summary-json", "--logdir"))
    task_args = [a for a in task_args if a != "--no-baseline"]
    try:
        if args.ps < 1 or args.workers < 1:
            raise config_lib.ConfigError(f"--ps {args.ps} --workers {args.workers}: a cluster "
                                         "needs at least one of each")
        straggler = args.workers - 1 if args.straggler is None else args.straggler
        if not 0 <= straggler < args.workers:
            raise config_lib.ConfigError(f"--straggler {straggler} is not a worker (0-"
                                         f"{args.workers - 1})")
        setups = tuple(args.setups.split(","))
        unknown = [s for s in setups if s not in SETUPS]
        if unknown:
            raise config_lib.ConfigError(f"--setups: unknown {','.join(unknown)} (choose from "
                                         f"{','.join(SETUPS)})")
        if args.repeats < 1:
            raise config_lib.ConfigError(f"--repeats must be at least 1, got {args.repeats}")
        slow = testbed.Slowdown(link_rate=args.slow_link, cpu_share=args.slow_cpu)
        if args.cap_links:
            testbed.rate_bits(args.cap_links)
        if not (slow.link_rate or slow.cpu_share) and not args.baseline:
            raise config_lib.ConfigError("nothing to run: no --slow-link or --slow-cpu, and "
                                         "--no-baseline")
        trains = {}
        for setup in setups:
            setup_ns = p.parse_args([*argv, *setup_args(setup, args.workers)])
            trains[setup] = options.train_config(setup_ns)
            trains[setup].aggregate(args.workers)
    except ValueError as e:
        p.error(str(e))
    return Experiment(num_ps=args.ps, num_workers=args.workers, straggler=straggler, slow=slow,
                      cap_links=args.cap_links, setups=setups, baseline=args.baseline,
                      repeats=args.repeats, out=args.out, task_args=tuple(task_args),
                      verbose=args.verbose, logdir=args.logdir), trains


def slowdowns(exp: Experiment, straggled: bool) -> dict[testbed.Task, testbed.Slowdown]:
    """Each task's caps: every link at --cap-links, and the straggler's own when straggled."""
    tasks = [("ps", i) for i in range(exp.num_ps)] + [("worker", i)
                                                       for i in range(exp.num_workers)]
    slow = {t: testbed.Slowdown(link_rate=exp.cap_links) for t in tasks}
    if straggled:
        slow["worker", exp.straggler] = testbed.Slowdown(
            link_rate=exp.slow.link_rate or exp.cap_links, cpu_share=exp.slow.cpu_share)
    return slow


def run_name(setup: str, straggled: bool, repeat: int) -> str:
    return f"{setup}-{'straggler' if straggled else 'baseline'}-{repeat}"


def run_one(exp: Experiment, train, setup: str, straggled: bool, repeat: int) -> dict:
    """One cluster in a fresh testbed; its record. The testbed is gone when this returns."""
    name = run_name(setup, straggled, repeat)
    summary_path = exp.out / f"{name}.summary.json"
    logdir = ["--logdir", str(exp.logdir / name)] if exp.logdir else []
    record = {"name": name, "setup": setup, "straggled": straggled, "repeat": repeat,
              "logdir": str(exp.logdir / name) if exp.logdir else None,
              "straggler": exp.straggler if straggled else None,
              "slow": dataclasses.asdict(exp.slow) if straggled else None,
              "cap_links": exp.cap_links}
    bed = testbed.Testbed(exp.num_ps, exp.num_workers, slowdowns(exp, straggled))
    started = time.monotonic()
    try:
        bed.build()
        with open(exp.out / f"{name}.log", "w") as lines, contextlib.redirect_stdout(lines):
            record["exit_code"] = launch.run_cluster(
                num_ps=exp.num_ps, num_workers=exp.num_workers, base_port=testbed.PORT,
                train=train,
                task_args=[*exp.task_args, *logdir, *setup_args(setup, exp.num_workers)],
                summary_json=summary_path, verbose=exp.verbose, network=bed)
        record["links"] = bed.link_stats()  # before the namespaces go: the kernel's counters
    finally:
        bed.close()
    record["wall_s"] = time.monotonic() - started
    try:
        record["cluster"] = json.loads(summary_path.read_text())
    except (OSError, ValueError) as e:
        record["cluster"] = None
        record.setdefault("error", f"no cluster summary: {e}")
    return record


def figures(record: dict) -> dict:
    """The figures of one run the table shows, from its cluster summary."""
    c = record.get("cluster") or {}
    tasks = [t for t in c.get("tasks", []) if t["role"] == "worker"]
    eps = {t["index"]: t.get("examples_per_sec") for t in tasks}
    slow = record.get("straggler")
    others = [v for i, v in eps.items() if i != slow and v]
    return {
        "updates_per_s": c["global_step"] / c["train_s"]
        if c.get("global_step") and c.get("train_s") else None,
        "train_s": c.get("train_s"),
        "test_accuracy": c.get("test_accuracy"),
        "time_to_target_s": c.get("time_to_target_s"),  # with --target-accuracy (part 1)
        "updates_to_target": c.get("updates_to_target"),
        "dropped": c.get("dropped"),
        "straggler_examples_per_s": eps.get(slow) if slow is not None else None,
        "others_examples_per_s": statistics.mean(others) if others else None,
    }


def format_table(records: Sequence[dict]) -> str:
    """One line per (setup, straggler or baseline): medians over the repeats that exited 0."""
    head = (f"{'setup':<8}{'straggler':<11}{'runs':>5}{'ok':>4}{'updates/s':>10}"
            f"{'(min-max)':>15}{'train s':>9}{'to target s':>12}{'accuracy':>9}"
            f"  dropped per worker (median)  straggler/others examples/s")
    lines = [head]
    groups: dict[tuple[str, bool], list[dict]] = {}
    for r in records:
        groups.setdefault((r["setup"], r["straggled"]), []).append(r)
    for (setup, straggled), group in groups.items():
        good = [figures(r) for r in group if r.get("exit_code") == 0]
        ups = [f["updates_per_s"] for f in good if f["updates_per_s"]]
        dropped = [f["dropped"] for f in good if f["dropped"]]
        ratio = [f["straggler_examples_per_s"] / f["others_examples_per_s"] for f in good
                 if f["straggler_examples_per_s"] and f["others_examples_per_s"]]
        lines.append(
            f"{setup:<8}{'yes' if straggled else 'no':<11}{len(group):>5}{len(good):>4}"
            f"{_med(ups, '.1f'):>10}"
            f"{(f'({min(ups):.1f}-{max(ups):.1f})' if ups else '-'):>15}"
            f"{_med([f['train_s'] for f in good], '.1f'):>9}"
            f"{_med([f['time_to_target_s'] for f in good], '.1f'):>12}"
            f"{_med([f['test_accuracy'] for f in good], '.4f'):>9}"
            f"  {str([round(statistics.median(d)) for d in zip(*dropped)]) if dropped else '-':<28}"
            f" {_med(ratio, '.2f')}")
    return "\n".join(lines)


def _med(values, spec: str) -> str:
    values = [v for v in values if v is not None]
    return format(statistics.median(values), spec) if values else "-"


def run(exp: Experiment, trains: dict) -> int:
    exp.out.mkdir(parents=True, exist_ok=True)
    variants = ((True,) if exp.slow.link_rate or exp.slow.cpu_share else ()) + (
        (False,) if exp.baseline else ())
    plan = [(setup, straggled) for setup in exp.setups for straggled in variants]
    if exp.logdir:  # a logdir that holds a checkpoint would be resumed, not trained afresh
        used = [str(exp.logdir / run_name(s, v, k)) for k in range(exp.repeats)
                for s, v in plan if (exp.logdir / run_name(s, v, k)).exists()]
        if used:
            print(f"error: --logdir {exp.logdir}: {len(used)} runs' directories exist already "
                  f"({used[0]}, ...); give a new --logdir", file=sys.stderr)
            return config_lib.EXIT_USAGE
    records, interrupted = [], False
    started = time.monotonic()
    try:
        for repeat in range(exp.repeats):
            for setup, straggled in plan:  # interleaved, so drift in the load spreads out
                record = run_one(exp, trains[setup], setup, straggled, repeat)
                records.append(record)
                f = figures(record)
                log.info("%s: exit %s, %s updates/s, accuracy %s, dropped %s, straggler/others "
                         "examples/s %s/%s (%.0f s)", record["name"], record.get("exit_code"),
                         _fmt(f["updates_per_s"], ".1f"), _fmt(f["test_accuracy"], ".4f"),
                         f["dropped"], _fmt(f["straggler_examples_per_s"], ".0f"),
                         _fmt(f["others_examples_per_s"], ".0f"), record["wall_s"])
                if record.get("exit_code") == config_lib.EXIT_INTERRUPTED:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        interrupted = True
        log.error("interrupted; the testbed has been removed")
    result = {"experiment": {**dataclasses.asdict(exp), "out": str(exp.out)},
              "wall_s": time.monotonic() - started, "records": records}
    (exp.out / "straggler.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(format_table(records))
    print(f"wrote {exp.out / 'straggler.json'} ({len(records)} runs, "
          f"{result['wall_s']:.0f} s)")
    if exp.logdir:
        print(plot(records, exp.out / "accuracy.png") or f"wrote {exp.out / 'accuracy.png'}")
    if interrupted:
        return config_lib.EXIT_INTERRUPTED
    return config_lib.EXIT_OK if all(r.get("exit_code") == 0 for r in records) \
        else config_lib.EXIT_FAILED


ACCURACY_TAG = "test/accuracy"  # early_stop.py: one point per --eval-every evaluation


def accuracy_curve(logdir: Path, since: float, tag: str = ACCURACY_TAG
                   ) -> list[tuple[float, float]]:
    """(seconds since `since` (unix time), value) of every `tag` summary in logdir's events."""
    import tensorflow as tf  # late: slow to load, and only the plot needs it

    if tf.get_logger().level < logging.ERROR:  # summary_iterator's deprecation warning
        tf.get_logger().setLevel(logging.ERROR)
    points = []
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            points += [(event.wall_time - since, v.simple_value) for v in event.summary.value
                       if v.tag == tag and v.HasField("simple_value")]
    return sorted(points)


def plot(records: Sequence[dict], path: Path, tag: str = ACCURACY_TAG) -> str | None:
    """Test accuracy against wall time since the chief was ready: a line per run, a colour per
    setup, solid with the straggler, dashed without. Returns why not, if it cannot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[plot]'); no plot"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = dict(zip(SETUPS, ("tab:blue", "tab:green", "tab:red")))
    drawn = set()
    for r in records:
        chief = next((t for t in (r.get("cluster") or {}).get("tasks", [])
                      if t["role"] == "worker" and t["index"] == 0), None)
        if not r.get("logdir") or not chief or not chief.get("ready_at"):
            continue
        curve = accuracy_curve(Path(r["logdir"]), chief["ready_at"], tag)
        if not curve:
            continue
        key = (r["setup"], r["straggled"])
        label = None if key in drawn else f"{r['setup']}{' + straggler' if r['straggled'] else ''}"
        drawn.add(key)
        ax.plot(*zip(*curve), color=colours[r["setup"]], linestyle="-" if r["straggled"] else "--",
                marker="o" if len(curve) == 1 else None, alpha=0.8, label=label)
    if not drawn:
        plt.close(fig)
        return f"no {tag!r} summaries in the runs' logdirs; no plot"
    ax.set_xlabel("seconds since the chief was ready")
    ax.set_ylabel(tag.replace("_", " "))
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: Sequence[str] | None = None) -> int:
    # `--` before the task options is allowed, not needed: they are all known options.
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--"]
    options.before_tensorflow(verbose=False)  # the plot's import
    if argv[:1] == ["plot"]:  # again, from a finished experiment's straggler.json
        return plot_main(argv[1:])
    exp, trains = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s [straggler] %(message)s", datefmt="%H:%M:%S")
    # Each run's task lines go to its log file; the launcher's own start lines would be noise.
    logging.getLogger("sync_mnist.launcher.launch").setLevel(logging.WARNING)
    try:
        testbed.check(cpu=exp.slow.cpu_share is not None)
    except testbed.Unavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    # SIGTERM unwinds as Ctrl-C does, through every finally that removes the testbed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return run(exp, trains)
    except testbed.Unavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE


def plot_main(argv: Sequence[str]) -> int:
    """`python -m lab.straggler plot OUT [--tag TAG]`: OUT/accuracy.png again."""
    p = argparse.ArgumentParser(prog="python -m lab.straggler plot")
    p.add_argument("out", type=Path, help="the experiment's --out (holds straggler.json)")
    p.add_argument("--tag", default=ACCURACY_TAG,
                   help=f"the summary to draw (default: {ACCURACY_TAG})")
    args = p.parse_args(argv)
    try:
        records = json.loads((args.out / "straggler.json").read_text())["records"]
    except (OSError, ValueError, KeyError) as e:
        print(f"error: no experiment in {args.out}: {e}", file=sys.stderr)
        return config_lib.EXIT_USAGE
    why_not = plot(records, args.out / "accuracy.png", args.tag)
    print(why_not or f"wrote {args.out / 'accuracy.png'}")
    return config_lib.EXIT_USAGE if why_not else config_lib.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
