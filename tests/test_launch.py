"""The launcher's own bounds, its exit code, and how it starts each task's process.

Most cases run the launcher with stand-in tasks (tests/fake_task.py: no TensorFlow), so a
launcher that waits forever, or ends with the wrong code, fails in seconds. One case goes
through `make run-cluster` with real tasks, because make changes the exit code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fake_task
from procs import ROOT, processes_mentioning, read_json
from sync_mnist.launcher import launch
from sync_mnist.config import EXIT_TIMEOUT, EXIT_USAGE, TrainConfig

FAKE_TASK = str(Path(__file__).with_name("fake_task.py"))
BOUND = 60  # seconds a launcher of stand-in tasks may take on a loaded machine

# The launcher in a process of its own (it installs signal handlers and forks), with stand-in
# tasks and a short end-of-run bound: 2 x --timeout 1 + grace.
LAUNCHER = """
import logging, sys
from pathlib import Path
from sync_mnist.launcher import launch
from sync_mnist.config import TrainConfig

fake, behaviour, marks, grace = sys.argv[1:5]
logging.basicConfig(level=logging.INFO, format="%(asctime)s [cluster] %(message)s")
launch.TASK_COMMAND = [sys.executable, fake, behaviour, marks]
launch.EXIT_GRACE_SECS = float(grace)
sys.exit(launch.run_cluster(
    num_ps=1, num_workers=3, base_port=0, isolate="off", task_args=[],
    train=TrainConfig(train_steps=2, timeout=1.0, dataset="synthetic"),
    summary_json=Path(marks) / "cluster.json"))
"""


def _launch_fakes(processes, tmp_path, behaviour: str, grace: float = 1.0):
    launcher = processes.start([sys.executable, "-c", LAUNCHER, FAKE_TASK, behaviour,
                                str(tmp_path), str(grace)], "launcher")
    code = launcher.wait(BOUND)
    assert processes_mentioning(str(tmp_path)) == [], "the launcher left processes behind"
    return code, launcher, read_json(tmp_path / "cluster.json")


def test_a_task_still_running_after_the_workers_ended_is_stopped_with_exit_timeout(processes,
                                                                                 tmp_path):
    code, launcher, summary = _launch_fakes(processes, tmp_path, "hanging-ps")

    assert code == EXIT_TIMEOUT, launcher.output
    # The bound is 2 x --timeout + grace = 3 s after the first worker ended, then SIGTERM.
    assert "ps 0 still running 3 s after worker" in launcher.output
    assert launcher.lines[-1] == (f"exit code {EXIT_TIMEOUT} (a bounded wait expired: a peer "
                                  "is missing, dead or stuck)")
    ps = next(t for t in summary["tasks"] if t["role"] == "ps")
    assert ps["blocked"] is True and "still running 3 s after worker" in ps["error"]
    assert [t["exit_code"] for t in summary["tasks"] if t["role"] == "worker"] == [0, 0, 0]


def test_the_launchers_last_line_states_its_exit_code(processes, tmp_path):
    code, launcher, summary = _launch_fakes(processes, tmp_path, "not-synchronous")

    assert code == 3, launcher.output
    assert summary["synchronous"] is False
    assert launcher.lines[-1] == ("exit code 3 (training ran to the end, but the counters "
                                  "show it was not synchronous)")


def test_a_tasks_bad_input_is_the_launchers_exit_2_naming_the_task_and_its_reason(processes,
                                                                                 tmp_path):
    # The chief exits 2 (say, an unwritable --logdir): before, the launcher said 1, and a
    # script or a TFJob lost the difference between bad input and a crash.
    code, launcher, summary = _launch_fakes(processes, tmp_path, "bad-input-chief")

    assert code == EXIT_USAGE, launcher.output
    assert launcher.lines[-2:] == [f"error: worker 0: {fake_task.BAD_INPUT}",
                                   "exit code 2 (bad input)"]
    assert [line for line in launcher.lines if line.startswith("error:")] == [
        launcher.lines[-2]]
    chief = next(t for t in summary["tasks"] if (t["role"], t["index"]) == ("worker", 0))
    assert (chief["exit_code"], chief["error"]) == (EXIT_USAGE, fake_task.BAD_INPUT)


def test_the_launchers_summary_json_is_checked_before_any_task_starts(tmp_path, monkeypatch,
                                                                      capsys):
    # Before: the cluster ran to the end, then writing its record raised IsADirectoryError,
    # a traceback with no `exit code` line.
    monkeypatch.setattr(launch, "TASK_COMMAND", [sys.executable, FAKE_TASK, "not-synchronous",
                                                 str(tmp_path)])
    code = launch.run_cluster(num_ps=1, num_workers=2, base_port=0, isolate="off", task_args=[],
                              train=TrainConfig(train_steps=2, timeout=1.0, dataset="synthetic"),
                              summary_json=tmp_path)
    assert code == EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        f"error: --summary-json {tmp_path} is a directory, not a file"]
    assert not (tmp_path / "chief-started").exists(), "a task was started"


@pytest.mark.cluster
def test_make_run_cluster_names_the_launchers_exit_code(processes, tmp_path):
    """make reports any failure as its own code 2; the launcher's last line keeps the real one."""
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    args = (f"--workers 1 --base-port 0 --isolate off --dataset synthetic --train-steps 5 "
            f"--timeout 30 --data-dir {tmp_path / 'data'} --logdir {not_a_dir / 'logdir'}")
    make = processes.start(["make", "--no-print-directory", "-C", str(ROOT), "run-cluster",
                            f"ARGS={args}"], "make")

    assert make.wait(240) == 2, make.output  # make's own code for a failed recipe
    assert processes_mentioning(str(tmp_path)) == []
    # The chief rejected its --logdir (2), so the launcher stopped the cluster: exit 2 too.
    rejected = f"--logdir {not_a_dir / 'logdir'} is not writable: Not a directory"
    assert f"[worker 0] error: {rejected}" in make.output
    assert f"error: worker 0: {rejected}" in make.lines, make.output
    stated = [line for line in make.lines if line.startswith("exit code ")]
    assert stated == ["exit code 2 (bad input)"], make.output
    assert any(line.endswith("run-cluster] Error 2") for line in make.lines), make.output


