"""The launcher's screen: one live progress line on a terminal, the tasks' lines elsewhere.

On a terminal, `sync-mnist-cluster` shows a single line for the whole cluster, drawn by tqdm:
global_step / target, updates/s, elapsed time and ETA, examples/s and each worker's
contributions. Its figures come from the lines every worker already prints every --log-every
local steps (`step=… global_step=G/T … examples_per_sec=R contributions=[…]`; see
progress_log.Progress), so nothing new crosses the process boundary. Every task's lines go to a log
file whose path is printed first; warnings and errors (and with --verbose, every line) are
printed above the progress line as well. The table and the verdict always end the output.

Anywhere else (CI, a pipe, a file, `make` in a script) the output is what it always was: every
task's lines in order, no escape codes. They are written by a thread of their own, so a reader
that stops reading (a pager, `| head`) never holds up the tasks, whose pipes the launcher keeps
draining; a reader that has gone (`| head` after its lines) ends the output, quietly.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, NamedTuple

# A worker's progress line, as progress_log.Progress logs it (the launcher adds the tag if absent).
_PROGRESS = re.compile(
    r"\[worker (?P<worker>\d+)\] step=\d+ global_step=(?P<step>\d+)/(?P<target>\d+) .*?"
    r"examples_per_sec=(?P<rate>\d+) contributions=\[(?P<contributions>[\d, ]*)\]")
# What must reach the screen: a task's warnings and errors (options.LogFormatter marks the logged
# ones, and usage errors are printed as `error: …`).
_ALERT = re.compile(r"\[(?:ps|worker) \d+\] (?:error|warning|critical):")
_TIME = re.compile(r"^\d\d:\d\d:\d\d ")  # a log line's time, left out of the starting line
# The live line, most important first, as a narrow terminal cuts the end:
#   global_step 150/200  75%|██████▌  | 00:05<00:01, contributions [150, 150, 150], 7740 examples/s
# (elapsed<ETA, both counted from the first progress line, so start-up does not skew the rate)
_BAR = "{desc} {n_fmt}/{total_fmt} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"
TICK_SECS = 1.0  # how often the live line is redrawn between progress lines (elapsed, ETA)


class Reading(NamedTuple):
    """One worker's progress line."""
    worker: int
    global_step: int
    target: int
    examples_per_sec: int
    contributions: list[int]


def parse(line: str) -> Reading | None:
    """The figures of a worker's progress line; None for any other line."""
    m = _PROGRESS.search(line)
    if not m:
        return None
    return Reading(int(m["worker"]), int(m["step"]), int(m["target"]), int(m["rate"]),
                   [int(c) for c in m["contributions"].split(",") if c.strip()])


def is_alert(line: str) -> bool:
    """True for a task's warning or error line, which must reach the screen."""
    return bool(_ALERT.search(line))


def default_log_path() -> Path:
    """Where a live display writes the tasks' lines: a new file in the temporary directory."""
    return Path(tempfile.gettempdir()) / (
        f"sync-mnist-cluster-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")


def open_display(*, verbose: bool, mode: str, num_workers: int) -> Display:
    """The display for the launcher's stdout: live on a terminal, plain lines otherwise."""
    live = sys.stdout.isatty()
    return Display(live=live, verbose=verbose, mode=mode, num_workers=num_workers,
                   log_path=default_log_path() if live else None)


