"""The verdict is pure arithmetic on the counters (verdict.py): no cluster, no session.

Each case is a reading the ps could give at the end of a run, and the verdict it must produce;
then the exit code it maps to, and the table of the run (report.py). The verdicts of whole
runs are in tests/cluster/test_verdict_runs.py.
"""

from __future__ import annotations

import re
import types

import pytest

from sync_mnist.task import report
from sync_mnist.core.config import EXIT_FAILED, EXIT_NOT_SYNCHRONOUS, EXIT_OK, EXIT_TIMEOUT
from sync_mnist.task.report import TaskResult
from sync_mnist.core.verdict import Counters, verify


def _counters(global_step, accepted, *, pushed=None, repeat=0, solo=0) -> Counters:
    return Counters(global_step=global_step, pushed=list(pushed or accepted),
                    accepted=list(accepted), repeat_updates=repeat, solo_updates=solo)


def _sync(counters: Counters, target: int, replicas: int):
    return verify(counters, mode="sync", target_steps=target, replicas_to_aggregate=replicas)


def test_unused_is_pushed_minus_accepted_per_worker():
    c = _counters(10, [8, 7, 8, 7], pushed=[10, 10, 9, 11])
    assert c.unused == [2, 3, 1, 4]


@pytest.mark.parametrize("steps", [1, 20, 600])
def test_lockstep_is_synchronous(steps):
    verdict = _sync(_counters(steps, [steps] * 3), target=steps, replicas=3)
    assert (verdict.synchronous, verdict.as_promised) == (True, True)
    assert verdict.line == (f"synchronous: each of {steps} updates averaged exactly one gradient "
                            f"from each of 3 workers; contributions [{steps}, {steps}, {steps}]")


def test_lockstep_with_gradients_left_over_at_the_end_is_still_synchronous():
    # A worker's last push may find no update to join; it is unused, not a break of lockstep.
    verdict = _sync(_counters(20, [20, 20, 20], pushed=[21, 20, 20]), target=20, replicas=3)
    assert verdict.synchronous is True


def test_the_questions_signature_is_not_synchronous():
    # One worker supplied all 3 gradients of every update: 60 of 60, the others none.
    counters = _counters(20, [60, 0, 0], repeat=20, solo=20)
    verdict = _sync(counters, target=20, replicas=3)
    assert (verdict.synchronous, verdict.as_promised) == (False, False)
    assert verdict.line.startswith("NOT synchronous: ")
    assert "contributions [60, 0, 0] are not 20 for every worker (off: workers 0, 1, 2)" \
        in verdict.line
    assert "20 of 20 updates averaged more than one gradient of the same worker" in verdict.line
    assert "20 updates were made of a single worker's gradients" in verdict.line
    assert "gradients averaged, not" not in verdict.line  # 60 == 3 x 20: the total is right


def test_one_worker_off_is_named_alone():
    verdict = _sync(_counters(20, [20, 19, 21]), target=20, replicas=3)
    assert verdict.synchronous is False
    assert "(off: workers 1, 2)" in verdict.line
    verdict = _sync(_counters(20, [20, 20, 21], pushed=[20, 20, 21]), target=20, replicas=3)
    assert "(off: worker 2)" in verdict.line
    assert "61 gradients averaged, not 3 x 20" in verdict.line


def test_global_step_short_of_target_is_not_synchronous():
    verdict = _sync(_counters(15, [15, 15, 15]), target=20, replicas=3)
    assert (verdict.synchronous, verdict.as_promised) == (False, False)
    assert verdict.line == "NOT synchronous: global_step 15 != 20 planned"


def test_repeat_updates_alone_are_not_synchronous():
    # Totals look perfect, but the update counter saw one worker twice in some updates.
    verdict = _sync(_counters(20, [20, 20, 20], repeat=2), target=20, replicas=3)
    assert (verdict.synchronous, verdict.as_promised) == (False, False)
    assert verdict.line == ("NOT synchronous: 2 of 20 updates averaged more than one gradient "
                            "of the same worker")


def test_backup_worker_run_is_synchronous_and_counts_the_unused():
    # R = 3 of N = 4: 3 x 10 = 30 accepted; each worker pushed 10, so 40 - 30 = 10 unused.
    counters = _counters(10, [8, 7, 8, 7], pushed=[10, 10, 10, 10])
    verdict = _sync(counters, target=10, replicas=3)
    assert (verdict.synchronous, verdict.as_promised) == (True, True)
    assert verdict.line.startswith("synchronous with 1 backup worker: ")
    assert "each of 10 updates averaged exactly 3 fresh gradients" in verdict.line
    # The unused total, then each worker's share of it.
    assert re.search(r"; 10 [a-z -]*\(w0 2, w1 3, w2 2, w3 3\)", verdict.line), verdict.line


