"""An Estimator program over TFRecord files (examples/your_data/files_tf1.py) after the change
docs/model-reference.md ("Your data") shows: its lines counted, and the result trained through the
real command line, verified, from files of unequal size, where the first worker's input ends."""

from __future__ import annotations

import shutil
import subprocess
import sys

from procs import ROOT, processes_mentioning, read_json
from sync_mnist.core.config import EXIT_OK

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
EXAMPLE = ROOT / "examples" / "your_data"


def _changed_lines(before: list[str], after: list[str]) -> int:
    """Lines of `before` that `after` removes or replaces, plus lines it adds beyond them."""
    import difflib

    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
               if tag != "equal")


def test_the_estimator_program_over_files_trains_after_the_documented_change(processes,
                                                                              tmp_path):
    original = (EXAMPLE / "files_tf1.py").read_text().splitlines()
    migrated = (EXAMPLE / "files_migrated.py").read_text().splitlines()
    cut = "def train_input_fn():", "def train_input_fn(params):"
    start = original.index("import glob"), migrated.index("import glob")  # after the docstrings
    # The imports and the model function; then the input functions and the driver.
    assert _changed_lines(original[start[0]:original.index(cut[0])],
                          migrated[start[1]:migrated.index(cut[1])]) == 9
    assert _changed_lines(original[original.index(cut[0]):],
                          migrated[migrated.index(cut[1]):]) == 8

    shutil.copy(EXAMPLE / "files_migrated.py", tmp_path / "files_migrated.py")
    subprocess.run([sys.executable, str(EXAMPLE / "write_files.py"), str(tmp_path / "data")],
                   check=True, capture_output=True, timeout=120)
    summary = tmp_path / "cluster.json"
    launcher = processes.launcher(
        "--model", f"{tmp_path / 'files_migrated.py'}:MODEL", "--base-port", "0", "--isolate",
        "off", "--workers", "2", "--epochs", "2", "--batch-size", "50", "--log-every", "10",
        "--timeout", "60", "--summary-json", str(summary))

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    record = read_json(summary)
    # By file: worker 0 reads files 0 and 2 (1,600 examples), worker 1 files 1 and 3 (1,400:
    # 28 batches of 50 a pass); its second pass ends first, on update 56.
    assert record["synchronous"] is True and record["contributions"] == [56, 56]
    assert record["test_metrics"]["accuracy"] > 0.9
    launcher.wait_for_line(r"\[worker 0\] test_accuracy=\S+ test_loss=\S+ on 500 evaluation "
                           r"examples", 1)
    assert processes_mentioning(str(tmp_path)) == []