class Display:
    """Where the launcher's output goes. Thread-safe: every task's reader thread calls it.

    Args:
      live: draw one live line (a terminal); else print every task line as it comes.
      verbose: with live, also print every task line above the live line.
      mode: sync or async; in async mode global_step counts every worker's local steps, so
        the target is the workers' local steps times their number.
      num_workers: the cluster's workers.
      stream: the screen (default: sys.stdout).
      errors: where the launcher's own warnings and errors go (default: sys.stderr).
      log_path: with live, the file that receives every line.
    """

    def __init__(self, *, live: bool, verbose: bool = False, mode: str = "sync",
                 num_workers: int = 1, stream: IO[str] | None = None,
                 errors: IO[str] | None = None, log_path: Path | None = None):
        self.live, self.verbose, self.log_path = live, verbose, log_path
        self._stream = stream or sys.stdout
        self._errors = errors or sys.stderr
        self._scale = num_workers if mode == "async" else 1
        self._lock = threading.RLock()
        self._bar = None
        self._file = None
        self._rates: dict[int, int] = {}
        self._saved_handlers: list[logging.Handler] | None = None
        self._closed = threading.Event()
        self._writer = None if live else _Writer(self._stream)
        if live:
            self._start()

    def _start(self) -> None:
        from tqdm import tqdm  # only a live display needs it

        self._tqdm = tqdm
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.log_path, "a", buffering=1)
            print(f"every task's output: {self.log_path}"
                  f"{'' if self.verbose else ' (--verbose shows it here too)'}",
                  file=self._stream, flush=True)
        # Until the first progress line: what the cluster is doing, and for how long.
        self._bar = tqdm(bar_format="starting [{elapsed}] {desc}", file=self._stream,
                         leave=False, dynamic_ncols=True)
        # The launcher's own log records: to the file; warnings and errors also on screen.
        root = logging.getLogger()
        self._saved_handlers = root.handlers[:]
        handler = _LiveHandler(self)
        if self._saved_handlers:
            handler.setFormatter(self._saved_handlers[0].formatter)
        root.handlers = [handler]
        threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        # tqdm redraws only when told; keep elapsed and ETA moving between progress lines.
        while not self._closed.wait(TICK_SECS):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()

    def task_line(self, line: str) -> None:
        """One line of a task's output, already tagged with the task's identity."""
        if not self.live:
            self._print(line)
            return
        with self._lock:
            self._to_file(line)
            reading = parse(line)
            if reading:
                self._progress(reading)
            elif self._bar is not None and not self._bar.total:
                self._bar.set_description_str(_TIME.sub("", line)[:200])
            if self.verbose or is_alert(line):
                self._above(line, self._stream)

    def launcher_line(self, line: str, alert: bool) -> None:
        """A log record of the launcher itself."""
        with self._lock:
            self._to_file(line)
            if alert:
                self._above(line, self._errors)

    def _progress(self, r: Reading) -> None:
        self._rates[r.worker] = r.examples_per_sec
        figures = (f"contributions {r.contributions}, "
                   f"{sum(self._rates.values())} examples/s")
        if self._bar is None:
            return
        if not self._bar.total:
            # The first figures: from now on, a bar whose rate and ETA count training only.
            self._bar.close()
            self._bar = self._tqdm(total=r.target * self._scale, initial=r.global_step,
                                   desc="global_step", bar_format=_BAR, file=self._stream,
                                   dynamic_ncols=True, postfix=figures)
        elif r.global_step > self._bar.n:  # lines of workers in lockstep come in any order
            self._bar.set_postfix_str(figures, refresh=False)
            self._bar.update(r.global_step - self._bar.n)

    def _above(self, line: str, stream: IO[str]) -> None:
        if self._bar is not None:
            self._tqdm.write(line, file=stream)
        else:
            print(line, file=stream, flush=True)

    def _to_file(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line + "\n")
        elif self.log_path:  # a straggler after close()
            with open(self.log_path, "a") as f:
                f.write(line + "\n")

    def _print(self, text: str) -> None:
        self._writer.write(text)

    def close(self) -> None:
        """Ends the live line (it stays on screen as it last was) and restores logging."""
        with self._lock:
            self._closed.set()
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            if self._saved_handlers is not None:
                logging.getLogger().handlers = self._saved_handlers
                self._saved_handlers = None
            if self._file is not None:
                self._file.close()
                self._file = None

    def show(self, text: str) -> None:
        """Text that always reaches the screen, such as the table and the verdict.

        Returns once it is written, after every line before it (or the reader has gone).
        """
        with self._lock:
            if self.live:
                self._to_file(text)
                self._above(text, self._stream)
                return
            self._print(text)
        # Unbounded on purpose: the reader sets the pace (a pager may wait for its user), and
        # by now the tasks have ended, so nothing else waits on it.
        self._writer.drain()


class _Writer:
    """Writes lines to a stream from a thread of its own, in order.

    A reader that has closed its end (`| head`) ends the output: the rest is dropped, and the
    stream's descriptor is pointed at /dev/null so that nothing else (Python's last flush at
    exit) meets the broken pipe and prints a traceback.
    """

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._lines: queue.Queue[str] = queue.Queue()
        self.broken = False
        threading.Thread(target=self._run, daemon=True).start()

    def write(self, text: str) -> None:
        self._lines.put(text)  # never blocks: the tasks' readers call it

    def drain(self) -> None:
        """Returns once everything written so far has been written out (or dropped)."""
        self._lines.join()

    def _run(self) -> None:
        while True:
            text = self._lines.get()
            try:
                if not self.broken:
                    print(text, file=self._stream, flush=True)
            except BrokenPipeError:  # the reader has gone: a quiet end of the output
                self.broken = True
                _discard(self._stream)
            except (OSError, ValueError) as e:  # a full disk, a closed file: say it, once
                self.broken = True
                print(f"error: the launcher's output stopped: {e}", file=sys.stderr, flush=True)
            finally:
                self._lines.task_done()


def _discard(stream: IO[str]) -> None:
    """From now on, whatever is written to `stream` goes to /dev/null."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not backed by a descriptor (a test's)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class _LiveHandler(logging.Handler):
    def __init__(self, display: Display):
        super().__init__()
        self._display = display

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._display.launcher_line(self.format(record), record.levelno >= logging.WARNING)
        except Exception:  # never let the display break the launcher
            self.handleError(record)
