"""What a worker reads beside training: progress lines, summaries, and why it is stalled.

Each read is a plain session run on the side (not the training session) with a short timeout,
so a slow or absent ps costs a log line, never a training step.
"""

from __future__ import annotations

import logging
import threading
import time

import tensorflow as tf

from sync_mnist.core import membership, stream, sync
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.config import TaskConfig

tf1 = tf.compat.v1
log = logging.getLogger("sync_mnist.task.worker")  # the worker's lines, tagged as before


class Progress:
    """One key=value line every --log-every local steps; the chief also writes summaries."""

    def __init__(self, config: TaskConfig, side, state: sync.SharedState, writer, target: int):
        self._config, self._side, self._state = config, side, state
        self._writer, self._target = writer, target
        self._since, self._last_logged = time.monotonic(), 0

    def step(self, local: int, loss: float, train_metrics: dict[str, float]) -> None:
        """Every --log-every steps: the loss and the model's train_metrics of this batch."""
        train = self._config.train
        if local % train.log_every:
            return
        now = time.monotonic()
        rate = train.batch_size * (local - self._last_logged) / max(now - self._since, 1e-9)
        self._since, self._last_logged = now, local
        shown = "".join(f" {name}={float(value):.3f}" for name, value in train_metrics.items())
        try:
            counters = verdict_lib.Counters.read(self._side, self._state,
                                          options=tf1.RunOptions(timeout_in_ms=5000))
        except tf.errors.OpError:  # the ps is being restarted: the next line will have them
            log.info("step=%d loss=%.4f%s examples_per_sec=%.0f (counters unreadable: the ps "
                     "is away)", local, loss, shown, rate)
            return
        of = "" if self._target == stream.UNTIL_INPUT_ENDS else f"/{self._target}"
        log.info("step=%d global_step=%d%s loss=%.4f%s examples_per_sec=%.0f "
                 "contributions=%s", local, counters.global_step, of, loss, shown,
                 rate, counters.accepted)
        if self._writer:
            write_summaries(self._writer, counters, loss=loss, **train_metrics,
                            examples_per_sec=rate)


def contributions_so_far(side, state: sync.SharedState) -> str:
    try:
        return str(verdict_lib.Counters.read(side, state,
                                      options=tf1.RunOptions(timeout_in_ms=5000)).accepted)
    except tf.errors.OpError:
        return "unreadable (the ps is unreachable)"


STALLED_READ_MS = 5000


def stalled(side, state: sync.SharedState, members: membership.Membership,
            config: TaskConfig) -> tuple[str, list[str]]:
    """What a worker waiting for an update can say: the contributions, and who is missing, as
    text and as the names TaskTimeout's `missing` takes."""
    # Probe first: against a ps this worker cannot reach, a fetch TensorFlow has not run before
    # in this session blocks while it registers the graph, past any timeout_in_ms.
    down = {p: why for p, address in enumerate(config.cluster.ps_hosts)
            if (why := membership.probe(address))}
    if down:
        text = "the ps is unreachable: " + ", ".join(f"ps {p} ({why})" for p, why in down.items())
        if membership.cut_off(config.cluster, config.index, down):
            return f"{text}; {membership.CUT_OFF}", []
        # Sync: the update waits for that ps (found by make chaos: ps 0 of 2 cut off past
        # --timeout in training; the workers named no ps, and the launcher restarted a
        # worker, then had no restart left for the next).
        return text, [f"ps {p}" for p in down]
    try:
        step, last_push, accepted = side.run(
            [state.global_step, members.last_push, state.accepted],
            options=tf1.RunOptions(timeout_in_ms=STALLED_READ_MS))
    except tf.errors.DeadlineExceededError:
        # Sync: it accepts connections but does not serve (frozen, stuck): that ps is what the
        # update waits for, and the launcher restarts the task a timeout names (report.py).
        ps = tf.DeviceSpec.from_string(state.global_step.device).task
        return (f"missing: ps {ps} (it accepts connections but did not answer a read of the "
                f"counters in {STALLED_READ_MS // 1000} s)"), [f"ps {ps}"]
    except tf.errors.OpError:
        return "the ps is reachable but its counters cannot be read", []
    last_push, step = [int(s) for s in last_push], int(step)
    return (f"contributions so far {[int(a) for a in accepted]}; missing: "
            f"{membership.missing(last_push, step, config.cluster)}",
            membership.missing_peers(last_push, step))


