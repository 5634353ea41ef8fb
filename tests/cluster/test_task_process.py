"""The task's real entry point in a process of its own: the exit code each ending maps to, the
one line that names an unreachable ps, and a TensorFlow start-up without Keras.

The exit-code policy itself, and the errors found before TensorFlow starts, are checked in
tests/fast (test_task_identity.py, test_cli_errors.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from procs import ROOT, operator_tf_config, run_task_process
from sync_mnist.core import config
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import EXIT_TIMEOUT, START_SECS


@pytest.mark.parametrize("error, code", [
    ("UnavailableError(None, None, 'Socket closed')", config.EXIT_PEER_LOST),
    ("InvalidArgumentError(None, None, 'shape mismatch')", config.EXIT_FAILED),
    # A bounded call outside a training step (the finish barrier, an evaluation, a reading).
    ("DeadlineExceededError(None, None, 'Timed out waiting for notification')",
     config.EXIT_TIMEOUT),
])
def test_the_task_process_exits_with_the_code_its_error_maps_to(error, code, tmp_path):
    # The real entry point, in a process of its own (it ends with os._exit), with the worker's
    # life replaced by the error it would meet.
    script = (
        "import sys, tensorflow as tf\n"
        "from sync_mnist.task import cli, worker\n"
        "def run_worker(config, **kwargs):\n"
        f"    raise tf.errors.{error}\n"
        "worker.run_worker = run_worker\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    ended, err, record = _worker_1(script, tmp_path)
    assert ended == code, err
    name = error.split("(")[0]
    assert err.splitlines()[-1].endswith(f"[worker 1] error: failed: {name}: "
                                         f"{error.split(', ')[-1][1:-2]}")
    assert json.loads(record.read_text())["exit_code"] == code


def test_a_task_starts_tensorflow_without_keras():
    # Keras 3 costs every task about 0.9 s of CPU at start-up and is never used (cli.py); if
    # TensorFlow stops honouring TF_USE_LEGACY_KERAS this way, this fails.
    probe = ("import sys; from sync_mnist.task import options; options.before_tensorflow(False); "
             "import tensorflow as tf; tf.compat.v1.train.AdamOptimizer; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'tf_keras')))")
    assert _as_a_task(probe) == "[]"


def test_a_model_that_uses_tf_keras_gets_keras_3_in_the_task():
    # The start-up leaves Keras 3 out (above) and then lets it in: a model function with
    # tf.keras.layers failed with "Keras cannot be imported" (tf_keras, not installed).
    probe = ("import sys; from sync_mnist.task import options; from sync_mnist.core import "
             "tfcompat; options.before_tensorflow(False); tfcompat.graph_mode(False); "
             "import tensorflow as tf; before = 'keras' in sys.modules; "
             "dense = tf.keras.layers.Dense(3); y = dense(tf.zeros([2, 4])); "
             "print(before, type(dense).__module__, y.shape, len(dense.trainable_weights))")
    assert _as_a_task(probe).split() == ["False", "keras.src.layers.core.dense", "(2,", "3)",
                                         "2"]


@pytest.mark.parametrize("users, module", [
    ({}, "keras.src.layers.core.dense"),
    ({"TF_USE_LEGACY_KERAS": "1",  # and tf-keras, the `layers` extra, as `make install` has it
      "PYTHONPATH": os.pathsep.join([str(ROOT / ".venv" / "layers"), os.environ["PYTHONPATH"]])},
     "tf_keras.src.layers.core.dense")], ids=["Keras 3", "TF_USE_LEGACY_KERAS=1"])
def test_a_task_the_launcher_starts_gets_the_keras_of_the_users_environment(users, module):
    # The launcher defers Keras too (options.setup_logging) and never takes it back; its tasks
    # took its TF_USE_LEGACY_KERAS for the user's, and a model with Keras 3's layers failed
    # with "Keras cannot be imported". A task in an srun step defers Keras again after
    # TensorFlow is in (cli.task_in_cluster), which set it back for good.
    task = ("import sys; from sync_mnist.task import options; from sync_mnist.core import "
            "tfcompat; options.before_tensorflow(False); tfcompat.graph_mode(False); "
            "options.before_tensorflow(False); import tensorflow as tf; "
            "print(type(tf.keras.layers.Dense(3)).__module__)")
    launcher = ("import subprocess, sys; from sync_mnist.task import options; "
                "options.before_tensorflow(False); "
                f"sys.exit(subprocess.run([sys.executable, '-c', {task!r}]).returncode)")
    assert _as_a_task(launcher, users) == module


def _as_a_task(probe: str, users: dict | None = None) -> str:
    """What Python code `probe` prints, in a process whose environment is a user's (no
    TF_USE_LEGACY_KERAS of the tests'), with `users` in it."""
    env = {**{k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}, **(users or {})}
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_real_command_names_an_unreachable_ps_and_ends():
    # The real entry point, with the start-up allowance cut from 120 s to 3 so that the wait for
    # the ps (nobody listens on its port) ends within seconds; the message must name the value
    # the worker really waited, whatever it is.
    allowance = 3.0
    ps, w0, w1, w2 = free_ports(4)
    script = ("import sys\n"
              "from sync_mnist.task import cli, join\n"
              f"join.START_SECS = {allowance}\n"
              "sys.exit(cli.main(sys.argv[1:]))\n")
    code, _, err, seconds = run_task_process([
        "--role", "worker", "--index", "1", "--ps-hosts", f"127.0.0.1:{ps}",
        "--worker-hosts", f"127.0.0.1:{w0},127.0.0.1:{w1},127.0.0.1:{w2}",
        "--dataset", "synthetic", "--train-steps", "5", "--timeout", "2"],
        timeout=START_SECS, script=script)
    # Retried under a TFJob's ExitCode policy: the ps may be a pod that is still starting.
    assert code == EXIT_TIMEOUT, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith(f"error: ps 0 at 127.0.0.1:{ps} is unreachable: ")
    # A ps may start after the worker: it gets the start-up allowance, as the chief does.
    assert errors[0].endswith(f" for {allowance + 2:g} s")
    assert err.splitlines()[-1] == errors[0]  # the last word, after the worker's start-up lines
    assert seconds >= allowance + 2  # it waited the whole allowance, not less


