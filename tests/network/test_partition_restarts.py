"""One task cut off by a partition past --timeout, one restart (issue 56, item 2).

The chaos harness's own partition (lab/chaos.py, lab/loopback_faults.py: in the launcher's
namespace, every packet of the victim process and of its port dropped) lands at update 20 and
lasts PAUSE s, 1.5 x --timeout, with --max-restarts 1. The other workers, past --timeout, say
their update waits for the victim and wait --restart-grace more; the launcher restarts the
victim, and only it; its replacement rejoins and the run ends verified. Before, every worker
timed out and was restarted (the victim at a charge, the others at none). Root only; skips,
saying why, elsewhere. `make test-network`, which .ci/run runs.
"""

from __future__ import annotations

import pytest

from lab import chaos, loopback_faults

TIMEOUT = 20.0
PAUSE = 1.5 * TIMEOUT


@pytest.fixture
def net_class():
    why = loopback_faults.unavailable()
    if why:
        pytest.skip(f"network faults: {why}")
    net = loopback_faults.NetClass()
    try:
        yield net
    finally:
        net.close()


@pytest.mark.parametrize("victim", ["worker 0", "worker 1"], ids=["the chief", "worker 1"])
def test_a_task_partitioned_past_the_timeout_is_the_one_task_restarted(victim, net_class,
                                                                        tmp_path):
    plan = chaos.Plan(run=1, ps=1, replicas=chaos.WORKERS, max_restarts=1, victim=victim,
                      fault="partition-long", phase="training", pause=PAUSE, at_step=20,
                      delay=0.0, timeout=TIMEOUT, train_steps=100, log_every=10)
    seen = chaos.run_one(plan, tmp_path, net_class=net_class)
    category, defects = chaos.classify(plan, seen)
    output = "\n".join(seen["lines"])

    assert seen["fault_landed"], output
    assert (seen["code"], category, defects) == (0, "restarted", []), output
    summary = seen["summary"]
    assert summary["restarts"] == {victim: 1}, output
    assert summary["synchronous"] is True and summary["contributions"] == [100] * 3
    assert "exited with code 200" not in output