def test_two_backup_workers_are_plural():
    counters = _counters(6, [3, 3, 3, 3], pushed=[6, 6, 6, 6])  # R = 2 of N = 4: 12 = 2 x 6
    verdict = _sync(counters, target=6, replicas=2)
    assert verdict.synchronous is True
    assert verdict.line.startswith("synchronous with 2 backup workers: ")
    assert re.search(r"; 12 [a-z -]*\(w0 3, w1 3, w2 3, w3 3\)", verdict.line), verdict.line


def test_backup_run_whose_accepted_total_is_not_r_times_global_step_is_not_synchronous():
    counters = _counters(10, [8, 8, 8, 8], pushed=[10, 10, 10, 10])  # 32 != 3 x 10
    verdict = _sync(counters, target=10, replicas=3)
    assert (verdict.synchronous, verdict.as_promised) == (False, False)
    assert verdict.line == "NOT synchronous: 32 gradients averaged, not 3 x 10"


def test_verdict_names_a_lost_backup_with_its_pushes():
    verdict = verify(_counters(30, [30, 30, 0], pushed=[31, 30, 17]), mode="sync",
                     target_steps=30, replicas_to_aggregate=2, lost=[2])
    assert verdict.synchronous
    assert verdict.line.startswith("synchronous with 1 backup worker: each of 30 updates")
    assert verdict.line.endswith("; worker 2 lost after 17 pushes")


def test_verdict_with_r_equal_n_stands_on_the_counters_when_a_worker_was_lost_at_the_end():
    verdict = verify(_counters(30, [30, 30]), mode="sync", target_steps=30,
                     replicas_to_aggregate=2, lost=[1])
    assert verdict.synchronous
    assert verdict.line.endswith("contributions [30, 30]; worker 1 lost after 30 pushes")


def test_async_run_that_kept_its_promise():
    # Async: every push is an update of its own, so global_step is the sum of local steps.
    counters = _counters(30, [10, 12, 8])
    verdict = verify(counters, mode="async", target_steps=10, replicas_to_aggregate=3)
    assert (verdict.synchronous, verdict.as_promised) == (False, True)
    assert verdict.line.startswith(
        "asynchronous (--mode async): global_step 30 = total local steps 30 [10, 12, 8]")


def test_async_run_whose_global_step_is_not_the_sum():
    counters = _counters(29, [10, 12, 8])
    verdict = verify(counters, mode="async", target_steps=10, replicas_to_aggregate=3)
    assert (verdict.synchronous, verdict.as_promised) == (False, False)
    assert "global_step 29 != total local steps 30 [10, 12, 8]" in verdict.line


# ---------------------------------------------------------------------------- report

@pytest.mark.parametrize("mode, synchronous, exit_code, expected", [
    ("sync", False, EXIT_OK, EXIT_NOT_SYNCHRONOUS),  # trained to the end, but not in lockstep
    ("sync", True, EXIT_OK, EXIT_OK),
    ("sync", None, EXIT_OK, EXIT_OK),  # a ps, which gives no verdict
    ("async", False, EXIT_OK, EXIT_OK),  # async is never synchronous, and promises not to be
    ("sync", False, EXIT_TIMEOUT, EXIT_TIMEOUT),  # a timeout stays a timeout
    ("sync", True, EXIT_FAILED, EXIT_FAILED),
])
def test_exit_code_for(mode, synchronous, exit_code, expected):
    result = TaskResult(role="worker", index=0, mode=mode, synchronous=synchronous,
                        exit_code=exit_code)
    assert report.exit_code_for(result) == expected


