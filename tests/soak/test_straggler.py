"""Stragglers on demand (issue 12, part 2): the cap is really applied, and nothing is left.

One async run of ps + 2 workers in the testbed's namespaces, worker 1 capped at LINK_RATE each
way (tbf) and at CPU_SHARE of a core (cgroup v1 cpu). The kernel's own counters, read by the
command before it removes the testbed, must show both caps in place with the asked values and
the straggler's traffic through them; the straggler must train measurably slower than the
other worker; and afterwards no namespace, cgroup or process of the run may remain.
"""

from __future__ import annotations

import sys

import pytest

from procs import processes_mentioning, read_json
from lab import testbed

# Three TensorFlow processes and a capped link: about a minute on a loaded 2-core machine, an
# experiment's tooling rather than a behaviour of training, so in tests/soak (`make soak`).
LINK_RATE = "30mbit"  # 3.75 MB/s: a step's 2 x 1.08 MB takes the straggler ~0.6 s, not ~20 ms
CPU_SHARE = 0.8
STEPS = 20
MODEL_BYTES = 4 * (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10)  # float32 weights


@pytest.fixture
def can_build():
    try:
        testbed.check(cpu=True)
    except testbed.Unavailable as e:
        pytest.skip(f"no testbed here: {e}")


def test_a_capped_worker_is_slowed_through_its_caps_and_nothing_is_left(
        can_build, processes, tmp_path):
    marker = str(tmp_path / "data")  # in every task's command line
    out = tmp_path / "out"
    run = processes.start(
        [sys.executable, "-m", "lab.straggler", "--workers", "2", "--straggler", "1",
         "--slow-link", LINK_RATE, "--slow-cpu", str(CPU_SHARE), "--setups", "async",
         "--no-baseline", "--out", str(out), "--dataset", "synthetic", "--train-steps",
         str(STEPS), "--log-every", "5", "--timeout", "60", "--data-dir", marker],
        "straggler")
    assert run.wait(300) == 0, run.output
    record = read_json(out / "straggler.json")["records"][0]
    assert record["exit_code"] == 0, record

    slow, fast = record["links"]["worker 1"], record["links"]["worker 0"]
    rate = testbed.rate_bits(LINK_RATE)
    for direction in ("send_qdisc", "receive_qdisc"):
        assert slow[direction]["kind"] == "tbf" and slow[direction]["rate_bits"] == rate, slow
        assert fast[direction] is None, fast  # no one else is capped
    # Every step pulls the weights in and pushes a gradient out: at least STEPS x the model's
    # bytes each way went through the straggler's two tbf qdiscs.
    assert slow["receive_qdisc"]["bytes"] >= STEPS * MODEL_BYTES, slow
    assert slow["send_qdisc"]["bytes"] >= STEPS * MODEL_BYTES, slow
    # The CPU quota is the asked share, and the straggler's process ran inside the group.
    assert slow["cpu_quota_us"] == round(CPU_SHARE * testbed.CFS_PERIOD_US), slow
    assert slow["cpu_stat"]["nr_periods"] > 0, slow
    assert fast["cpu_quota_us"] is None, fast

    # In async mode nobody waits for the straggler: it alone is slow. At the cap a step needs
    # at least 2 x MODEL_BYTES / rate (0.57 s); uncapped, a step takes tens of milliseconds.
    workers = {t["index"]: t for t in record["cluster"]["tasks"] if t["role"] == "worker"}
    batch = 100
    assert workers[1]["examples_per_sec"] <= batch / (2 * MODEL_BYTES * 8 / rate) * 1.05, workers
    assert workers[1]["examples_per_sec"] < 0.5 * workers[0]["examples_per_sec"], workers

    assert testbed.leftovers() == []
    assert processes_mentioning(marker) == []
