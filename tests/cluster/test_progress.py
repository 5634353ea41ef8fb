"""The launcher's live progress line (progress.py): parsing, the display, and a real terminal."""

from __future__ import annotations

import io
import logging
import re
import shutil
import subprocess
import time
from types import SimpleNamespace

import pytest

from procs import ROOT, processes_mentioning
from sync_mnist.task import progress_log, options
from sync_mnist.core import sync
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.launcher import progress


def _task_line(record: logging.LogRecord, tag: str) -> str:
    """A log record as a task prints it and the launcher reads it."""
    return options.LogFormatter(f"%(asctime)s [{tag}] %(message)s", datefmt="%H:%M:%S").format(record)


def test_a_workers_progress_line_parses_into_its_figures(monkeypatch, caplog):
    # The line comes from progress_log.Progress itself, so a change of its format breaks this test.
    counters = SimpleNamespace(global_step=41, accepted=[41, 40, 41])
    monkeypatch.setattr(verdict_lib.Counters, "read", lambda *args, **kwargs: counters)
    config = SimpleNamespace(train=SimpleNamespace(log_every=20, batch_size=100))
    meter = progress_log.Progress(config, side=None, state=None, writer=None, target=2000)
    with caplog.at_level(logging.INFO, logger="sync_mnist.task.worker"):
        meter.step(20, loss=0.25, train_metrics={"accuracy": 0.9})
    [record] = caplog.records

    reading = progress.parse(_task_line(record, "worker 2"))
    assert reading is not None
    assert reading.worker == 2
    assert (reading.global_step, reading.target) == (41, 2000)
    assert reading.contributions == [41, 40, 41]
    assert reading.examples_per_sec > 0
    assert progress.parse("12:00:00 [worker 2] ready after 2.50 s; 65 local steps planned") is None


def test_warnings_and_errors_are_marked_and_reach_the_screen():
    def record(level, message):
        return logging.LogRecord("sync_mnist", level, __file__, 1, message, None, None)

    error = _task_line(record(logging.ERROR, "worker 1: waited 30 s for an update"), "worker 1")
    warning = _task_line(record(logging.WARNING, "global_step went back"), "ps 0")
    info = _task_line(record(logging.INFO, "error rate is not a thing here"), "worker 1")

    assert error.endswith("[worker 1] error: worker 1: waited 30 s for an update")
    assert progress.is_alert(error) and progress.is_alert(warning)
    assert not progress.is_alert(info)
    # A usage error a task prints (not logs), as the launcher tags it.
    assert progress.is_alert("[worker 3] error: worker 3 has --batch-size 50 but the chief "
                             "has 100")


def _progress_line(worker_index: int, step: int, target: int, contributions: list[int]) -> str:
    return (f"12:00:00 [worker {worker_index}] step={step} global_step={step}/{target} "
            f"loss=0.1000 accuracy=0.900 examples_per_sec=1000 contributions={contributions}")


def test_live_display_shows_one_line_errors_and_the_table_and_logs_every_line(tmp_path):
    screen, errors, log_path = io.StringIO(), io.StringIO(), tmp_path / "tasks.log"
    display = progress.Display(live=True, mode="sync", num_workers=2, stream=screen,
                               errors=errors, log_path=log_path)
    lines = ["12:00:00 [ps 0] serving localhost:2222",
             "12:00:01 [worker 1] waiting for the chief to initialise the model"]
    lines += [_progress_line(w, step, 30, [step, step]) for step in (10, 20, 30) for w in (1, 0)]
    lines += ["12:00:05 [worker 1] error: worker 1: something went wrong"]
    try:
        for line in lines:
            display.task_line(line)
        logging.getLogger("sync_mnist.launcher.launch").error("worker 1 exited with code 1")
    finally:
        display.close()
    display.show("task  exit\nverification: synchronous")

    shown = screen.getvalue()
    parts = [part.rstrip() for part in re.split(r"[\r\n]", shown)]  # lines, and redraws
    assert f"every task's output: {log_path} (--verbose shows it here too)" in parts
    # The live line: its last state is the end of the run, contributions included.
    final = [part for part in parts if part.startswith("global_step ")][-1]
    assert re.match(r"global_step 30/30 100%\|", final), final
    assert "contributions [30, 30], 2000 examples/s" in final
    # Only what must be seen is printed as a line of its own; the table and verdict end it.
    assert lines[-1] in parts
    assert not set(lines[:-1]) & set(parts), shown
    assert re.search(r"starting \[00:\d\d\] \[worker 1\] waiting for the chief", shown)
    assert shown.rstrip().endswith("task  exit\nverification: synchronous")
    # The launcher's own error went to its error stream (and the file), not only to the log.
    assert "worker 1 exited with code 1" in errors.getvalue()
    # Every line is in the log file, in order, then the table.
    logged = log_path.read_text().splitlines()
    assert [line for line in logged if line in lines] == lines
    assert logged[-2:] == ["task  exit", "verification: synchronous"]


