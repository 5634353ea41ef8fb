"""A worker's end: the finish barrier, the final counters and the verdict, then its done
report to every ps, after which the ps may exit."""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import tensorflow as tf

from sync_mnist.core import bounded, coverage, early_stop, membership
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.config import PeerLost, TaskTimeout, first_line
from sync_mnist.core.sessions import EMPTIED, SideSession
from sync_mnist.task import waits
from sync_mnist.task.prepare import Worker

tf1 = tf.compat.v1
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Finished:
    """What every task of the run reads at its end, and so agrees on."""

    counters: verdict_lib.Counters
    lost: list[int]  # workers the chief declared lost at the finish
    stop_step: int  # the update the cluster stopped on (0: none; early_stop.py)
    preempted: bool  # the stop was a preemption's
    verdict: verdict_lib.Verdict
    data: coverage.DataVerdict  # whether each example went to exactly one worker
    # A stop where the first worker's input ended: whether this worker's input had examples
    # the run did not use (None: the run did not stop so).
    input_left: bool | None = None


def awaiting(w: Worker, side: SideSession):
    """waits.awaiting for this worker's reads of the ps at its end."""
    return lambda what: waits.awaiting(what, worker=w.config.index, timeout=w.config.train.timeout,
                                       side=side, graph=w.graph, cluster=w.config.cluster)


def finish(w: Worker, side: SideSession) -> Finished:
    """The finish barrier, the counters and the verdict."""
    config, train, g = w.config, w.config.train, w.g
    # Sync: wait until every worker has pushed its last gradient (or is lost), so that
    # every task reads the same, final counters and so reaches the same verdict.
    with awaiting(w, side)("at the finish (the barrier and the final counters)"), \
            _emptied_is_lost(config.name):
        _write_plan(w, side)  # Sync: before the barrier, so every reader finds it
        lost = membership.finish_barrier(
            lambda fetches, feed=None: side.run(fetches, feed, options=w.bounded),
            g.members, index=config.index, cluster=config.cluster, timeout=train.timeout,
            log=log)
        counters = verdict_lib.Counters.read(side, g.state, options=w.bounded)
        plans = side.run(g.members.plans, options=w.bounded)
        uses = None if g.example_uses is None else side.run(g.example_uses, options=w.bounded)
        stop_step, reason = (int(v) for v in side.run(
            [g.stop_vars.stop_step, g.stop_vars.reason], options=w.bounded))
    end = w.target
    if train.mode == "sync":  # (async mode counts local steps, and verifies no target)
        # Sync: the run was planned to end where the target or a preemption stopped it
        end = early_stop.end_step(w.target, stop_step)
    verdict = verdict_lib.verify(
        counters, mode=train.mode, target_steps=end, replicas_to_aggregate=w.aggregate,
        lost=lost) if train.proof else verdict_lib.Verdict(
        None, None, "not verified: --bench-no-proof left the counters out")
    data = coverage.judge([coverage.Plan.from_json(p) if p else None for p in plans],
                          counters.accepted, train.batch_size) if train.proof else \
        coverage.DataVerdict(None, "not verified: --bench-no-proof left the counters out")
    if uses is not None:
        data = coverage.with_ids(data, uses, train.count_examples, counters.accepted,
                                 train.batch_size, train.epochs)
    preempted = reason == early_stop.PREEMPTED
    input_left = None
    if reason == early_stop.INPUT_ENDED:
        input_left = _report_input_end(w, stop_step)
    if preempted:
        log.warning("preempted: the cluster stopped on update %d of %d; %s", stop_step,
                    w.target, f"the chief saves it to {train.logdir}; rerun with the "
                    "same --logdir to resume there" if train.logdir else
                    "no --logdir: nothing is saved, a rerun starts over")
    return Finished(counters, lost, stop_step, preempted, verdict, data, input_left)


