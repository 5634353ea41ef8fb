"""A silent partition of one worker, shorter and longer than --timeout (issue 35, item 3).

On the testbed (lab/testbed.py): a namespace and a veth per task, a bridge
between them. Mid-run, chosen from the chief's progress line, the switch drops every frame to
and from worker 1 (nftables, `testbed.partition`): its link stays up, nothing answers, no
error reaches either side, the case a TCP connection notices last.
  - Shorter than --timeout, then healed: the run waits it out and ends verified, every task 0.
  - Longer: every task ends within --timeout plus a slack with a retryable code (200 or 201),
    the others naming worker 1; the cut-off worker too. Never a hang.
The longer forms (the ps or the chief partitioned, packet loss, a slow CPU) are in
tests/soak/test_network_soak.py. Root only; skips, saying why, elsewhere. `make test-network`,
which .ci/run runs after `make test`.
"""

from __future__ import annotations

import re
import time

import pytest

import lan_cluster
from procs import processes_mentioning

TIMEOUT = 12  # --timeout
SHORT = 5  # a partition shorter than TIMEOUT (TCP's retransmission backoff reaches 3.2 s)
# Allowed after a partition's start on top of --timeout: a task's timeout message reads the
# counters (up to 5 s), and the machine is loaded by other clusters.
SLACK = 20
START_BOUND = 120  # until the chief's progress line: TensorFlow start-up on a loaded box
AT = 20  # the chief's local step whose progress line starts the partition


@pytest.fixture
def lan():
    yield from lan_cluster.lan_fixture(num_ps=1, num_workers=2)


def _partition_at_step(run: lan_cluster.LanCluster) -> float:
    run.procs["worker", 0].wait_for_line(rf"\[worker 0\] step={AT} ", START_BOUND)
    run.bed.partition("worker", 1)
    return time.monotonic()


def test_a_partition_shorter_than_the_timeout_is_waited_out_and_the_run_verified(
        lan, processes, tmp_path):
    steps = 60  # R = N: every update after the partition's start waits for worker 1
    run = lan_cluster.start(lan, processes, tmp_path, "--timeout", str(TIMEOUT),
                            "--train-steps", str(steps))
    started = _partition_at_step(run)
    # Proof that the partition bit: frames were dropped while it stood.
    deadline = started + SHORT
    while time.monotonic() < deadline:
        time.sleep(0.2)
    dropped = lan.dropped("worker", 1)
    lan.heal("worker", 1)
    ended = run.ended_by(started + SHORT + TIMEOUT + SLACK)

    assert dropped > 0, "the partition dropped nothing"
    assert {t: e[0] for t, e in ended.items()} == {t: 0 for t in run.procs}, (
        run.describe(ended, started), run.tails())
    chief = run.record("worker", 0)
    assert chief["synchronous"] and chief["global_step"] == steps, chief["verdict"]
    assert processes_mentioning(str(tmp_path / "data")) == []


def test_a_partition_longer_than_the_timeout_ends_every_task_retryably_naming_it(
        lan, processes, tmp_path):
    run = lan_cluster.start(lan, processes, tmp_path, "--timeout", str(TIMEOUT),
                            "--train-steps", "100000")
    started = _partition_at_step(run)
    ended = run.ended_by(started + TIMEOUT + SLACK)
    print(f"\n{run.describe(ended, started)}; frames dropped: {lan.dropped('worker', 1)}")

    assert len(ended) == len(run.procs), (
        f"still running {TIMEOUT + SLACK} s into the partition: {run.describe(ended, started)}",
        run.tails())
    codes = {t: e[0] for t, e in ended.items()}
    assert set(codes.values()) <= set(lan_cluster.RETRYABLE), (codes, run.tails())
    for task in (("ps", 0), ("worker", 0)):
        error = run.record(*task)["error"] or ""
        assert re.search(r"\bworker 1\b", error), (task, error)
    assert run.record("worker", 1)["error"], run.record("worker", 1)
    assert processes_mentioning(str(tmp_path / "data")) == []
