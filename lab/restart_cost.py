"""What a restarted worker pays to find its place in a streamed input (issue 55, item 4).

    python -m lab.restart_cost --data DIR --at 0.1,0.9 --repeats 2

Writes the click model's TFRecord log into DIR once (`sync-mnist-clicks`, --scale times the
model's 600,000 training clicks, 12 files), then runs `sync-mnist-cluster --model ctr --data-dir
DIR` (2 workers, 1 pass, --max-restarts 1) once a repeat for each fraction of --at: worker 1 is
SIGKILLed at its progress line of that fraction of its pass, and the launcher restarts it. The
figure is the time from the launcher's "restarting it" line to the restarted worker's first
step line: its start-up, its seek in the input, and its first pushed gradient. Each run's lines
go to DIR/restart-<fraction>-<repeat>.log; one line a run is printed, then the medians.

Exit codes: 0 every run ended 0; 1 some run did not; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

CLICKS, FILES, BATCH = 600_000, 12, 500


def write_clicks(directory: Path, scale: int) -> None:
    if (directory / "clicks.json").exists():
        return
    subprocess.run([str(Path(sys.executable).with_name("sync-mnist-clicks")), str(directory),
                    "--format", "tfrecord", "--train-examples", str(CLICKS * scale),
                    "--train-files", str(FILES)], check=True)


def run_one(directory: Path, at: float, scale: int, log_path: Path) -> float:
    """Seconds from the restart to the restarted worker's first step; raises on a failed run."""
    steps = CLICKS * scale // 2 // BATCH  # worker 1's batches in its pass
    kill_at = max(1, int(at * steps))
    argv = [str(Path(sys.executable).with_name("sync-mnist-cluster")), "--model", "ctr", "--data-dir",
            str(directory), "--base-port", "0", "--isolate", "off", "--workers", "2",
            "--epochs", "1", "--batch-size", str(BATCH), "--log-every", "1", "--timeout", "120",
            "--max-restarts", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines, restarted_at, first_step = [], None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            if (m := re.search(r"started worker 1 \(pid (\d+)\)", line)) and restarted_at is None:
                pid = int(m[1])
            if restarted_at is None and f"[worker 1] step={kill_at} " in line:
                os.kill(pid, signal.SIGKILL)
            if "worker 1 exited with code -9; restarting it" in line:
                restarted_at = time.monotonic()  # as the line arrives: unbuffered
            if restarted_at is not None and first_step is None and "[worker 1] step=" in line:
                first_step = time.monotonic()
        code = proc.wait(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log_path.write_text("".join(lines))
    if code != 0 or restarted_at is None or first_step is None:
        raise RuntimeError(f"run at {at:g} of the pass ended {code} (restart seen: "
                           f"{restarted_at is not None}, step after it: {first_step is not None}): "
                           f"{log_path}")
    return first_step - restarted_at


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.restart_cost", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="where the click files go")
    p.add_argument("--scale", type=int, default=10, help="times the model's training clicks "
                   "(default: 10)")
    p.add_argument("--at", default="0.1,0.9", help="fractions of the pass to kill worker 1 at "
                   "(default: 0.1,0.9)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each (default: 2)")
    args = p.parse_args(argv)
    fractions = [float(x) for x in args.at.split(",")]
    if not all(0 < f < 1 for f in fractions) or args.repeats < 1 or args.scale < 1:
        p.error("--at takes fractions in (0, 1); --repeats and --scale at least 1")
    write_clicks(args.data, args.scale)
    results: dict[float, list[float]] = {f: [] for f in fractions}
    for repeat in range(args.repeats):
        for at in fractions:
            seconds = run_one(args.data, at, args.scale,
                              args.data / f"restart-{at:g}-{repeat}.log")
            results[at].append(seconds)
            print(f"killed at {at:.0%} of the pass: first step {seconds:.1f} s after the restart",
                  flush=True)
    for at, values in results.items():
        print(f"at {at:.0%}: median {statistics.median(values):.1f} s "
              f"({', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