def test_verbose_live_display_prints_every_task_line_above_the_live_line(tmp_path):
    screen = io.StringIO()
    display = progress.Display(live=True, verbose=True, stream=screen, errors=io.StringIO(),
                               log_path=tmp_path / "tasks.log")
    lines = ["12:00:00 [ps 0] serving localhost:2222", _progress_line(0, 10, 30, [10, 10])]
    try:
        for line in lines:
            display.task_line(line)
    finally:
        display.close()
    parts = [part.rstrip() for part in re.split(r"[\r\n]", screen.getvalue())]
    assert set(lines) <= set(parts)
    assert any(part.startswith("global_step 10/30 ") for part in parts)


def test_async_target_counts_every_workers_local_steps(tmp_path):
    screen = io.StringIO()
    display = progress.Display(live=True, mode="async", num_workers=3, stream=screen,
                               errors=io.StringIO(), log_path=tmp_path / "tasks.log")
    try:
        display.task_line(_progress_line(0, 30, 50, [30, 0, 0]))  # 50 local steps each
    finally:
        display.close()
    assert "global_step 30/150" in screen.getvalue()


def test_plain_display_prints_every_line_as_it_comes():
    screen = io.StringIO()
    display = progress.Display(live=False, stream=screen)
    display.task_line(_progress_line(0, 10, 30, [10, 10]))
    display.task_line("12:00:00 [ps 0] serving localhost:2222")
    display.close()
    display.show("verification: synchronous")
    assert screen.getvalue().splitlines() == [_progress_line(0, 10, 30, [10, 10]),
                                              "12:00:00 [ps 0] serving localhost:2222",
                                              "verification: synchronous"]


TMUX_BOUND = 300  # seconds a small cluster may take on a loaded 2-core machine


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_in_a_terminal_one_line_updates_in_place_and_the_table_ends_it(tmp_path):
    socket = str(tmp_path / "tmux.sock")
    marker = str(tmp_path / "data")  # in every task's command line, to find leftovers
    command = (f"env TMPDIR={tmp_path} TF_CPP_MIN_LOG_LEVEL=3 "
               f"{ROOT / 'bin' / 'sync-mnist-cluster'} --base-port 0 --dataset synthetic "
               f"--data-dir {marker} --workers 2 --train-steps 200 --log-every 5 --timeout 60; "
               "echo launcher exit $?; sleep 600")

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-S", socket, *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout

    def screen() -> list[str]:  # the whole pane, its history included
        return [line.rstrip() for line in tmux("capture-pane", "-p", "-S", "-").splitlines()]

    tmux("new-session", "-d", "-x", "160", "-y", "50", command)
    try:
        seen_steps: set[int] = set()
        deadline = time.monotonic() + TMUX_BOUND
        while True:
            lines = screen()
            bars = [line for line in lines if line.startswith("global_step ")]
            assert len(bars) <= 1, "\n".join(lines)  # one line, redrawn: never a second one
            seen_steps.update(int(re.match(r"global_step (\d+)/", bar)[1]) for bar in bars)
            if any(line.startswith("launcher exit") for line in lines):
                break
            assert time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "-S", socket, "kill-server"], capture_output=True, timeout=30)

    text = "\n".join(lines)
    assert "launcher exit 0" in text, text
    # The line moved: it showed global_step part way, and at the end, in the same place.
    assert 200 in seen_steps and len(seen_steps) >= 2, (seen_steps, text)
    [bar] = [line for line in lines if line.startswith("global_step ")]
    assert "200/200 100%" in bar and "contributions [200, 200]" in bar, bar
    # It ends with the table and the verdict, and no task's step line scrolled the screen.
    ends = [i for i, line in enumerate(lines) if line.startswith(("task ", "verification:"))]
    assert len(ends) == 2 and lines.index(bar) < ends[0] < ends[1], text
    assert lines[ends[1]].startswith("verification: synchronous")
    assert not re.search(r"\[worker \d\] step=", text), text
    # The tasks' lines are in the file the launcher named first.
    log_path = re.search(r"every task's output: (\S+)", text)[1]
    assert log_path.startswith(str(tmp_path))
    logged = open(log_path).read()
    for w in range(2):
        assert f"[worker {w}] step=200 global_step=200/200" in logged
    # tmux's server, whose argv holds the command and so the marker, exits some time after
    # kill-server returns: wait for that, bounded, before looking for leftovers.
    deadline = time.monotonic() + 10
    while (left := processes_mentioning(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], "the launcher left processes behind"
