"""A worker joins the cluster: it waits for the ps and (bounded) for the chief, compares its
settings with the chief's, makes the training session, and takes its place: global_step, or
its predecessor's token when it replaces a worker that died (a rejoin)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import tensorflow as tf

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import membership, sessions, stream, sync, warm_start
from sync_mnist.core.config import START_SECS, TaskTimeout
from sync_mnist.core.sessions import SideSession
from sync_mnist.task import hooks, report
from sync_mnist.task.graph import WorkerGraph
from sync_mnist.task.prepare import Worker
from sync_mnist.task.lockstep import BatchFeed, no_silent_end, token_owed

tf1 = tf.compat.v1
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Joined:
    """What joining gave: the session beside the training one, and where this worker starts."""

    side: SideSession  # reads and writes on the ps outside the training step
    status: sessions.SessionStatus  # the training session's: sessions made, saves failed
    start_step: int  # the local step this worker starts at (after any rejoin)
    planned: int  # local steps to run from there
    rejoined: bool  # took its predecessor's token instead of pushing again
    ready_at: float  # unix time the training session was ready
    startup_s: float  # process start to session ready
    chief_wait_s: float | None  # a non-chief's wait for the chief's initialisation
    feed: BatchFeed  # each step's batch, fed inside the training session


@contextlib.contextmanager
def join(w: Worker):
    """Yields (the training session, Joined), inside no_silent_end."""
    config, train = w.config, w.config.train
    # Sync: a ps, like the chief, may start after this worker (a pod still being scheduled,
    # a loaded host): both get the start-up allowance on top of --timeout.
    startup_wait = START_SECS + train.timeout
    for p, address in enumerate(config.cluster.ps_hosts):
        cluster_lib.wait_reachable(address, f"ps {p}", startup_wait)
    chief_wait = startup_wait
    mine = membership.settings(config, w.g.model_settings)
    waiting_since = time.monotonic()
    if not config.is_chief:
        log.info("%s to initialise the model (polling every %g s, for at most %g s)",
                 report.WAITING_FOR_CHIEF, sessions.READY_POLL_SECS, chief_wait)
        # Sync: compare settings with the chief's as soon as it has published them, before
        # anything that a different cluster size or model would break.
        with w.graph.as_default():
            _check_published(SideSession(w.server.target, w.graph, w.tf_config),
                             w.g.members, mine, config.name, chief_wait,
                             f"worker 0 at {config.cluster.address('worker', 0)}")
    status, feed = sessions.SessionStatus(), BatchFeed(w)
    monitored = _monitored_session(w, status, chief_wait, feed)
    side = SideSession(w.server.target, w.graph, w.tf_config, config.cluster.ps_hosts)
    with w.graph.as_default(), monitored as sess:
        startup_s = time.monotonic() - w.started
        ready_at, chief_wait_s = time.time(), None
        if not config.is_chief:
            chief_wait_s = time.monotonic() - waiting_since
        start_step, planned, rejoined = _take_position(w, side, status, mine, startup_s)
        joined = Joined(side, status, start_step, planned, rejoined, ready_at, startup_s,
                        chief_wait_s, feed)
        with no_silent_end(config.name):
            yield sess, joined


def _monitored_session(w: Worker, status: sessions.SessionStatus, chief_wait: float,
                       feed: BatchFeed):
    config, train, spec = w.config, w.config.train, w.g.spec
    mine = hooks.bounded(spec.training_hooks, "training", train.timeout)
    if config.is_chief:
        mine += hooks.bounded(spec.training_chief_hooks, "training chief", train.timeout)
    with w.graph.as_default():
        try:
            return sessions.monitored_session(
                w.server.target, is_chief=config.is_chief,
                hooks=[*w.g.training.hooks, feed, *mine],
                config=w.tf_config, timeout=chief_wait,
                checkpoint_dir=str(w.logdir) if w.logdir else None,
                save_steps=train.save_steps, save_secs=train.save_secs,
                transient=w.g.transient, ps_hosts=config.cluster.ps_hosts,
                recovery_timeout=train.timeout, status=status, restore=w.restore,
                events=w.writer)
        except tf.errors.DeadlineExceededError:
            raise TaskTimeout(
                f"worker {config.index}: waited {chief_wait:g} s for the chief (worker 0 at "
                f"{config.cluster.address('worker', 0)}) to initialise the model") from None
        except tf.errors.OpError as e:
            unreadable = warm_start.unreadable(w.warm, e)  # a ps that cannot read the source
            if unreadable is None:
                raise
            raise unreadable from None


def _take_position(w: Worker, side: SideSession, status: sessions.SessionStatus, mine: dict,
                   startup_s: float) -> tuple[int, int, bool]:
    """Where this worker starts: (start step, local steps planned, rejoined), from global_step,
    or its predecessor's token after a rejoin."""
    config, train, g = w.config, w.config.train, w.g
    if status.model == "continued":
        # A chief restarted into a running cluster: the settings are its predecessor's.
        membership.check_agreement(mine, side.run(g.members.published, options=w.bounded),
                                   me=config.name, restarted_chief=True)
    start_step = int(side.run(g.state.global_step, options=w.bounded))
    if status.model == "initialised" and w.warm:
        log.info("warm-started %d of the model's %d variables from %s, and %d of the "
                 "optimizer's", len(w.warm.names), len(g.model_variables), w.warm.source,
                 len(w.warm.state))
        if w.warm.fresh:
            log.warning(warm_start.fresh_line(w.warm))
    how = {"restored": f"restored from the checkpoint in {w.logdir}",
           "continued": "the model was already on the ps",
           "initialised": "initialised"}.get(status.model)
    n, r = config.cluster.num_workers, w.aggregate
    rejoined = False
    if train.mode == "sync" and r == n:
        # Sync: restarted into a running cluster, take the token the predecessor left (or
        # wait for the update its last gradient joined) instead of pushing twice.
        token = rejoin(side, g, config.index, w.bounded, train.timeout)
        if token is not None:
            log.info("rejoined at global_step %d: my predecessor's last gradient was "
                     "already pushed; took its token %d without pushing again",
                     start_step, token)
            rejoined, start_step = True, token
    planned = w.target if train.mode == "async" else w.target - start_step
    if start_step:  # Sync: its input from a saved position, not from the start (stream.py)
        i = config.index
        w.shard.resume_from(side.run(g.positions.blobs, options=w.bounded)[2 * i:2 * i + 2])
    log.info("ready after %.2f s; %s (global_step %d%s)", startup_s,
             "training until the first worker's input ends" if
             w.target == stream.UNTIL_INPUT_ENDS else
             f"training until global_step {w.target}" if r < n else
             f"{planned} local steps planned", start_step, f"; {how}" if how else "")
    return start_step, planned, rejoined


