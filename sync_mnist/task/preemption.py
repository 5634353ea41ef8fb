"""Preemption: SIGTERM or SIGUSR1 stops the whole cluster on one update, saved, and exits 143.

Kubernetes evicts a pod with SIGTERM and kills it with SIGKILL after its grace period (30 s by
default); Slurm sends SIGTERM at the time limit or on preemption (SIGKILL after KillWait, 30 s),
and the signal `--signal` asks for beforehand. A task that is training does not stop at once:
the handler only records the signal (a Python handler does not run while TensorFlow's C++
holds the thread, so it could do nothing more anyway). Between two steps a worker, or a ps
between two polls, then asks ps 0 for the stop (early_stop.preempt_op); the next update is the
cluster's last; every worker stops on it, the finish barrier and the verdict run as at the
planned end, the chief's checkpoint hook saves that update, and every task exits 143. A rerun
with the same --logdir resumes there: no update lost, none made twice.

Before a task trains (start-up: loading, joining) there is nothing to agree on: the signal
stops it at once (143), as SIGINT does (130). A signal that comes once a worker has taken its
last token changes nothing: the run ends complete, and exits 0.

Should the stop not come within --preempt-grace seconds (a peer dead or stuck), the task
exits 143 all the same, before the SIGKILL: the checkpoint is whichever was last complete.
"""

from __future__ import annotations

import _thread
import logging
import signal
import time

log = logging.getLogger("sync_mnist")

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class _State:
    armed = False  # a task between its first step and its last: the signal is only recorded
    signum: int | None = None  # the first preemption signal received


def install(grace: float, on_overdue, on_unarmed, saved: str) -> None:
    """Handles SIGTERM and SIGUSR1 in this process (the main thread).

    saved: what becomes of the stop, for the line the signal is logged with.
    on_unarmed(signum, frame): what a signal does outside training: raise, to stop the task at
    once.
    on_overdue(message): called from another thread once `grace` seconds have passed since
    the first signal received while armed; it must end the process.
    """
    def handle(signum, frame):
        first = _State.signum is None
        if first:
            _State.signum = signum
        if not _State.armed:
            on_unarmed(signum, frame)
            return
        if first:  # no logging here: the main thread may be inside a log call
            _thread.start_new_thread(_watch, (signum, grace, on_overdue, saved))

    for signum in SIGNALS:
        signal.signal(signum, handle)


def _watch(signum: int, grace: float, on_overdue, saved: str) -> None:
    name = signal.Signals(signum).name
    log.warning("%s: preempted; the cluster stops on the next update; %s (bound: "
                "--preempt-grace %g s)", name, saved, grace)
    time.sleep(grace)
    on_overdue(f"{name}: preempted, and the cluster did not stop within --preempt-grace "
               f"{grace:g} s; exiting without a new checkpoint")


def signalled() -> bool:
    """Whether SIGTERM or SIGUSR1 was received."""
    return _State.signum is not None


def requested() -> bool:
    """Whether a preemption signal came while armed: the task must ask for the stop."""
    return _State.armed and _State.signum is not None


def arm() -> None:
    """From here to its end, a signal is recorded and the stop asked for: a worker from its
    first step (through its finish, which ends the run complete), a ps once it serves."""
    _State.armed = True