def test_a_ps_whose_workers_exited_with_bad_input_ends_with_them_naming_them(processes,
                                                                            tmp_path):
    # As a TFJob starts them, TF_CONFIG alone: every worker's model fails to import (exit 2,
    # before its server starts). Each tells the ps, which ends with them, exit 2, naming them;
    # it waited out its start-up bound (120 s + --timeout), then exited 200, retried for nothing.
    ps_port, *worker_ports = free_ports(3)
    spec = {"ps": [f"127.0.0.1:{ps_port}"],
            "worker": [f"127.0.0.1:{port}" for port in worker_ports]}
    model = tmp_path / "broken.py"
    model.write_text("import no_such_module_of_this_model\n")
    args = ["--model", f"{model}:MODEL", "--train-steps", "5", "--timeout", "60"]
    ps = processes.start([sys.executable, "-m", "sync_mnist", *args], "ps 0",
                         {"TF_CONFIG": operator_tf_config(spec, "ps", 0)})
    ps.wait_for_line(r"\[ps 0\] serving ", 120)  # so that the workers find it
    workers = [processes.start([sys.executable, "-m", "sync_mnist", *args], f"worker {w}",
                               {"TF_CONFIG": operator_tf_config(spec, "worker", w)})
               for w in range(2)]
    for worker in workers:
        assert worker.wait(120) == config.EXIT_USAGE, worker.output
        assert "No module named 'no_such_module_of_this_model'" in worker.output
    # Well within the start-up bound (its 180 s): the first worker's entry ends it.
    assert ps.wait(60) == config.EXIT_USAGE, ps.output
    error = ps.wait_for_line(r"^error: (.*)", 1)
    assert re.fullmatch(r"ps 0: workers? [01](, 1)? exited with bad input \(2; (its|their) own "
                        r"lines say why\): the cluster cannot train without it", error[1]), \
        error[1]


