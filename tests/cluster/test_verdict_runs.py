"""The verdict can fail: the question's setup, backup workers, and counters over time.

Whole clusters through the real command line (separate processes, free ports, synthetic data).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from conftest import QUESTION_TIMEOUT, SHARED_STEPS
from procs import processes_mentioning, read_json
from sync_mnist.launcher import cli as launcher_cli

BOUND = 240  # seconds a whole small cluster run may take on a loaded 2-core machine


def _launch(processes, tmp_path, *args):
    marker = str(tmp_path / "data")  # in every task's command line, to find leftovers
    launcher = processes.launcher("--base-port", "0", "--dataset", "synthetic", "--data-dir",
                                  marker, "--summary-json", str(tmp_path / "cluster.json"),
                                  *args)
    code = launcher.wait(BOUND)
    assert processes_mentioning(marker) == [], "the launcher left processes behind"
    return code, launcher, read_json(tmp_path / "cluster.json")


def test_question_setup_is_measured_not_synchronous(question_run):
    code, launcher, s = question_run.code, question_run, question_run.summary
    assert question_run.leftovers == [], "the launcher left processes behind"

    assert code == 3, launcher.output  # ran, but not synchronous
    assert s["synchronous"] is False
    assert s["verdict"].startswith("NOT synchronous")
    # The chief trained alone: every update was made of its gradients only, R = 3 at a time.
    steps = s["global_step"]
    assert steps >= 1
    assert s["contributions"] == [3 * steps, 0, 0]
    assert s["solo_updates"] == steps
    # The others waited out Supervisor's 30 s readiness poll, then blocked on the token queue,
    # and the ps was still in server.join() when the launcher stopped it.
    # (The launcher starts the chief only once they wait, so their first check always fails.)
    assert s["chief_wait_s"][1] >= 29 and s["chief_wait_s"][2] >= 29
    assert sorted(s["blocked"]) == ["ps 0", "worker 1", "worker 2"]
    assert f"blocked for {QUESTION_TIMEOUT} s on the token queue" in launcher.output


def test_fixed_setup_with_the_same_options_is_synchronous(fixed_run):
    # The shared run (conftest.py): the same cluster, data, steps, --timeout and --log-every
    # as the question's run above.
    s = fixed_run.summary
    assert fixed_run.code == 0, fixed_run.output
    assert s["synchronous"] is True and s["verdicts_agree"] is True
    assert s["contributions"] == [SHARED_STEPS] * 3
    assert s["solo_updates"] == 0
    assert s["blocked"] == []
    # The non-chief workers poll every 0.25 s, so they are ready well within a second.
    assert max(s["ready_after_chief_s"]) < 5


def test_backup_worker_counts_add_up_and_the_target_stops_every_task(processes, tmp_path):
    # One run for two behaviours, to save a cluster's start-up: a backup worker's accounting,
    # and --target-accuracy through the launcher (tests/inprocess/test_early_stop.py checks the
    # stop's arithmetic in-process, in lockstep and with backups).
    planned = 400
    code, launcher, s = _launch(processes, tmp_path, "--workers", "3",
                                "--replicas-to-aggregate", "2", "--train-steps", str(planned),
                                "--eval-every", "5", "--target-accuracy", "0.99",
                                "--timeout", "60", "--log-every", "10")

    assert code == 0, launcher.output
    steps = s["global_step"]
    # The stop: the first evaluation reaching 0.99 (synthetic digits are easy), then every
    # worker stopped on the same update, the first made after the chief's request.
    assert s["stop_step"] == steps < planned
    assert s["updates_to_target"] < steps and s["accuracy_at_target"] >= 0.99
    assert s["time_to_target_s"] > 0
    workers = [t for t in s["tasks"] if t["role"] == "worker"]
    assert [t["last_token"] for t in workers] == [steps] * 3
    assert (f"target: test_accuracy {s['accuracy_at_target']:.4f} >= 0.99 at global_step "
            f"{s['updates_to_target']}") in launcher.output
    assert f"every worker stopped on update {steps} of {planned} planned" in launcher.output
    # Two independent counts of the same pushes: the ps's `pushed`, and each worker's own count
    # of the steps it ran.
    assert s["pushed"] == s["local_steps"]
    # The updates' own count against the optimizer's: every one of the updates averaged at
    # least R = 2 gradients, more only when they raced the update, and the verdict says which,
    # with the total.
    total = sum(s["contributions"])
    assert total >= 2 * steps
    if total == 2 * steps:
        assert f"each of {steps} updates averaged exactly 2 fresh gradients;" in s["verdict"]
    else:
        assert "averaged at least 2 fresh gradients (" in s["verdict"]
        assert f": {total} in all)" in s["verdict"]
    # The ps read its counters after every worker had reported done; the workers read theirs
    # after the finish barrier. Both readings must be the same final one.
    ps = next(t for t in s["tasks"] if t["role"] == "ps")
    assert (ps["global_step"], ps["contributions"], ps["pushed"]) == (
        s["global_step"], s["contributions"], s["pushed"])
    assert all(local >= 1 for local in s["local_steps"])
    assert s["verdict"].startswith("synchronous with 1 backup worker")
    assert all(t["exit_code"] == 0 for t in s["tasks"])
    assert launcher.output.rstrip().endswith("exit code 0 (done; in sync mode, verified "
                                             "synchronous)")


def test_counters_are_written_as_summaries_over_time(fixed_run):
    assert fixed_run.code == 0, fixed_run.output
    accepted: dict[int, list[float]] = {w: [] for w in range(3)}
    for path in fixed_run.logdir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag.startswith("sync/accepted/worker"):
                    accepted[int(value.tag[-1])].append(value.simple_value)
    # Logged every 10 local steps: the counters grow with global_step, equal for all workers.
    assert accepted[0] == accepted[1] == accepted[2]
    assert accepted[0][-1] == SHARED_STEPS
    assert len(set(accepted[0])) >= 3  # visible over time, not only at the end


@pytest.mark.parametrize("value, fragment", [
    ("4", "--replicas-to-aggregate 4 is outside 1-3 (3 workers)"),
    ("0", "--replicas-to-aggregate 0 is outside 1-3 (3 workers)"),
    ("1.5", "'1.5' is not a whole number"),
])
def test_replicas_to_aggregate_outside_the_cluster_is_a_usage_error(value, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        code = launcher_cli.main(["--replicas-to-aggregate", value, "--dataset", "synthetic"])
        raise SystemExit(code)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