# ------------------------------------------------------------------ between fork and exec

# Run in the child after exec: its death signal (PR_GET_PDEATHSIG = 2) and its parent.
PRINT_DEATH_SIGNAL = ("import ctypes, os; v = ctypes.c_int(); "
                      "ctypes.CDLL(None).prctl(2, ctypes.byref(v)); print(v.value, os.getppid())")


def test_child_setup_sets_the_death_signal_and_loads_no_library_after_fork(monkeypatch):
    # dlopen/dlsym between fork and exec can deadlock in a threaded parent: everything the
    # child needs must be resolved before the fork. Any library or symbol lookup now fails.
    def lookup(*args, **kwargs):
        raise AssertionError("a library or symbol was looked up between fork and exec")

    monkeypatch.setattr(ctypes, "CDLL", lookup)
    monkeypatch.setattr(ctypes.cdll, "LoadLibrary", lookup)
    monkeypatch.setattr(type(launch._libc), "__getattr__", lookup)
    monkeypatch.setattr(type(launch._libc), "__getitem__", lookup)
    parent = os.getpid()
    out = subprocess.run([sys.executable, "-c", PRINT_DEATH_SIGNAL], capture_output=True,
                         text=True, timeout=60, check=True,
                         preexec_fn=lambda: launch._child_setup(None, parent)).stdout
    assert out.split() == [str(int(signal.SIGKILL)), str(parent)]


# A stand-in launcher that dies between forking a task and the task's prctl: the task waits
# (bounded) until it has been re-parented, then runs the launcher's child setup and execs.
DYING_LAUNCHER = """
import os, sys, time
from sync_mnist.launcher import launch

launcher = os.getpid()
child = os.fork()
if child == 0:
    os.setsid()
    deadline = time.monotonic() + 10
    while os.getppid() == launcher and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        launch._child_setup(None, launcher)
    except Exception as e:  # whatever the setup does wrong, the task would run on
        print(f"child setup failed: {e!r}", flush=True)
    os.execvp("sleep", ["sleep", "120"])
print(child, flush=True)
os._exit(0)
"""


def test_child_whose_launcher_died_before_the_death_signal_does_not_live_on(processes):
    dying = processes.start([sys.executable, "-c", DYING_LAUNCHER], "dying launcher")
    child = int(dying.wait_for_line(r"^\d+$", BOUND).group(0))
    try:
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the task outlived its launcher: an orphan"
    finally:
        try:
            os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
