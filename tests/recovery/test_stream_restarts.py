"""Each example once per epoch through restarts, with a streamed input (core/stream.py): the
model counts how often each example was used (tests/stream_model.py), read from the final
checkpoint. A worker's input position follows from the update it rejoins: were a restarted
worker to begin its files again, the examples before the kill would count twice.
"""

from __future__ import annotations

import os
import signal

import tensorflow as tf

import stream_model
from procs import processes_mentioning, read_json
from sync_mnist.core.config import EXIT_OK, EXIT_PREEMPTED

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
SIZES = [600] * 4  # 2,400 examples: 300 batches of 4 per worker, files 0 and 2 to worker 0
EXAMPLES, UPDATES = sum(SIZES), sum(SIZES) // 2 // 4


def _launch(processes, tmp_path, spec: str, run: int, *extra: str, epochs: int = 1):
    """A run of the model with Adam (its count by SGD), each id's uses counted by the ps."""
    summary = tmp_path / f"cluster-{run}.json"
    launcher = processes.launcher(
        "--model", spec.replace(":MODEL", ":ADAM"), "--base-port", "0", "--isolate", "off",
        "--workers", "2", "--epochs", str(epochs), "--batch-size", "4", "--log-every", "10",
        "--timeout", "60", "--logdir", str(tmp_path / "logdir"), "--summary-json", str(summary),
        "--count-examples", "id", *extra)
    return launcher, summary


def _signal_worker_1_at_step(launcher, signum, step: int = 30) -> None:
    pid = int(launcher.wait_for_line(r"started worker 1 \(pid (\d+)\)", BOUND)[1])
    launcher.wait_for_line(rf"\[worker 1\] step={step} ", BOUND)
    os.kill(pid, signum)


def _every_example_used_once(tmp_path, record: dict, epochs: int = 1) -> None:
    """Counted twice: by the model's own count, and by the ps (--count-examples, whatever the
    optimizer), which the data verdict reports pass by pass."""
    uses = stream_model.uses(tf.train.latest_checkpoint(str(tmp_path / "logdir")), 2)
    assert uses[:EXAMPLES].tolist() == [epochs] * EXAMPLES, {
        "more": int((uses > epochs).sum()), "fewer": int((uses[:EXAMPLES] < epochs).sum())}
    assert record["data_covered"] is True, record["data_verdict"]
    passes = "pass 1" if epochs == 1 else f"passes 1-{epochs}"
    assert record["data_verdict"].endswith(
        f"ids of id: each of {EXAMPLES:,} used exactly once in {passes}; "
        f"{EXAMPLES * epochs:,} uses, one for each example used"), record["data_verdict"]


def test_a_worker_killed_mid_epoch_and_restarted_uses_each_example_once(processes, tmp_path):
    spec = stream_model.place(tmp_path / "data", SIZES)
    launcher, summary = _launch(processes, tmp_path, spec, 1, "--max-restarts", "1")
    _signal_worker_1_at_step(launcher, signal.SIGKILL)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"worker 1 exited with code -9; restarting it", 1)
    start = int(launcher.wait_for_line(
        r"\[worker 1\] starting my input at batch (\d+) \(reading past", 1)[1])
    assert 30 <= start < UPDATES  # before its first saved position (256): from the start
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [UPDATES, UPDATES]
    _every_example_used_once(tmp_path, record)
    assert processes_mentioning(str(tmp_path)) == []


def test_a_preemption_mid_epoch_and_the_rerun_use_each_example_once(processes, tmp_path):
    spec = stream_model.place(tmp_path / "data", SIZES)
    launcher, summary = _launch(processes, tmp_path, spec, 1, "--save-steps", "1000")
    _signal_worker_1_at_step(launcher, signal.SIGTERM, 280)
    assert launcher.wait(BOUND) == EXIT_PREEMPTED, launcher.output
    stop = read_json(summary)["preempted_at"]
    assert 280 < stop < UPDATES, launcher.output

    launcher, summary = _launch(processes, tmp_path, spec, 2)
    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    # Its input's position at batch 256 was saved with the checkpoint: the rerun reads from
    # there, not from the start (issue 55).
    launcher.wait_for_line(rf"\[worker 1\] starting my input at batch {stop}: from its "
                           rf"position saved at batch 256, reading the {stop - 256} batches "
                           "since", 1)
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [UPDATES, UPDATES]
    _every_example_used_once(tmp_path, record)
    assert processes_mentioning(str(tmp_path)) == []


def test_a_worker_killed_late_in_its_epoch_reads_from_its_saved_position(processes,
                                                                        tmp_path):
    """Killed past batch 256 (stream.POSITION_EVERY), the restarted worker restores its input
    from the position saved on the ps and reads only the batches since (issue 55)."""
    spec = stream_model.place(tmp_path / "data", SIZES)
    launcher, summary = _launch(processes, tmp_path, spec, 1, "--max-restarts", "1")
    _signal_worker_1_at_step(launcher, signal.SIGKILL, 280)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"worker 1 exited with code -9; restarting it", 1)
    start, since = map(int, launcher.wait_for_line(
        r"\[worker 1\] starting my input at batch (\d+): from its position saved at batch "
        r"256, reading the (\d+) batches since", 1).groups())
    assert 280 <= start < UPDATES and since == start - 256
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [UPDATES, UPDATES]
    _every_example_used_once(tmp_path, record)
    assert processes_mentioning(str(tmp_path)) == []


def test_the_ps_killed_in_the_second_pass_and_restored_uses_each_example_once_a_pass(
        processes, tmp_path):
    """The updates since the last checkpoint are lost with the ps and made again: each from the
    batches of its own number, so every example counts in one update a pass. Killed in pass 2,
    the workers go back to the checkpoint's update, their input from the position saved in
    pass 1 (batch 256) and on across the pass's end (batch 300)."""
    spec = stream_model.place(tmp_path / "data", SIZES)
    launcher, summary = _launch(processes, tmp_path, spec, 1, "--max-restarts", "1",
                                "--save-steps", "25", epochs=2)
    pid = int(launcher.wait_for_line(r"started ps 0 \(pid (\d+)\)", BOUND)[1])
    launcher.wait_for_line(r"\[worker 0\] step=330 ", BOUND)
    os.kill(pid, signal.SIGKILL)

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"ps 0 exited with code -9; restarting it", 1)
    start = int(launcher.wait_for_line(r"\[worker 0\] starting my input at batch (\d+): from "
                                       r"its position saved at batch 256", 1)[1])
    assert UPDATES <= start <= 330
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [2 * UPDATES] * 2
    _every_example_used_once(tmp_path, record, epochs=2)
    assert processes_mentioning(str(tmp_path)) == []
