"""The library form (sync_mnist.library) as sturdy as the trainer: its session creation bounded
against a ps that is absent or silent, and a killed worker of it restarted into the running
cluster (examples/question_library.py, four processes), which rejoins and ends verified.
"""

from __future__ import annotations

import gzip
import os
import signal
import socket
import struct
import sys

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.library as sml
from guard import within_guard
from procs import ROOT, processes_mentioning
from sync_mnist.core.cluster import Unreachable, free_ports
from sync_mnist.core.config import TaskTimeout

tf1 = tf.compat.v1
TIMEOUT = 2.0  # the bound under test, in seconds
BOUND = 300  # seconds a four-process run with a restart may take on a loaded 2-core machine


def _session_within_guard(ps: str, index: int):
    """The library form's session for worker `index` of a cluster whose ps 0 is at `ps`, made
    in a thread; returns (its exception, seconds), or fails after guard.GUARD s."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    cluster = tf1.train.ClusterSpec({"ps": [ps], "worker": workers})
    server = tf.distribute.Server(cluster, job_name="worker", task_index=index, start=True)
    graph = tf.Graph()
    with graph.as_default(), tf1.device(tf1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{index}", cluster=cluster)):
        global_step = tf1.train.get_or_create_global_step()
        w = tf1.get_variable("w", initializer=tf.zeros([2]))
        opt = sml.SyncOptimizer(tf1.train.GradientDescentOptimizer(0.1), cluster, index,
                                timeout=TIMEOUT)
        opt.minimize(tf.reduce_sum(w * w), global_step=global_step)
        sv = tf1.train.Supervisor(
            is_chief=index == 0, init_op=tf1.global_variables_initializer(),
            global_step=global_step, ready_for_local_init_op=opt.ready_for_local_init_op,
            local_init_op=opt.chief_init_op if index == 0 else opt.local_step_init_op)

    def make():  # in the guard's thread, where the default graph is its own
        with graph.as_default():
            opt.prepare_or_wait_for_session(sv, server.target)

    return within_guard(make)


@pytest.mark.parametrize("index", [0, 1], ids=["chief", "worker"])
def test_the_library_form_with_its_ps_absent_ends_within_its_bound_naming_the_ps(index):
    # Before: the Supervisor's session creation waited without end ("CreateSession still
    # waiting for response from worker: /job:ps/replica:0/task:0").
    ps = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    error, seconds = _session_within_guard(ps, index)
    assert isinstance(error, Unreachable), repr(error)  # as the trainer's, word for word
    assert str(error) == f"ps 0 at {ps} is unreachable: Connection refused for {TIMEOUT:g} s"
    assert seconds < TIMEOUT + 5


# A ps that accepts connections and never answers (a stopped process): session creation, which
# no RunOptions bound, is given up past its bound, as the trainer's (tests/recovery/
# test_bounds.py). The call it abandons ends with the test's own process.
@pytest.mark.own_process
@pytest.mark.parametrize("index, awaited", [
    (0, "the chief: waited {t:g} s for the ps ({ps}) to keep or initialise the model"),
    (1, "waited {t2:g} s for the ps ({ps}) to answer while waiting for the chief's model"),
], ids=["chief", "worker"])
def test_the_library_form_against_a_silent_ps_ends_within_its_bound(index, awaited):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        ps = f"127.0.0.1:{silent.getsockname()[1]}"
        error, seconds = _session_within_guard(ps, index)
    assert isinstance(error, TaskTimeout), repr(error)
    assert str(error) == awaited.format(t=TIMEOUT, t2=2 * TIMEOUT, ps=ps) + "; it did not answer"
    assert seconds < (1 + index) * TIMEOUT + 5


def _digits(data_dir, train: int, test: int) -> None:
    """Noisy copies of 10 random prototypes, in MNIST's IDX .gz format (test_example.py)."""
    rng = np.random.default_rng(0)
    prototypes = rng.integers(0, 256, (10, 28, 28))
    for kind, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = np.clip(prototypes[labels] + rng.integers(-60, 60, (n, 28, 28)), 0, 255)
        with gzip.open(data_dir / f"{kind}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.astype(np.uint8).tobytes())
        with gzip.open(data_dir / f"{kind}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.tobytes())


def _restarted(killed, start):
    os.kill(killed.popen.pid, signal.SIGKILL)
    assert killed.wait(BOUND) == -signal.SIGKILL
    return start()


def test_a_killed_worker_and_chief_of_the_library_form_rejoin_and_the_run_ends_verified(
        processes, tmp_path):
    epochs, steps = 20, 20 * 12  # 12 batches of 100 per epoch
    _digits(tmp_path, 1200, 200)
    ports = free_ports(4)
    hosts = ["--ps-hosts", f"localhost:{ports[0]}",
             "--worker-hosts", ",".join(f"localhost:{p}" for p in ports[1:])]

    def start(job: str, task: int):
        # The question's program, unchanged: restarting it is all a user does.
        return processes.start([sys.executable, str(ROOT / "examples" / "question_library.py"),
                                "--job", job, "--task", str(task), *hosts,
                                "--data-dir", str(tmp_path), "--epochs", str(epochs)],
                               f"{job} {task}")

    tasks = [start(job, task) for job, task in (("ps", 0), ("worker", 0), ("worker", 1),
                                                ("worker", 2))]
    tasks[2].wait_for_line(r"^worker 1: epoch 2 done", BOUND)
    tasks[2] = _restarted(tasks[2], lambda: start("worker", 1))
    rejoined = tasks[2].wait_for_line(
        r"worker 1: rejoined a running cluster at global_step (\d+)", BOUND)
    assert 24 <= int(rejoined[1]) < steps
    # Then the chief, whose Supervisor alone would initialise the model again.
    tasks[1].wait_for_line(r"^worker 0: epoch 6 done", BOUND)
    tasks[1] = _restarted(tasks[1], lambda: start("worker", 0))

    for task in tasks:  # every process ends by itself, the ps too
        assert task.wait(BOUND) == 0, task.output[-5000:]
    tasks[1].wait_for_line(r"worker 0: the model is already on the ps .*: keeping it", 1)
    assert 72 <= int(tasks[1].wait_for_line(
        r"worker 0: rejoined a running cluster at global_step (\d+)", 1)[1]) < steps
    for index, task in enumerate(tasks[1:]):
        task.wait_for_line(rf"^worker {index}: verdict: synchronous: each of {steps} updates "
                           rf"averaged exactly one gradient from each of 3 workers; "
                           rf"contributions \[{steps}, {steps}, {steps}\]$", 1)
    assert processes_mentioning(str(tmp_path)) == []
