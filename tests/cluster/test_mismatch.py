"""Bad input that only a running cluster can see: tasks that disagree, and unusable logdirs.

Each case ends in exit code 2 and one `error:` line naming both values (or the logdir and
the variable), with no traceback. All the cases run at once, as real processes, from one
module fixture, since each costs a TensorFlow start-up; the table test then checks each.

  * Mismatches are found at start-up against the settings the chief publishes on ps 0: a
    worker compares them as soon as they are there, before it joins; a ps (of either setup)
    when it sees them.
  * The chief checks its --logdir before it starts its server, and a checkpoint there against
    its model before it waits for the ps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from procs import Processes
from sync_mnist.core.cluster import free_ports

tf1 = tf.compat.v1

BOUND = 240  # seconds; ten TensorFlow processes start at once on a 2-core machine
COMMON = ("--dataset", "synthetic", "--train-steps", "50", "--timeout", "60")


def _hosts(workers: int) -> tuple[list[str], list[str]]:
    ports = free_ports(workers + 1)
    return [f"127.0.0.1:{ports[0]}"], [f"127.0.0.1:{p}" for p in ports[1:]]


def _cluster_args(ps: list[str], workers: list[str]) -> tuple[str, ...]:
    return ("--ps-hosts", ",".join(ps), "--worker-hosts", ",".join(workers))


def _write_checkpoint(logdir: Path, pushed_shape: list[int]) -> None:
    """A checkpoint as a cluster of another size leaves it: per-worker counters of that size."""
    with tf.Graph().as_default():
        tf1.get_variable("global_step", initializer=tf.constant(7, tf.int64), trainable=False)
        tf1.get_variable("sync_counters/pushed", initializer=tf.zeros(pushed_shape, tf.int64))
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            saver.save(sess, str(logdir / "model.ckpt"), global_step=7)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Starts every case; returns {case: (exit code, output lines, expected error line)}."""
    tmp = tmp_path_factory.mktemp("mismatch")
    procs = Processes()
    expected: dict[str, tuple[object, str]] = {}
    try:
        # Cluster A: ps 0 and a chief told 5 workers; workers 1 and 4 each differ in one way
        # (workers 2 and 3 are not started: any other setting takes worker 1's path, and
        # tests/inprocess/test_membership.py checks each one's message).
        ps, workers = _hosts(5)
        cluster = _cluster_args(ps, workers)
        procs.task("ps", 0, *cluster, *COMMON)
        chief = procs.task("worker", 0, *cluster, *COMMON)
        # Cluster B: a ps told 3 workers, a chief told 2.
        ps_b, workers_b = _hosts(3)
        expected["ps with another cluster size"] = (
            procs.task("ps", 0, *_cluster_args(ps_b, workers_b), *COMMON),
            "error: ps 0 has 3 workers in --worker-hosts but the chief has 2")
        procs.task("worker", 0, *_cluster_args(ps_b, workers_b[:2]), *COMMON)
        # Cluster C: a ps started with --setup question, whose server.join() would serve
        # forever, and a chief with the default setup.
        ps_c, workers_c = _hosts(2)
        expected["ps with another setup"] = (
            procs.task("ps", 0, *_cluster_args(ps_c, workers_c), *COMMON, "--setup", "question"),
            "error: ps 0 has --setup question but the chief has fixed")
        procs.task("worker", 0, *_cluster_args(ps_c, workers_c), *COMMON)
        # Chiefs alone, with a logdir they cannot use; their ps need not exist.
        not_a_dir = tmp / "a-file"
        not_a_dir.write_text("")
        expected["unwritable logdir"] = (
            procs.task("worker", 0, *_cluster_args(*_hosts(3)), *COMMON,
                       "--logdir", str(not_a_dir / "logdir")),
            f"error: --logdir {not_a_dir / 'logdir'} is not writable: Not a directory")
        other_model = tmp / "two-worker-run"
        other_model.mkdir()
        _write_checkpoint(other_model, [2])
        expected["checkpoint of another model"] = (
            procs.task("worker", 0, *_cluster_args(*_hosts(3)), *COMMON,
                       "--logdir", str(other_model)),
            f"error: --logdir {other_model} holds a checkpoint of a different model: "
            "sync_counters/pushed has shape [2] there, [3] here")

        # The mismatched workers of cluster A join once the chief has published (the
        # question's Supervisor would otherwise sleep 30 s before it looks again).
        chief.wait_for_line(r"\[worker 0\] ready after", BOUND)
        for case, index, args, line in (
                ("worker with another cluster size", 1,
                 _cluster_args(ps, workers[:2]),
                 "error: worker 1 has 2 workers in --worker-hosts but the chief has 5"),
                ("worker with another setup", 4, (*cluster, "--setup", "question"),
                 "error: worker 4 has --setup question but the chief has fixed")):
            expected[case] = (procs.task("worker", index, *args, *COMMON), line)

        yield {case: (proc.wait(BOUND), proc.lines, line)
               for case, (proc, line) in expected.items()}
    finally:
        procs.kill_all()


CASES = ["worker with another cluster size", "worker with another setup",
         "ps with another cluster size", "ps with another setup",
         "unwritable logdir", "checkpoint of another model"]


@pytest.mark.parametrize("case", CASES)
def test_task_stops_with_exit_2_and_one_line_naming_both_values(outcomes, case):
    code, lines, expected = outcomes[case]
    output = "\n".join(lines)
    assert code == 2, output
    assert "Traceback" not in output
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [expected], output
    assert lines[-1] == expected  # the last word