def _check_published(side: SideSession, members: membership.Membership, mine: dict,
                     me: str, wait: float, chief: str) -> None:
    """Waits (bounded) for the chief's published settings and compares them with `mine`.

    Raises ConfigError on a difference, TaskTimeout if nothing is published within `wait`.
    """
    deadline = time.monotonic() + wait
    poll = tf1.RunOptions(timeout_in_ms=5000)
    try:
        while not side.run(members.published_ready, options=poll):
            if time.monotonic() > deadline:
                raise TaskTimeout(f"{me}: waited {wait:g} s for the chief ({chief}) to "
                                  "initialise the model")
            time.sleep(sessions.READY_POLL_SECS)
        published = side.run(members.published, options=poll)
    except tf.errors.OpError:
        return  # the session creation that follows waits for the ps and reports it
    finally:
        side.close()
    membership.check_agreement(mine, published, me=me, restarted_chief=False)


def rejoin(side: SideSession, g: WorkerGraph, index: int, options,
           timeout: float) -> int | None:
    """With R = N: takes a token without pushing if this worker's predecessor left one
    (lockstep.token_owed). Returns the token taken, or None when this worker should simply
    push."""
    step = token_owed(side, g, index, options)
    if step is None:
        return None
    try:
        return int(side.run(g.training.rejoin, options=options))
    except tf.errors.DeadlineExceededError:
        raise TaskTimeout(f"worker {index}: rejoining at global_step {step}, waited "
                          f"{timeout:g} s for the update my predecessor's last gradient "
                          "joined") from None