def _write_plan(w: Worker, side: SideSession) -> None:
    """Writes what this worker reads of its input on ps 0, for the data verdict (coverage.py),
    at the finish, before the barrier (a ps restarted mid-run lost it: plans are not
    checkpointed). Not when it takes its place: a fed write then, the ps fetching the plan
    from a worker container restarted at a new address, failed with UnavailableError
    (tests/container); a backup the chief declares lost publishes none."""
    g = w.g
    side.run(g.members.write_plan, {g.members.mark_worker: [w.config.index],
                                    g.members.plan: [w.plan]},
             options=w.bounded)


def _report_input_end(w: Worker, stop_step: int) -> bool:
    """Says what this worker used of its input, the cluster having stopped on update
    `stop_step` where the first worker's input ended; whether its input had more. Batch u fed
    update u + 1, so batches 0 to stop_step - 1 were used, each once."""
    used = stop_step * w.config.train.batch_size
    left = not w.shard.ends_after(stop_step - 1)
    log.info("the cluster stopped on update %d, where the first worker's input ended; %s",
             stop_step, f"mine had more: the run used its first {stop_step} batches "
             f"({used:,} examples) and not the rest" if left else
             f"mine ended there too: the run used all {stop_step} of its whole batches "
             f"({used:,} examples; a last partial batch is never used)")
    return left


@contextlib.contextmanager
def _emptied_is_lost(me: str):
    """The finish reads only the run's own variables on the ps, which this worker trained
    against: one that is gone (NotFound) or uninitialised (FailedPrecondition) means the ps was
    restarted empty since, the lost ps's fault (201), not this task's own (1). .ci/run saw a
    worker end so, the ps killed at its last step and restarted before the worker's first read
    at the finish."""
    try:
        yield
    except EMPTIED as e:
        raise PeerLost(f"{me}: a ps lost the run's variables before the finish read them "
                       f"(restarted empty): {type(e).__name__}: {first_line(e)}") from e


def say_done(w: Worker, verdict: verdict_lib.Verdict) -> bool:
    """Reports done to every ps; whether the ps took the report. A ps that no longer answers
    cannot change a complete run: its verdict stands."""
    # Sync: only now may the ps tasks exit: the chief has read everything it needs from them.
    config = w.config
    try:
        report_done(w.server.target, w.graph, w.g.report_done, w.tf_config,
                    timeout=config.train.timeout, me=config.name,
                    ps_hosts=config.cluster.ps_hosts)
        return True
    except TaskTimeout as e:
        e.handled()
        # Sync: the run is complete and its verdict read from the ps's final counters; a ps
        # that stopped answering now cannot change either, and it ends by its own bound
        # (--timeout + --restart-grace). Failing here would report a verified run as failed.
        log.warning("%s; the run was already complete (verdict: %s), so this does not "
                    "change my result; the ps will end by its own bound", e, verdict.line)
        return False


def report_done(target: str, graph: tf.Graph, op: tf.Operation, tf_config: tf1.ConfigProto, *,
                timeout: float, me: str, ps_hosts: tuple[str, ...]) -> None:
    """Runs `op`, this worker's entry in every ps's done-queue, within `timeout` seconds."""
    def report():
        done = tf1.Session(target, graph=graph, config=tf_config)
        try:
            done.run(op, options=tf1.RunOptions(timeout_in_ms=int(timeout * 1000)))
        except (tf.errors.UnavailableError, tf.errors.AbortedError):
            # Sync: a ps exits as soon as it holds the last entry, which may be this one, before
            # the call has returned here; a ps that is gone has nothing left to wait for.
            log.info("the ps had exited by the end of my done report")
        finally:
            bounded.close_bounded(done.close, done)

    # Sync: a ps that accepts connections but does not answer would hold the session's creation
    # and first run past any RunOptions.
    bounded.bounded_call(report, timeout, f"{me}: waited {timeout:g} s to report done to the "
                                          f"ps ({', '.join(ps_hosts)})")
