"""Peak memory of each task of a default run, against bare `import tensorflow`, in one sitting.

    .venv/bin/python tools/memory_check.py [LAUNCHER OPTIONS...]

Measures the peak RSS (ru_maxrss) of a process that only imports TensorFlow, three times, then
runs `sync-mnist-cluster` with the given options (none: the default run) and prints each task's
peak (from its result record) and its excess over the median bare import. Exit 1 if any task
exceeds the budget (--budget-mb, default 120).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BARE = ("import resource, tensorflow; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mb", type=float, default=120.0,
                        help="allowed excess over bare import (default: 120)")
    args, launcher_args = parser.parse_known_args()
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"}  # as cli.py starts a task
    bare = [float(subprocess.run([sys.executable, "-c", BARE], capture_output=True, text=True,
                                 check=True, env=env).stdout) for _ in range(3)]
    base = statistics.median(bare)
    print(f"bare import tensorflow: {', '.join(f'{b:.0f}' for b in bare)} MB "
          f"(median {base:.0f})")
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "cluster.json"
        launcher = Path(sys.executable).with_name("sync-mnist-cluster")
        done = subprocess.run([str(launcher), *launcher_args, "--summary-json", str(summary)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        record = json.loads(summary.read_text())
    worst = 0.0
    for task in record["tasks"]:
        excess = task["peak_rss_mb"] - base
        worst = max(worst, excess)
        print(f"{task['role']} {task['index']}: peak {task['peak_rss_mb']:.0f} MB, "
              f"{excess:+.0f} MB over bare import")
    print(f"test_accuracy={record['test_accuracy']:.4f} wall={record['wall_s']:.1f} s; "
          f"worst excess {worst:+.0f} MB (budget {args.budget_mb:+.0f} MB)")
    return 0 if worst <= args.budget_mb else 1


if __name__ == "__main__":
    sys.exit(main())
