"""Timeouts that name who did not answer: the ps a read of every ps found silent, as text for
the message and as names for the task's record (TaskTimeout.missing), which the launcher reads
to restart that ps rather than the task that waited for it."""

from __future__ import annotations

import contextlib

import tensorflow as tf

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import membership, bounded
from sync_mnist.core.config import TaskTimeout

tf1 = tf.compat.v1
SILENT_READ_SECS = 5.0  # _silent: how long a ps may take to answer a read of a variable


def _silent(side, graph: tf.Graph, cluster: cluster_lib.ClusterLayout
            ) -> dict[int, str]:
    """The ps that do not answer now, {index: why}: nothing listens, or the
    connection goes unanswered, or it accepts connections but a read of one of its variables
    did not come back in SILENT_READ_SECS (frozen, stuck)."""
    one_each = {}
    for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES):
        device = tf.DeviceSpec.from_string(v.device)
        if device.job == "ps" and device.task is not None:
            one_each.setdefault(device.task, v)
    silent = {}
    for p, address in enumerate(cluster.ps_hosts):
        why = membership.probe(address)
        if why is None and p in one_each:
            why = _read_fails(side, one_each[p], p)
        if why:
            silent[p] = why
    return silent


def _read_fails(side, variable: tf.Variable, p: int) -> str | None:
    """Why a read of `variable` on ps `p` did not come back; None if it did."""
    # Bounded twice: a fetch new to this session registers its graph first, which
    # no RunOptions bound (bounded.bounded_call).
    read = tf1.RunOptions(timeout_in_ms=int(SILENT_READ_SECS * 1000))
    try:
        bounded.bounded_call(lambda: side.run(variable, options=read),
                             SILENT_READ_SECS + 1, f"a read of ps {p}")
    except (tf.errors.DeadlineExceededError, TaskTimeout) as e:
        if isinstance(e, TaskTimeout):
            e.handled()
        return f"it accepts connections but did not answer a read in {SILENT_READ_SECS:g} s"
    except tf.errors.OpError as e:
        return f"a read of it failed: {type(e).__name__}"
    return None


def timeout_naming_silent_ps(message: str, side, graph: tf.Graph,
                             cluster: cluster_lib.ClusterLayout, worker: int) -> TaskTimeout:
    """TaskTimeout(message) of worker `worker`, ending with "; missing: ps K (why), ..." for
    each ps that does not answer now, and naming them in its `missing`; the message alone if
    every ps answers. When the worker reaches no other task either, the silent ps are named in
    the message only (membership.cut_off)."""
    silent = _silent(side, graph, cluster)
    if not silent:
        return TaskTimeout(message)
    text = ", ".join(f"ps {p} ({why})" for p, why in silent.items())
    if membership.cut_off(cluster, worker, silent):
        return TaskTimeout(f"{message}; silent: {text}; {membership.CUT_OFF}")
    return TaskTimeout(f"{message}; missing: {text}", missing=[f"ps {p}" for p in silent])


@contextlib.contextmanager
def naming_silent_ps(*, worker: int, side, graph: tf.Graph, cluster: cluster_lib.ClusterLayout):
    """A TaskTimeout that names no peer (a bounded_call's, as a checkpoint save's: no RunOptions
    bound a save), raised again naming the ps that do not answer now
    (timeout_naming_silent_ps), so that the launcher restarts that ps, not the task that
    waited for it (found by make chaos: ps 0 cut off as the chief saved a checkpoint; the
    chief's timeout named no ps, and the launcher spent its one restart on the chief)."""
    try:
        yield
    except TaskTimeout as e:
        if e.missing:
            raise
        e.handled()  # raised again below, arming its own last resort
        raise timeout_naming_silent_ps(str(e), side, graph, cluster, worker) from None


@contextlib.contextmanager
def awaiting(what: str, *, worker: int, timeout: float, side, graph: tf.Graph,
             cluster: cluster_lib.ClusterLayout):
    """A bounded read of the ps that expired, as a timeout that says what it waited for,
    and which ps did not answer: the launcher restarts the task a timeout names."""
    try:
        yield
    except tf.errors.DeadlineExceededError:
        hosts = ", ".join(f"ps {p} at {a}" for p, a in enumerate(cluster.ps_hosts))
        raise timeout_naming_silent_ps(
            f"worker {worker}: waited {timeout:g} s for "
            f"{'the ps' if cluster.num_ps == 1 else 'the ps tasks'} ({hosts}) {what}; "
            "no answer", side, graph, cluster, worker) from None
