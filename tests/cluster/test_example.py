"""examples/question_fixed.py, the question's own program made synchronous by hand, run as
processes; and examples/question_library.py, made so through sync_mnist.library in 6 changed
lines (its runs, killed and restarted on the way: tests/recovery/test_library_form.py).

The example is standalone: it reads MNIST's IDX files itself. The test gives it a small set of
generated digits in that format, so that a run takes a few dozen synchronous steps.
"""

from __future__ import annotations

import difflib
import gzip
import py_compile
import re
import struct
import subprocess

import numpy as np
import pytest

from procs import ROOT, processes_mentioning
from sync_mnist.core.cluster import free_ports

EXAMPLES = ROOT / "examples"
BOUND = 400  # seconds: four TensorFlow processes on a loaded 2-core machine, plus a 30 s poll
TRAIN, TEST, EPOCHS = 1200, 200, 2  # 12 batches of 100 per epoch


def _write_idx(data_dir, kind: str, images: np.ndarray, labels: np.ndarray) -> None:
    with gzip.open(data_dir / f"{kind}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, len(images), 28, 28) + images.tobytes())
    with gzip.open(data_dir / f"{kind}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, len(labels)) + labels.tobytes())


@pytest.fixture
def digits(tmp_path):
    """Noisy copies of 10 random prototypes, in MNIST's IDX .gz format."""
    rng = np.random.default_rng(0)
    prototypes = rng.integers(0, 256, (10, 28, 28))
    for kind, n in (("train", TRAIN), ("t10k", TEST)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = np.clip(prototypes[labels] + rng.integers(-60, 60, (n, 28, 28)), 0, 255)
        _write_idx(tmp_path, kind, images.astype(np.uint8), labels)
    return tmp_path


def test_fixed_example_runs_in_lockstep_and_every_task_ends(digits, processes):
    ports = free_ports(4)
    launcher = processes.start(
        [str(EXAMPLES / "run_question_fixed.sh"), "--ps-hosts", f"localhost:{ports[0]}",
         "--worker-hosts", ",".join(f"localhost:{p}" for p in ports[1:]),
         "--data-dir", str(digits), "--epochs", str(EPOCHS), "--timeout", "120"], "example")
    # The script exits once all four tasks have, the ps included: 0 only if each exited 0.
    assert launcher.wait(BOUND) == 0, launcher.output[-5000:]
    steps = EPOCHS * TRAIN // 100
    for task in range(3):
        # Each worker ran every step, the cluster made exactly one update per step (so each
        # update averaged 3 gradients), and after its k-th step global_step was k.
        assert f"worker {task}: local_steps={steps} global_step={steps} lockstep=True" in \
            launcher.output, launcher.output[-5000:]
    accuracies = set(re.findall(r"worker \d: test accuracy ([\d.]+)", launcher.output))
    assert len(accuracies) == 1  # all evaluate the same final weights
    assert processes_mentioning(str(digits)) == []


def _code_lines(name: str) -> list[str]:
    """The program's lines after its docstring."""
    lines = (EXAMPLES / name).read_text().splitlines()
    return lines[lines.index("import argparse"):]


def test_the_library_form_changes_6_lines():
    # Its run, to its verified end with a worker and the chief killed and restarted on the
    # way: tests/recovery/test_library_form.py.
    original, library = _code_lines("question_original.py"), _code_lines("question_library.py")
    matcher = difflib.SequenceMatcher(a=original, b=library, autojunk=False)
    changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
                  if tag != "equal")
    assert changed == 6  # docs/fix-your-own-program.md says so


def test_original_compiles(tmp_path):
    for name in ("question_original.py", "question_fixed.py", "question_library.py"):
        py_compile.compile(str(EXAMPLES / name), cfile=str(tmp_path / f"{name}c"), doraise=True)


def test_doc_shows_the_real_diff():
    """docs/fix-your-own-program.md shows every hunk of the diff between the files as they are."""
    original = (EXAMPLES / "question_original.py").read_text().splitlines(keepends=True)
    fixed = (EXAMPLES / "question_fixed.py").read_text().splitlines(keepends=True)
    diff = "".join(difflib.unified_diff(original, fixed, n=1))
    hunks = ["@@" + hunk for hunk in diff.split("\n@@")[1:]]
    doc = (ROOT / "docs" / "fix-your-own-program.md").read_text()
    assert len(hunks) > 5
    missing = [hunk.splitlines()[0] for hunk in hunks if hunk.rstrip("\n") not in doc]
    assert missing == [], "the doc's diff is out of date (diff -U1 the two files)"


def test_fixed_example_needs_nothing_of_sync_mnist():
    """Standalone: the example imports only TensorFlow, NumPy and the standard library."""
    source = (EXAMPLES / "question_fixed.py").read_text()
    imports = set(re.findall(r"^(?:import|from) ([\w.]+)", source, re.M))
    assert imports == {"argparse", "gzip", "os", "numpy", "tensorflow.compat.v1"}
    assert subprocess.run(["sh", "-n", str(EXAMPLES / "run_question_fixed.sh")]).returncode == 0
