"""A streamed input through the real command line (core/stream.py): TFRecord files cut by file
over the workers, of unequal length, and the cluster's agreed stop where the first worker's
input ends: verified, no timeout, every example used at most once (tests/stream_model.py
counts each example's uses in the model itself)."""

from __future__ import annotations

import re
import sys

import tensorflow as tf

import pytest

import stream_model
from procs import operator_tf_config, processes_mentioning, read_json, run_task_process
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import EXIT_DATA_NOT_COVERED, EXIT_OK, EXIT_USAGE

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine


def test_uneven_shards_stop_where_the_first_worker_s_input_ends(processes, tmp_path):
    # Worker 0 reads files 0 and 2 (ids 0-59, 100-159: 120 examples), worker 1 files 1 and 3
    # (ids 60-99, 160-203: 84 examples, 30% fewer): 21 batches of 4 for worker 1.
    spec = stream_model.place(tmp_path / "data", [60, 40, 60, 44])
    logdir, summary = tmp_path / "logdir", tmp_path / "cluster.json"
    temp = tmp_path / "temp"  # the tasks' temporary files
    temp.mkdir()
    launcher = processes.launcher(
        "--model", spec, "--base-port", "0", "--isolate", "off", "--workers", "2",
        "--epochs", "1", "--batch-size", "4", "--log-every", "5", "--timeout", "60",
        "--logdir", str(logdir), "--summary-json", str(summary), env={"TMPDIR": str(temp)})

    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    launcher.wait_for_line(r"\[worker 1\] my input ends with batch 20: asking the cluster to "
                           r"stop on the update its gradient joins \(21\)", 1)
    launcher.wait_for_line(r"\[worker 0\] dataset .*: streamed, sharded by file", 1)
    # The evaluation streams too: the model's eval_input_fn returns a dataset of 64 examples.
    launcher.wait_for_line(r"\[worker 0\] test_accuracy=\S+ test_loss=\S+ on 64 evaluation "
                           "examples", 1)
    # What each worker used of its input, said and recorded: worker 0 had 36 examples left.
    launcher.wait_for_line(r"\[worker 0\] the cluster stopped on update 21, where the first "
                           r"worker's input ended; mine had more: the run used its first 21 "
                           r"batches \(84 examples\) and not the rest$", 1)
    launcher.wait_for_line(r"\[worker 1\] the cluster stopped on update 21, .*; mine ended "
                           r"there too: the run used all 21 of its whole batches \(84 examples;", 1)
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [21, 21]
    workers = sorted((t for t in record["tasks"] if t["role"] == "worker"),
                     key=lambda t: t["index"])
    assert [(t["stop_step"], t["input_left"]) for t in workers] == [(21, True), (21, False)]
    assert all(t["exit_code"] == EXIT_OK for t in record["tasks"])
    uses = stream_model.uses(tf.train.latest_checkpoint(str(logdir)), 2)
    assert uses[60:100].tolist() == [1] * 40 and uses[160:204].tolist() == [1] * 44
    # Worker 0's stream: its first 84 examples, then the cluster stopped.
    assert uses[0:60].tolist() == [1] * 60 and uses[100:124].tolist() == [1] * 24
    assert uses[124:160].tolist() == [0] * 36 and uses[204:].sum() == 0
    assert processes_mentioning(str(tmp_path)) == []
    # TensorFlow's autograph wrote the input's functions as modules; each task removed its own.
    assert sorted(p.name for p in temp.iterdir()) == []


def _worker_alone(spec: str, *extra: str) -> tuple[int, list[str]]:
    """Worker 1 of a cluster that does not exist: its input is read before it meets anyone."""
    ps, w0, w1 = free_ports(3)
    code, _, err, _ = run_task_process(
        ["--role", "worker", "--index", "1", "--ps-hosts", f"127.0.0.1:{ps}", "--worker-hosts",
         f"127.0.0.1:{w0},127.0.0.1:{w1}", "--model", spec, "--epochs", "1", "--batch-size",
         "4", "--timeout", "5", *extra], timeout=120)
    return code, err.strip().splitlines()


@pytest.mark.parametrize("damage, line", [
    ("corrupt", r"DataLossError: corrupted record at \d+ \(in {file}, after 0 of its examples "
                r"came through the pipeline\)"),
    ("cut", r"DataLossError: truncated record at \d+.* \(in {file}, after 2 of its examples came "
            r"through the pipeline\)")])
