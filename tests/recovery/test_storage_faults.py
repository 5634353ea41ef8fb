"""A disk that fills up under --logdir while the chief saves checkpoints (issue 35, storage).

The run goes on: the model is on the ps, a failed save is one warning line naming the directory
and the error, and the result record says so; the `checkpoint` file names only checkpoints that
were completely written, so a resume trusts only those. The logdir is a small tmpfs (root only)
with room for the graph, the summaries and one checkpoint of the MLP (3.4 MB), not two; the
second test's has no room left for the SavedModel either, the run's product, which fails it.
(A logdir with no room for the first checkpoint is refused at once: test_checkpoints.py.)
"""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from hand_cluster import BOUND, COMMON, Cluster, checkpoint_steps, wait_for_step
from procs import read_json, small_tmpfs
from lab.loopback_faults import DiskFull
from sync_mnist.core.config import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

STEPS = 30


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_full_disk_fails_the_later_saves_with_a_warning_and_the_run_goes_on(processes,
                                                                             tmp_path):
    # Before: the chief failed at its second save, "ResourceExhaustedError: Graph execution
    # error:" (exit 1), and the launcher stopped the cluster.
    with small_tmpfs(tmp_path / "logdir", "6m") as logdir:
        cluster = Cluster(processes, tmp_path, 1, "--train-steps", str(STEPS), "--timeout",
                          "60", "--logdir", str(logdir), "--save-steps", "10")
        cluster.start_all(1)
        codes = cluster.wait_all()
        chief = cluster.tasks["worker", 0]
        assert codes == {("ps", 0): EXIT_OK, ("worker", 0): EXIT_OK}, chief.output
        record = cluster.record("worker", 0)
        assert record["synchronous"] is True, record["verdict"]
        # The saves at global_step 10, 20 and the last one, at 30, each failed with one line.
        warnings = [line for line in chief.output.splitlines() if "could not save" in line]
        assert [w.split("] warning: ", 1)[1] for w in warnings] == [
            f"could not save the checkpoint of global_step {step} in {logdir}: No space left "
            "on device (ENOSPC); training on: the model is on the ps" for step in (10, 20, 30)]
        assert record["failed_saves"] == 3
        assert record["save_error"] == warnings[-1].split("] warning: ", 1)[1]
        # The checkpoint file names only the complete checkpoint, and nothing half-written is
        # left to take the room of the next save.
        state = tf.train.get_checkpoint_state(str(logdir))
        assert list(state.all_model_checkpoint_paths) == [str(logdir / "model.ckpt-0")]
        assert sorted(p.name for p in logdir.glob("model.ckpt-*")) == [
            "model.ckpt-0.data-00000-of-00001", "model.ckpt-0.index", "model.ckpt-0.meta"]
        reader = tf.train.load_checkpoint(state.model_checkpoint_path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)  # intact: every tensor's checksum holds


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_disk_too_full_for_the_trained_model_fails_the_export_in_one_line(processes,
                                                                           tmp_path):
    # No room for the SavedModel (1 MB of weights) either, which the chief writes at the end
    # to --logdir/saved_model by default. That is the run's product, so it fails, exit 1; the
    # ps has its done report first, after the chief has tried again for up to --timeout.
    # Before: "ResourceExhaustedError: Graph execution error:", and the half-written model
    # left in .saved_model.partial-<pid>.
    with small_tmpfs(tmp_path / "logdir", "4600k") as logdir:
        cluster = Cluster(processes, tmp_path, 1, "--train-steps", "10", "--timeout", "8",
                          "--logdir", str(logdir), "--save-steps", "10")
        cluster.start_all(1)
        codes = cluster.wait_all()
        chief = cluster.tasks["worker", 0]
        assert codes == {("ps", 0): EXIT_OK, ("worker", 0): EXIT_FAILED}, chief.output
        no_room = (f"could not write the trained model to {logdir / 'saved_model'}: No space "
                   "left on device (ENOSPC)")
        warnings = [line.split("] ", 1)[1] for line in chief.output.splitlines()
                    if "] warning: could not write the trained model" in line]
        assert warnings == [f"warning: {no_room}; trying again every 1 s for up to 8 s "
                            "(--timeout)"], warnings
        errors = [line.split("] ", 1)[1] for line in chief.output.splitlines()
                  if "] error:" in line]
        assert errors == [f"error: failed: ExportError: {no_room}"]
        assert sorted(p.name for p in logdir.iterdir() if "saved_model" in p.name) == []
        # The record keeps the done report, which a launcher must not undo with a restart, and
        # claims no verdict for the failed task (the other workers' records carry the run's).
        record = cluster.record("worker", 0)
        assert (record["done_reported"], record["exit_code"]) == (True, EXIT_FAILED), record
        assert record["synchronous"] is None, record


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_disk_freed_while_the_chief_tries_again_keeps_the_trained_model(processes, tmp_path):
    # Found by make chaos (a --logdir full for less than --timeout, at the end): the chief's
    # one try at the SavedModel failed the run, exit 1, though the disk had room again
    # seconds later.
    with small_tmpfs(tmp_path / "export", "4m") as export:
        disk = DiskFull(export)
        assert disk.fill() > 0
        cluster = Cluster(processes, tmp_path, 1, "--train-steps", "10", "--timeout", "60",
                          "--export-dir", str(export / "model"))
        cluster.start_all(1)
        chief = cluster.tasks["worker", 0]
        chief.wait_for_line(r"warning: could not write the trained model to .*: No space left "
                            r"on device \(ENOSPC\); trying again every 1 s for up to 60 s "
                            r"\(--timeout\)",
                            BOUND)
        disk.free()
        codes = cluster.wait_all()
        assert codes == {("ps", 0): EXIT_OK, ("worker", 0): EXIT_OK}, chief.output
        chief.wait_for_line(rf"saved the trained model to {export / 'model'} \(try \d+\)", 1)
        assert (export / "model" / "saved_model.pb").is_file()
        assert cluster.record("worker", 0)["synchronous"] is True


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_chief_whose_export_fails_after_its_done_report_is_not_restarted(processes, tmp_path):
    # Found by make chaos (a full --logdir at the end, --max-restarts 1): the launcher
    # restarted the chief, whose replacement waited for the ps that had taken its done report
    # and ended, until the launcher's end bound stopped it and the run ended 200.
    with small_tmpfs(tmp_path / "export", "600k") as export:
        launcher = processes.launcher("--base-port", "0", "--workers", "2", *COMMON,
                                      "--train-steps", "10", "--timeout", "8",
                                      "--max-restarts", "1", "--export-dir",
                                      str(export / "model"),
                                      "--summary-json", str(tmp_path / "cluster.json"))
        assert launcher.wait(BOUND) == EXIT_FAILED, launcher.output
    launcher.wait_for_line(r"worker 0 exited with code 1 after its done report, which a "
                           r"restart cannot undo; stopping the cluster", 1)
    summary = read_json(tmp_path / "cluster.json")
    assert summary["restarts"] == {}, summary["restarts"]
    assert summary["contributions"] == [10, 10]
    codes = {(t["role"], t["index"]): t["exit_code"] for t in summary["tasks"]}
    # The ps, with every done report, ends 0, or 130 if the launcher's stop came first.
    assert codes.pop(("ps", 0)) in (EXIT_OK, EXIT_INTERRUPTED), codes
    assert codes == {("worker", 0): EXIT_FAILED, ("worker", 1): EXIT_OK}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_disk_full_to_the_last_block_and_freed_again_costs_saves_and_events_not_the_run(
        processes, tmp_path):
    """Found by `make chaos` (disk-full): TensorFlow's events writer thread died on ENOSPC, and
    the chief's next summary failed the run ("error: failed: RuntimeError: .../events.out.
    tfevents...; No space left on device", exit 1). Now the events are left out, one warning."""
    steps = 2000
    with small_tmpfs(tmp_path / "logdir", "32m") as logdir:
        cluster = Cluster(processes, tmp_path, 1, "--train-steps", str(steps), "--timeout",
                          "60", "--logdir", str(logdir), "--save-steps", "100")
        cluster.start_all(1)
        chief = cluster.tasks["worker", 0]
        wait_for_step(chief, 100)
        disk = DiskFull(logdir)
        assert disk.fill() > 0
        chief.wait_for_line(r"warning: could not save the checkpoint", BOUND)
        chief.wait_for_line(r"warning: could not write TensorBoard events", BOUND)
        disk.free()
        codes = cluster.wait_all()
        assert codes == {("ps", 0): EXIT_OK, ("worker", 0): EXIT_OK}, chief.output
        record = cluster.record("worker", 0)
        assert record["synchronous"] is True and record["global_step"] == steps, record
        events = [line for line in chief.output.splitlines() if "TensorBoard events" in line]
        assert len(events) == 1, events
        assert "Traceback" not in chief.output, chief.output
        assert f"warning: could not write TensorBoard events to {logdir}: " in events[0]
        assert "No space left on device" in events[0], events[0]
        assert 0 < record["failed_saves"] < steps // 100 + 1
        # Saved again once there was room: the last update is in the newest checkpoint.
        assert checkpoint_steps(logdir)[-1] == steps
