"""The suite's CPU budget (tests/budget.py): a tier over its budget fails the run, naming its
costliest tests; within it, the run passes and says where it stands."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BURN = '''
import resource


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_burns_half_a_second():
    start = _cpu()
    while _cpu() - start < 0.5:
        sum(range(10_000))


def test_is_cheap():
    assert True
'''


def _run(tmp_path: Path, budget: float) -> subprocess.CompletedProcess:
    tier = tmp_path / "tests" / "fast"
    tier.mkdir(parents=True, exist_ok=True)
    (tier / "test_burn.py").write_text(BURN)
    (tmp_path / "tests" / "conftest.py").write_text(
        f"from tests import budget\n\nbudget.BUDGETS['fast'] = {budget}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.budget",
         "--cpu-budget", "tests/fast"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def test_a_tier_over_its_budget_fails_the_run_naming_its_costliest_tests(tmp_path):
    run = _run(tmp_path, budget=0.3)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    over = [line for line in run.stdout.splitlines() if line.startswith("over budget: ")]
    assert len(over) == 1, run.stdout
    assert "the fast tier took " in over[0] and "over its budget of 0.3 s" in over[0]
    costliest = over[0].split("its costliest tests: ")[1].split(", ")
    assert costliest[0].startswith("tests/fast/test_burn.py::test_burns_half_a_second ")
    assert float(costliest[0].split()[-2]) >= 0.5  # "... 0.5 s"
    assert costliest[1].startswith("tests/fast/test_burn.py::test_is_cheap ")


def test_a_tier_within_its_budget_passes_and_says_where_it_stands(tmp_path):
    run = _run(tmp_path, budget=30.0)
    assert run.returncode == 0, run.stdout + run.stderr
    line = next(line for line in run.stdout.splitlines() if line.startswith("CPU by tier: "))
    spent = float(line.split("fast ")[1].split(" s of ")[0])
    assert 0.5 <= spent < 30 and line.endswith(" s of 30.0")
    assert "over budget" not in run.stdout