def test_format_table_has_a_row_per_task_with_its_numbers():
    reading = dict(contributions=[20, 20, 20], pushed=[21, 20, 22], dropped=[1, 0, 2])
    results = [
        TaskResult(role="worker", index=2, mode="sync", local_steps=22,
                   exit_code=EXIT_NOT_SYNCHRONOUS, examples_per_sec=987.6, ready_at=1002.25,
                   peak_rss_mb=781.4, **reading),
        TaskResult(role="ps", index=0, mode="sync", peak_rss_mb=756.6, **reading),
        TaskResult(role="worker", index=0, mode="sync", local_steps=21, examples_per_sec=1234.4,
                   ready_at=1000.0, **reading),
        TaskResult(role="worker", index=1, mode="sync", local_steps=20, exit_code=EXIT_TIMEOUT,
                   blocked=True, error="released by its timeout"),
    ]
    lines = report.format_table(results).splitlines()
    assert lines[0].split() == ["task", "exit", "ready", "local", "steps", "pushed", "accepted",
                                "unused", "examples/s", "peak", "MB", "note"]
    # Workers in index order, then the ps; columns: exit, ready (seconds after the chief),
    # local, pushed, accepted, unused, rate, peak memory, note.
    assert [line.split() for line in lines[1:]] == [
        ["worker", "0", "0", "+0.0s", "21", "21", "20", "1", "1234", "-"],
        ["worker", "1", str(EXIT_TIMEOUT), "-", "20", "20", "20", "0", "-", "-", "BLOCKED:",
         "released", "by", "its", "timeout"],
        ["worker", "2", str(EXIT_NOT_SYNCHRONOUS), "+2.2s", "22", "22", "20", "2", "988", "781"],
        ["ps", "0", "0", "757"],
    ]


def test_format_table_shows_a_worker_ready_before_the_chief_with_its_sign():
    results = [TaskResult(role="worker", index=0, mode="sync", ready_at=1000.0),
               TaskResult(role="worker", index=1, mode="sync", ready_at=999.2)]
    assert report.format_table(results).splitlines()[2].split()[3] == "-0.8s"


def test_format_table_without_a_counter_reading_shows_dashes():
    results = [TaskResult(role="worker", index=0, mode="sync", exit_code=EXIT_TIMEOUT)]
    assert report.format_table(results).splitlines()[1].split() == \
        ["worker", "0", str(EXIT_TIMEOUT), "-", "-", "-", "-", "-", "-", "-"]


def test_table_gains_a_restarts_column_only_when_a_task_was_restarted():
    results = [TaskResult(role="worker", index=0, mode="sync", local_steps=30),
               TaskResult(role="worker", index=1, mode="sync", local_steps=12, restarts=1),
               TaskResult(role="ps", index=0, mode="sync")]
    lines = report.format_table(results).splitlines()
    assert lines[0].split()[:4] == ["task", "exit", "restarts", "ready"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["worker", "0", "0", "0"], ["worker", "1", "0", "1"], ["ps", "0", "0", "0"]]
    results[1].restarts = 0
    assert "restarts" not in report.format_table(results)


def test_a_restarted_worker_is_ready_at_its_first_life_and_its_restart_is_a_note():
    # Before: worker 2, SIGKILLed and restarted, showed +75.0s and the run ready_lag=75.00 s,
    # and its 1,398 local steps (its last life's) stood beside 2,401 pushed (every life's).
    reading = dict(contributions=[2400, 2400, 2400], pushed=[2400, 2400, 2401],
                   dropped=[0, 0, 1])
    results = [
        TaskResult(role="worker", index=0, mode="sync", local_steps=2400, ready_at=1000.0,
                   start_step=0, **reading),
        TaskResult(role="worker", index=1, mode="sync", local_steps=2400, ready_at=1000.3,
                   start_step=0, **reading),
        TaskResult(role="worker", index=2, mode="sync", local_steps=1398, ready_at=1075.0,
                   first_ready_at=1000.2, start_step=1002, restarts=1, **reading),
        TaskResult(role="ps", index=0, mode="sync"),
    ]
    lines = report.format_table(results).splitlines()
    row = lines[3]
    assert row.split()[:9] == ["worker", "2", "0", "1", "+0.2s", "1398", "2401", "2400", "1"]
    assert row.endswith("restarted: ready again at +75.0s; local steps are its last life's, "
                        "from local step 1002, pushed and accepted every life's")
    assert "restarted" not in lines[1] + lines[2]
    tasks = [types.SimpleNamespace(role="worker", index=i, restarts=int(i == 2), pids=[i],
                                   exited_at=None, spent=False, lost=False) for i in range(3)]
    summary = report.cluster_summary(results, tasks, wall=80.0)
    assert summary["ready_lag_s"] == pytest.approx(0.3)
    assert summary["ready_after_chief_s"] == pytest.approx([0.0, 0.3, 0.2])
    # A chief ready last holds up the others: the lag says so (it read 0 s when it counted
    # from the chief).
    results[0].ready_at = 1002.0
    summary = report.cluster_summary(results, tasks, wall=80.0)
    assert summary["ready_lag_s"] == pytest.approx(1.8)
    assert summary["ready_after_chief_s"] == pytest.approx([0.0, -1.7, -1.8])
