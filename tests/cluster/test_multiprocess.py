"""The launcher's shared run, through the real command line: separate processes, synthetic
data (a worker that starts late, by hand: tests/recovery/test_late_worker.py)."""

from __future__ import annotations

import pytest

from conftest import SHARED_STEPS


def test_launcher_runs_in_lockstep_and_leaves_nothing_behind(fixed_run):
    steps = SHARED_STEPS
    assert fixed_run.code == 0, fixed_run.output
    summary = fixed_run.summary
    assert summary["global_step"] == steps
    assert summary["contributions"] == [steps] * 3
    assert summary["local_steps"] == [steps] * 3
    assert summary["dropped"] == [0, 0, 0]
    assert summary["synchronous"] is True
    assert [t["exit_code"] for t in summary["tasks"]] == [0, 0, 0, 0]
    assert summary["test_accuracy"] > 0.9  # synthetic data is easy; chance is 0.1
    assert f"verification: synchronous: each of {steps} updates" in fixed_run.output
    # Each task's output is tagged with its identity.
    for tag in ("[ps 0]", "[worker 0]", "[worker 1]", "[worker 2]"):
        assert tag in fixed_run.output
    assert fixed_run.leftovers == []  # no task mentioning the run's --data-dir is alive


@pytest.mark.usefixtures("fixed_run")
def test_the_shared_runs_are_one_group_under_xdist(request):
    # Under `make test` (--dist loadgroup) every test of the shared runs must go to one test
    # process, or each process starts its own copy of each run (conftest.py).
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@shared_runs"), request.node.nodeid


