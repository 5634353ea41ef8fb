"""Faults (issue 4, scenarios 3-6), the long runs: a task killed, then restarted or not.

As tests/recovery/test_faults.py, whose quicker cases run in `make test-recovery`: the real
command line in separate processes on synthetic data, a kill at a step read from the logs, never after a
fixed sleep. Here (`make soak`): a worker restarted by hand (3), the chief restarted (4), the ps
restarted (5), not restarted, or restarted with no checkpoint to restore. The frozen worker the
launcher kills and restarts (6) is in tests/recovery/test_faults.py.
"""

from __future__ import annotations

import time

from hand_cluster import BOUND, COMMON, Cluster, wait_for_step
from procs import processes_mentioning
from sync_mnist.core.config import EXIT_FAILED, EXIT_TIMEOUT


def test_killed_worker_restarted_by_hand_rejoins_in_lockstep(processes, tmp_path):
    steps = 200
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "120")
    cluster.start_all(2)
    wait_for_step(cluster.tasks["worker", 1], 20)
    cluster.tasks["worker", 1].kill()
    cluster.start("worker", 1)  # the same flags

    codes = cluster.wait_all()
    assert set(codes.values()) == {0}, {k: p.output for k, p in cluster.tasks.items()}
    restarted = cluster.record("worker", 1)
    # Exact lockstep again: the restarted worker took up its predecessor's place.
    assert restarted["contributions"] == [steps, steps]
    assert restarted["local_steps"] == steps - restarted["start_step"]
    assert restarted["synchronous"] is True, restarted["verdict"]
    assert cluster.record("worker", 0)["verdict"] == restarted["verdict"]
    assert processes_mentioning(cluster.marker) == []


def test_killed_chief_restarted_continues_from_the_ps(processes, tmp_path):
    steps = 200
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "120")
    cluster.start_all(2)
    wait_for_step(cluster.tasks["worker", 0], 20)
    cluster.tasks["worker", 0].kill()
    cluster.start("worker", 0)

    codes = cluster.wait_all()
    assert set(codes.values()) == {0}, {k: p.output for k, p in cluster.tasks.items()}
    chief = cluster.record("worker", 0)
    assert chief["start_step"] > 0  # it went on from where the ps was, not from 0
    cluster.tasks["worker", 0].wait_for_line(r"the model was already on the ps", 1)
    # One new queue runner and no extra tokens: still exactly one gradient per worker per
    # update (a doubled token would show as a repeated update and fail the verdict).
    assert chief["contributions"] == [steps, steps]
    assert chief["global_step"] == steps
    assert chief["synchronous"] is True, chief["verdict"]
    assert processes_mentioning(cluster.marker) == []


def test_killed_ps_restarted_is_restored_from_the_checkpoint(processes, tmp_path):
    steps, logdir = 200, tmp_path / "logdir"
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", str(steps), "--timeout", "120",
                      "--logdir", str(logdir), "--save-steps", "25")
    cluster.start_all(2)
    wait_for_step(cluster.tasks["worker", 0], 30)  # past the checkpoint at 25
    cluster.tasks["ps", 0].kill()
    cluster.start("ps", 0)

    codes = cluster.wait_all()
    assert set(codes.values()) == {0}, {k: p.output for k, p in cluster.tasks.items()}
    chief = cluster.record("worker", 0)
    assert chief["sessions"] == 2  # one more session, on the restarted ps
    cluster.tasks["worker", 0].wait_for_line(r"global_step went back from \d+ to \d+", 1)
    assert chief["contributions"] == [steps, steps]
    assert chief["global_step"] == steps
    assert chief["synchronous"] is True, chief["verdict"]
    assert processes_mentioning(cluster.marker) == []


def test_killed_ps_not_restarted_ends_every_worker_with_a_clear_error(processes, tmp_path):
    timeout = 10
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", "10000", "--timeout",
                      str(timeout))
    cluster.start_all(2)
    wait_for_step(cluster.tasks["worker", 0], 20)
    killed_at = time.monotonic()
    cluster.tasks["ps", 0].kill()
    for index in (0, 1):
        worker = cluster.tasks["worker", index]
        assert worker.wait(timeout + 60) == EXIT_TIMEOUT, worker.output
        worker.wait_for_line(r"lost the ps mid-run and it did not come back: ps 0 at "
                             r"\S+ is unreachable", 1)
    assert time.monotonic() - killed_at < 2 * timeout + 30
    assert processes_mentioning(cluster.marker) == []


def test_killed_ps_restarted_without_a_checkpoint_is_an_error_not_a_fresh_start(processes,
                                                                              tmp_path):
    cluster = Cluster(processes, tmp_path, 2, "--train-steps", "10000", "--timeout", "60")
    cluster.start_all(2)
    wait_for_step(cluster.tasks["worker", 0], 20)
    cluster.tasks["ps", 0].kill()
    cluster.start("ps", 0)
    chief = cluster.tasks["worker", 0]
    assert chief.wait(BOUND) == EXIT_FAILED, chief.output
    assert chief.lines[-1].endswith(
        "failed: ModelLost: the ps was restarted and has lost the model, and there is no "
        "checkpoint to restore it from (give the chief --logdir)")