def test_a_stop_signal_while_the_task_writes_its_record_does_not_cut_it_short(tmp_path):
    # Seen in the chaos soak: a worker that had timed out (200) got the launcher's SIGTERM,
    # which stops the cluster after a peer's failure, while it wrote its result record; the
    # interrupt came out of json.dumps as a traceback, and the record was lost.
    script = (
        "import os, signal, sys\n"
        "from sync_mnist.core import config\nfrom sync_mnist.task import cli, report, worker\n"
        "def run_worker(config_, **kwargs):\n"
        "    raise config.TaskTimeout('worker 1: waited 5 s for an update')\n"
        "worker.run_worker = run_worker\n"
        "write = report.TaskResult.write_json\n"
        "def stopped_while_writing(self, path):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line\n"
        "    write(self, path)\n"
        "report.TaskResult.write_json = stopped_while_writing\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    code, err, record = _worker_1(script, tmp_path)
    assert "Traceback" not in err, err
    assert code == EXIT_TIMEOUT, err
    assert json.loads(record.read_text())["exit_code"] == EXIT_TIMEOUT


@pytest.mark.parametrize("signum, code", [("SIGINT", config.EXIT_INTERRUPTED),
                                          ("SIGTERM", config.EXIT_PREEMPTED)])
def test_a_stop_signal_that_lands_in_a_destructor_still_stops_the_task(tmp_path, signum, code):
    # Seen in the chaos soak: the launcher's stop signal came while a failing worker closed a
    # TensorFlow session; the interrupt was raised inside BaseSession.__del__, printed as
    # "Exception ignored ... KeyboardInterrupt", and lost. (Before training, SIGTERM stops a
    # task at once too: there is no update to agree on.)
    script = (
        "import os, signal, sys, time\n"
        "from sync_mnist.task import cli, worker\n"
        "class Closing:\n"
        "    def __del__(self):\n"
        f"        os.kill(os.getpid(), signal.{signum})  # its handler raises in here\n"
        "def run_worker(config_, **kwargs):\n"
        "    Closing()  # collected at once\n"
        "    time.sleep(30)\n"
        "    raise AssertionError('the interrupt was lost')\n"
        "worker.run_worker = run_worker\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    exit_code, err, record = _worker_1(script, tmp_path)
    assert "Exception ignored" not in err, err
    assert exit_code == code, err
    assert err.splitlines()[-1].endswith("[worker 1] error: interrupted")
    assert json.loads(record.read_text())["exit_code"] == code


def _worker_1(script: str, tmp_path):
    """(exit code, stderr, record path) of `script` run as worker 1's task process, whose ps
    is nowhere: the script replaces the worker's life with what the test needs."""
    record = tmp_path / "worker1.json"
    code, _, err, _ = run_task_process(
        ["--role", "worker", "--index", "1", "--ps-hosts", "127.0.0.1:1", "--worker-hosts",
         "127.0.0.1:2,127.0.0.1:3", "--dataset", "synthetic", "--train-steps", "5",
         "--summary-json", str(record)], timeout=120, script=script)
    return code, err, record


def test_a_stop_that_lands_while_an_extension_initialises_is_an_interrupt_not_a_traceback():
    # Seen in the chaos soak: the launcher's SIGINT came while TensorFlow imported
    # _pywrap_profiler_plugin, whose initialisation turned it into "ImportError:
    # initialization failed", raised from the KeyboardInterrupt, and printed a traceback.
    script = (
        "import sys\n"
        "from sync_mnist.core import tfcompat\nfrom sync_mnist.task import cli\n"
        "def graph_mode(verbose):\n"
        "    try:\n"
        "        raise KeyboardInterrupt\n"
        "    except KeyboardInterrupt as e:\n"
        "        raise ImportError('initialization failed') from e\n"
        "tfcompat.graph_mode = graph_mode\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    code, _, err, _ = run_task_process(
        ["--role", "worker", "--index", "1", "--ps-hosts", "127.0.0.1:1", "--worker-hosts",
         "127.0.0.1:2,127.0.0.1:3", "--dataset", "synthetic", "--train-steps", "5"],
        timeout=120, script=script)
    assert code == config.EXIT_INTERRUPTED, err
    assert "Traceback" not in err, err