class EventsWriter:
    """The run's TensorBoard events in --logdir, which a disk that fills up costs, not the run.

    TensorFlow's FileWriter writes from a thread of its own. When a write fails (ENOSPC), that
    thread dies and every later call re-raises its error, so the chief's next summary, or its
    checkpoint saver's next note, would fail the run. Here the first failure is one warning
    naming the directory and the error; the events of the rest of the run are left out.
    The one FileWriter per directory (FileWriterCache) is shared with CheckpointSaverHook,
    which sessions.monitored_session hands this instead.
    """

    def __init__(self, logdir: str):
        self.logdir = logdir
        self.error: str | None = None
        self._writer = tf1.summary.FileWriterCache.get(logdir)
        if threading.excepthook is not _writer_thread_hook:
            global _next_thread_hook
            _next_thread_hook, threading.excepthook = threading.excepthook, _writer_thread_hook

    def _guarded(self, call) -> None:
        if self.error is not None:
            return
        try:
            call()
        except (RuntimeError, tf.errors.OpError) as e:
            self.error = (f"could not write TensorBoard events to {self.logdir}: "
                          f"{str(e).strip().splitlines()[0]}; training on without them")
            log.warning("%s", self.error)

    def add_summary(self, summary, global_step=None) -> None:
        self._guarded(lambda: self._writer.add_summary(summary, global_step))

    def add_session_log(self, session_log, global_step=None) -> None:
        self._guarded(lambda: self._writer.add_session_log(session_log, global_step))

    def add_graph(self, graph, global_step=None) -> None:
        self._guarded(lambda: self._writer.add_graph(graph, global_step))

    def add_meta_graph(self, meta_graph_def, global_step=None) -> None:
        self._guarded(lambda: self._writer.add_meta_graph(meta_graph_def, global_step))

    def flush(self) -> None:
        self._guarded(self._writer.flush)

    def close(self) -> None:
        """Closes the events file, so that it ends complete (all of FileWriterCache's)."""
        self._guarded(tf1.summary.FileWriterCache.clear)


_next_thread_hook = threading.excepthook


def _writer_thread_hook(args) -> None:
    """The writer thread's error is raised again by the writer's next call, which
    EventsWriter reports in one line: no traceback of the thread's own besides."""
    if not (args.thread is not None and args.thread.name == "EventLoggerThread"
            and issubclass(args.exc_type, RuntimeError)):
        _next_thread_hook(args)


def write_summaries(writer, counters: verdict_lib.Counters, **scalars) -> None:
    """Writes `scalars` and the counters (sync/accepted/workerN, sync/unused/workerN,
    sync/repeat_updates) as summaries at counters.global_step; `sync-mnist plot` reads them."""
    values = [tf1.Summary.Value(tag=name, simple_value=float(v))
              for name, v in scalars.items() if v is not None]
    for w, (pushed, accepted) in enumerate(zip(counters.pushed, counters.accepted)):
        values.append(tf1.Summary.Value(tag=f"sync/accepted/worker{w}", simple_value=accepted))
        values.append(tf1.Summary.Value(tag=f"sync/unused/worker{w}",
                                        simple_value=pushed - accepted))
    values.append(tf1.Summary.Value(tag="sync/repeat_updates",
                                    simple_value=counters.repeat_updates))
    writer.add_summary(tf1.Summary(value=values), counters.global_step)
    writer.flush()