def test_bad_records_are_bad_input_in_one_line_naming_the_file(tmp_path, damage, line):
    spec = stream_model.place(tmp_path, [10, 10])
    bad = tmp_path / "part-001.tfrecord"
    data = bad.read_bytes()
    if damage == "corrupt":
        bad.write_bytes(data[:40] + bytes([data[40] ^ 0xFF]) + data[41:])
    else:  # cut off in its third record, inside the first batch
        bad.write_bytes(data[:len(data) // 4])
    code, lines = _worker_alone(spec)
    assert code == EXIT_USAGE, lines
    errors = [x for x in lines if x.startswith("error: ")]
    assert len(errors) == 1 and "Traceback (most recent call last):" not in lines, lines
    assert re.fullmatch(r"error: train_input_fn: reading (the first batch of worker 1's files|"
                        r"batch(es \d+ to)? \d+ of worker 1's input): " + line.format(file=re.escape(
                            str(bad))), errors[0]), errors[0]


def test_an_input_that_reads_no_file_is_bad_input_in_one_line(tmp_path):
    spec = stream_model.place(tmp_path, [10, 10])
    for path in tmp_path.glob("*.tfrecord"):
        path.unlink()  # the model's glob now matches nothing
    code, lines = _worker_alone(spec)
    assert code == EXIT_USAGE, lines
    assert [x for x in lines if x.startswith("error: ")] == [
        "error: train_input_fn's dataset has no full batch of 4 examples for worker 1 of 2 "
        "(sharded by record, by the package; it reads no file that exists: does its pattern match any?)"], lines


# Blocks that are views into larger ones (the input's own rebatch), cut into batches whole.
_VIEWS = """
import numpy as np, tensorflow as tf
from sync_mnist.core.stream import Stream
graph = tf.Graph()
with graph.as_default():
    ids = np.arange(1000)
    dataset = tf.data.Dataset.from_tensor_slices(({"id": ids}, ids % 2)).batch(64).rebatch(16)
    stream = Stream(graph, dataset.unbatch(), index=0, num_workers=1, batch_size=10, epochs=1,
                    sharded=False, what="train_input_fn")
rebatches = [op for op in graph.get_operations() if op.type.startswith("RebatchDataset")]
print(len(rebatches), sum((stream.batch(k)[0]["id"].tolist() for k in range(100)), []) == [
    *range(1000)])
"""


def test_blocks_that_are_views_are_cut_into_batches_without_an_error_logged():
    """TensorFlow's rebatch logs an error a block ("Tensor RefCount not reliable if buf_ points
    to a SubBuffer") where a block is a view: the stream copies each block first."""
    code, out, err, _ = run_task_process([], script=_VIEWS, log_level="0")
    assert code == 0, err
    assert out.split() == ["2", "True"]  # the input's rebatch and the stream's; every id once
    assert "RefCount" not in err, [line for line in err.splitlines() if "RefCount" in line][:3]


def test_an_input_that_cuts_its_files_by_tf_config_uses_each_example_once_as_a_tfjob(
        processes, tmp_path):
    """Issue 55: an Estimator-era input function that cuts its files by TF_CONFIG itself, run
    as a TFJob runs it (one `sync-mnist` a task, TF_CONFIG alone), its model trained by Adam
    (the count by SGD in a scope of its own): not cut again, every example used once a pass,
    and the data verdict says so."""
    spec = stream_model.place(tmp_path / "data", [8] * 6)  # ids 0-47: 2 files a worker
    spec = spec.replace(":MODEL", ":TF_CONFIG_CUT")
    ports = iter(free_ports(4))
    cluster = {"worker": [f"127.0.0.1:{next(ports)}" for _ in range(3)],
               "ps": [f"127.0.0.1:{next(ports)}"]}
    logdir = tmp_path / "logdir"
    command = [sys.executable, "-m", "sync_mnist", "--model", spec, "--epochs", "2",
               "--batch-size", "4", "--timeout", "60", "--logdir", str(logdir)]
    pods = {f"{job}-{i}": processes.start(
        ["env", f"TF_CONFIG={operator_tf_config(cluster, job, i)}", *command, "--summary-json",
         str(tmp_path / f"{job}-{i}.json")], f"{job}-{i}")
        for job, count in (("worker", 3), ("ps", 1)) for i in range(count)}
    for name, pod in pods.items():
        assert pod.wait(BOUND) == EXIT_OK, pod.output
    pods["worker-2"].wait_for_line(r"\[worker 2\] dataset .*: streamed, sharded by file, by "
                                   r"the input function's \.shard\(\); up to 2 pass\(es\) over "
                                   r"my shard, until the first worker's input ends", 1)
    workers = [read_json(tmp_path / f"worker-{i}.json") for i in range(3)]
    for record in workers:  # 16 examples a worker a pass: 4 batches, 2 passes
        assert record["synchronous"] is True and record["contributions"] == [8, 8, 8]
        assert record["data_covered"] is True
        assert record["data_verdict"] == (
            "each of 6 files read whole by exactly one worker, covered once (cut by file, by "
            "the input function's .shard()); 96 examples used in applied updates (32, 32, 32 a "
            "worker)")
    pods["worker-0"].wait_for_line(r"\[worker 0\] data: each of 6 files read whole", 1)
    uses = stream_model.uses(tf.train.latest_checkpoint(str(logdir)), 3)
    assert uses[:48].tolist() == [2] * 48 and uses[48:].sum() == 0


def test_an_input_that_ignores_its_input_context_ends_not_covered_naming_files_and_workers(
        processes, tmp_path):
    """Every worker reads every file: trained to the end, synchronous, but the data verdict
    names the files and the workers, and the run exits 4, not 0."""
    spec = stream_model.place(tmp_path / "data", [8, 8]).replace(":MODEL", ":IGNORES_CONTEXT")
    summary = tmp_path / "cluster.json"
    launcher = processes.launcher(
        "--model", spec, "--base-port", "0", "--isolate", "off", "--workers", "2",
        "--epochs", "1", "--batch-size", "4", "--timeout", "60", "--summary-json", str(summary))
    assert launcher.wait(BOUND) == EXIT_DATA_NOT_COVERED, launcher.output
    line = ("NOT covered once: 2 files read by worker 0 (whole), worker 1 (whole) "
            "(part-000.tfrecord, part-001.tfrecord) (cut by the input function "
            "(input_context)); 32 examples used in applied updates (16, 16 a worker)")
    launcher.wait_for_line("^data: " + re.escape(line) + "$", 1)
    launcher.wait_for_line(r"^exit code 4 \(training ran to the end, but the data verdict shows "
                           r"an example given to two workers or to none\)$", 1)
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [4, 4]
    assert record["data_covered"] is False and record["data_verdict"] == line
    assert [t["exit_code"] for t in record["tasks"] if t["role"] == "worker"] == \
        [EXIT_DATA_NOT_COVERED] * 2


def test_count_examples_counts_each_id_s_uses_on_the_ps_whatever_the_optimizer(processes,
                                                                              tmp_path):
    """--count-examples id with Adam: the ps counts each id's uses in the applied updates; the
    model's own count (SGD at rate 1 in a scope of its own) agrees, id by id."""
    spec = stream_model.place(tmp_path / "data", [8] * 4).replace(":MODEL", ":ADAM")
    logdir, summary = tmp_path / "logdir", tmp_path / "cluster.json"
    launcher = processes.launcher(
        "--model", spec, "--base-port", "0", "--isolate", "off", "--workers", "2",
        "--epochs", "2", "--batch-size", "4", "--timeout", "60", "--logdir", str(logdir),
        "--summary-json", str(summary), "--count-examples", "id")
    assert launcher.wait(BOUND) == EXIT_OK, launcher.output
    record = read_json(summary)
    assert record["synchronous"] is True and record["contributions"] == [8, 8]
    assert record["data_covered"] is True
    assert record["data_verdict"] == (
        "each of 4 files read whole by exactly one worker, covered once (cut by file, by the "
        "package); 64 examples used in applied updates (32, 32 a worker); ids of id: each of 32 "
        "used exactly once in passes 1-2; 64 uses, one for each example used")
    uses = stream_model.uses(tf.train.latest_checkpoint(str(logdir)), 2)
    counted = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(logdir))).get_tensor(
        "sync_counters/example_uses")
    # Each id: 2 uses, in passes 0 and 1 (2**0 + 2**1)
    assert uses[:32].tolist() == [2] * 32 and counted.tolist() == [[2.0, 3.0]] * 32 + [
        [0.0, 0.0]] * (len(counted) - 32)


def test_an_id_beyond_count_examples_ids_is_bad_input_naming_it(tmp_path):
    spec = stream_model.place(tmp_path, [10, 10])
    # Worker 1 reads file 1 (ids 10-19): its batch 0 is ids 10-13.
    code, lines = _worker_alone(spec, "--count-examples", "id", "--count-examples-ids", "12")
    assert code == EXIT_USAGE, lines
    assert [x for x in lines if x.startswith("error: ")] == [
        "error: --count-examples id: batch 0 of worker 1 has id 12, outside 0-11 "
        "(--count-examples-ids 12): number the ids from 0, or raise --count-examples-ids"], lines
