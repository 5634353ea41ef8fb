"""A parameter server's life, and the queues that end a run cleanly.

The question's ps called `server.join()`, which never returns. Here each ps owns a done-queue;
every worker enqueues its index there when it has finished, and the ps exits once it has
drained one entry per worker, not counting workers the chief declared lost. While it waits, a
watchdog bounds the wait: if global_step has not moved and no worker has reported done for
--timeout seconds (and a few more, so that the workers speak first), the ps gives up and says
why, naming the workers the next update is missing. Before any worker has initialised the
model, it waits the start-up bound (START_SECS + --timeout) and then names the workers whose
servers do not answer: all of them when every worker exited at start.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import tensorflow as tf

from sync_mnist.core import bounded, early_stop, membership, protocol, sessions, sync
from sync_mnist.task import preemption, report
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.config import (ConfigError, START_SECS, TaskConfig, TaskTimeout,
                                     TrainConfig, first_line)

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

POLL_SECS = 1.0  # the bound on each of the ps's own reads while it waits for done entries
# What a worker's stall report takes at most past its own bound (reading the counters, probing
# the ps): the ps gives up this much later, so that the workers speak first.
SPEAK_FIRST_SECS = 10.0


def start_server(config: TaskConfig):
    """This ps's gRPC server (a task started by cli.py has checked its port: preflight.py)."""
    return config.cluster.server("ps", config.index)


def run_ps(config: TaskConfig, *, server=None) -> report.TaskResult:
    """Serves variables until every worker has reported done; returns the counters it holds."""
    started = time.monotonic()
    n, timeout = config.cluster.num_workers, config.train.timeout
    if server is None:
        server = start_server(config)
    result = report.TaskResult(role="ps", index=config.index, mode=config.train.mode,
                               replicas_to_aggregate=config.train.aggregate(n))
    graph = tf.Graph()
    with graph.as_default():
        shared = protocol.build_shared(config)
        # Sync: a dequeue cut short by RunOptions' timeout can take an entry and lose it with
        # the cancelled step (tests/inprocess/test_ps.py shows it), so the ps never waits inside a dequeue:
        # it is the queue's only reader, and takes what size() says is there, all in one run.
        waiting = shared.done_queues[config.index].size()
        take_done = shared.done_queues[config.index].dequeue_many(waiting)
        # Sync: preempted, the ps asks for the stop on ps 0 as a worker would (early_stop.py).
        preempt = early_stop.preempt_op(shared.stop, shared.state.global_step,
                                        config.train.mode)
    log.info("serving %s; waiting for %d workers to report done (timeout %g s without progress)",
             config.cluster.address("ps", config.index), n, timeout)

    def new_session():
        return tf1.Session(server.target, graph=graph,
                           config=sessions.session_config(["/job:ps"]))

    watch = _Watch(config, new_session, shared, waiting, take_done, preempt)
    try:
        watch.wait_for_the_other_ps()
        watch.until_every_worker_is_done()
    finally:
        bounded.close_bounded(watch.sess.close, watch.sess)
    lost, counters = watch.lost, watch.counters
    result.train_s = time.monotonic() - started
    result.lost = lost or None
    result.preempted_at = watch.preempted_at
    if counters:
        result.record_counters(counters)
    log.info("all %d workers done%s; global_step=%s contributions=%s; exiting", n,
             f" or lost ({', '.join(f'worker {w}' for w in lost)})" if lost else "",
             counters.global_step if counters else "unread", counters.accepted if counters
             else "unread (another ps had already exited)")
    return result


def _idle_bound(train: TrainConfig, training: bool, done: set[int]) -> float:
    """How long a ps waits without progress (global_step moved, a done report taken).

    Before the chief has initialised anything, allow for the workers' start-up too (they
    import TensorFlow and load data, possibly on hosts started later). Once training runs,
    wait a little longer than the workers' own bound (--timeout, then --restart-grace for a
    replacement: lockstep.py), so that they, who know more, speak first, and a worker
    restarted within it finds its ps. The chief reports done last, once it has written the
    model, which a full disk holds up for as long as --timeout (chief.write_model).
    """
    writing = train.timeout if done and 0 not in done else 0.0
    return train.timeout + writing + (train.restart_grace + SPEAK_FIRST_SECS if training
                                      else START_SECS)


class _Watch:
    """The ps's wait for the done entries, as its jobs: drain the done entries, read the final
    counters, check the chief's settings, follow the lost marks, and the no-progress watchdog."""

    def __init__(self, config: TaskConfig, new_session, shared: protocol.Shared, waiting,
                 take_done, preempt):
        self.config, self.shared = config, shared
        self.new_session, self.sess = new_session, new_session()
        self.waiting, self.take_done, self.preempt = waiting, take_done, preempt
        self.asked_to_stop = False
        self.preempted_at: int | None = None  # read with the final counters
        self.poll = tf1.RunOptions(timeout_in_ms=int(POLL_SECS * 1000))
        self.bounded = tf1.RunOptions(timeout_in_ms=int(config.train.timeout * 1000))
        self.done: set[int] = set()
        self.lost: list[int] = []
        self.checked = False  # whether the chief's settings have been compared with ours
        self.counters: verdict_lib.Counters | None = None
        self.last_step, self.last_progress = None, time.monotonic()
        self.initialised = False  # whether any read of ps 0 has found the model initialised

    def wait_for_the_other_ps(self) -> None:
        # Sync: the first run creates the session, which waits without end for every ps; a
        # sibling may still be starting, so allow it the start-up a worker allows the chief.
        config = self.config
        first_wait = START_SECS + config.train.timeout
        others = [a for p, a in enumerate(config.cluster.ps_hosts) if p != config.index]
        what = (f"ps {config.index}: waited {first_wait:g} s for the other ps "
                f"({', '.join(others) or 'none'}) to answer")
        deadline = time.monotonic() + first_wait
        # A poll cut short answers nothing (the queue is this ps's own, so only the session's
        # wait for the other ps can make it wait): poll again, within the same bound.
        while (left := deadline - time.monotonic()) > 0:
            try:
                bounded.bounded_call(lambda: self.sess.run(self.waiting, options=self.poll),
                                     left, what)
                return
            except tf.errors.DeadlineExceededError:
                continue
        raise TaskTimeout(f"{what}; it did not answer")

    def until_every_worker_is_done(self) -> None:
        """Returns once every worker has reported done or been declared lost."""
        preemption.arm()
        # Sync: a worker the chief declared lost will never report done; do not wait for it.
        while len(self.done | set(self.lost)) < self.config.cluster.num_workers:
            if preemption.requested() and not self.asked_to_stop:
                self._ask_to_stop()
            entries = _entries_waiting(self.sess, self.waiting, self.poll)
            if entries:
                self._take_done_entries(entries)
                continue
            time.sleep(sessions.READY_POLL_SECS)
            # One read of ps 0 a poll, whichever ps this is (it costs ps 0 a run per poll).
            try:
                reading = _read_shared(self.sess, self.shared.state, self.shared.members,
                                       with_published=not self.checked)
            except (tf.errors.AbortedError, tf.errors.CancelledError) as e:
                self._renew_session(e)
                reading = None
            self._check_the_chiefs_settings(reading)
            if reading:
                self.initialised = True
                self.lost = [w for w, mark in enumerate(reading.finished)
                             if mark == membership.LOST]
            self._watchdog(reading)
        if self.counters is None:  # every worker was lost
            self.counters = _final_counters(self.sess, self.shared.state, self.poll)

    def _renew_session(self, error: tf.errors.OpError) -> None:
        """ps 0 was restarted (empty) since this session last read it: the session still names
        the graph the old process held, and each read would fail so (AbortedError; or
        CancelledError, the read cut off as the old process went). A new session registers
        its reads afresh; the restarted ps 0 waits for the chief to initialise it again, as the
        workers do. (Before: the ps ended 201, and with it the restarted ps 0, which lost it:
        `make chaos`, 2 ps, ps 0 killed near the end, the run failed on the second fault.)"""
        log.warning("ps 0 was restarted (%s); re-creating the session", first_line(error))
        bounded.close_bounded(self.sess.close, self.sess)
        self.sess = self.new_session()
        self.wait_for_the_other_ps()  # its first run, which waits for every ps, bounded

    def _ask_to_stop(self) -> None:
        """Preempted: the next update is the cluster's last. Before any worker has trained
        (the model not initialised yet), there is nothing to stop: the ps stops at once."""
        try:
            self.sess.run(self.preempt, options=self.bounded)
        except tf.errors.FailedPreconditionError:
            raise KeyboardInterrupt from None
        self.asked_to_stop = True

    def _take_done_entries(self, entries: int) -> None:
        # They are there and the ps is the queue's only reader: this cannot wait, and no short
        # bound may cut it off (and lose entries) while it registers its graph. One run for
        # every entry waiting, however many workers reported done since the last poll.
        workers = self.sess.run(self.take_done, {self.waiting: entries}, options=self.bounded)
        self.last_progress = time.monotonic()
        bad = sorted(-1 - int(w) for w in workers if w < 0)
        if bad:  # Sync: a worker with bad input exits 2 for good: the cluster cannot train
            raise ConfigError(
                f"ps {self.config.index}: worker{'s' if len(bad) > 1 else ''} "
                f"{', '.join(map(str, bad))} exited with bad input (2; "
                f"{'their' if len(bad) > 1 else 'its'} own lines say why): the cluster cannot "
                "train without it")
        for worker in (int(w) for w in workers):
            self.done.add(worker)
            log.info("worker %d reported done (%d of %d)", worker, len(self.done),
                     self.config.cluster.num_workers)
        if self.counters is None:
            # Sync: a worker reports done only after the finish barrier, so the counters are
            # final now; read them while every ps is sure to be up (with several ps, another
            # may exit as soon as it has its last entry).
            self.counters = _final_counters(self.sess, self.shared.state, self.poll)
            self.preempted_at = _preempted_at(self.sess, self.shared.stop, self.poll)

    def _check_the_chiefs_settings(self, reading: _Reading | None) -> None:
        if reading and reading.published is not None:
            # Sync: the chief has published its settings with the model: compare ours.
            membership.check_agreement(membership.settings(self.config), reading.published,
                                       me=self.config.name, restarted_chief=False)
            self.checked = True

    def _watchdog(self, reading: _Reading | None) -> None:
        """Raises TaskTimeout when global_step has not moved, and no worker reported done, for
        too long."""
        config, done, lost = self.config, self.done, self.lost
        step = reading.global_step if reading else None
        if step != self.last_step:
            self.last_step, self.last_progress = step, time.monotonic()
        idle = time.monotonic() - self.last_progress
        if idle > _idle_bound(config.train, step is not None, done):
            if not self.initialised:
                raise TaskTimeout(_never_initialised(config))
            seen = "global_step unread: ps 0 did not answer" if step is None else (
                f"global_step stuck at {step}")
            missing = []
            if reading and len(done | set(lost)) == 0:
                seen += "; missing: " + membership.missing(reading.last_push, step,
                                                           config.cluster)
                missing = membership.missing_peers(reading.last_push, step)
            raise TaskTimeout(
                f"ps {config.index}: no progress for {idle:.0f} s ({seen}; workers done: "
                f"{sorted(done) or 'none'} of {config.cluster.num_workers}"
                f"{'; lost: ' + str(lost) if lost else ''})", missing=missing)


def _never_initialised(config: TaskConfig) -> str:
    """The watchdog's message when no worker has initialised the model since this ps
    started: whose server answers. A worker that exited at start (its model failed to
    import, say) and one not started yet look alike from here: neither answers."""
    bound = (f"the start-up bound, {START_SECS + config.train.timeout:g} s ({START_SECS:g} s "
             f"+ --timeout {config.train.timeout:g} s)")
    silent = membership.silent_workers(config.cluster)
    named = "; ".join(f"worker {w}: {why}" for w, why in silent.items())
    if len(silent) == config.cluster.num_workers:
        return (f"ps {config.index}: no worker joined within {bound}: the model was never "
                f"initialised, and no worker's server answers ({named}); each exited at "
                "start or never started")
    answer = [w for w in range(config.cluster.num_workers) if w not in silent]
    return (f"ps {config.index}: the model was not initialised within {bound}; the "
            f"servers of worker{'s' if len(answer) > 1 else ''} "
            f"{', '.join(map(str, answer))} answer"
            f"{'; silent: ' + named if named else ''}")


def _final_counters(sess, state: sync.SharedState, options) -> verdict_lib.Counters | None:
    try:
        return verdict_lib.Counters.read(sess, state, options=options)
    except tf.errors.OpError as e:
        log.warning("could not read the final counters: %s", str(e).splitlines()[0])
        return None


def _preempted_at(sess, stop: early_stop.StopVars, options) -> int | None:
    """The update a preemption stopped the cluster on, or None (no preemption, or ps 0 gone)."""
    try:
        step, reason = sess.run([stop.stop_step, stop.reason], options=options)
    except tf.errors.OpError as e:
        log.warning("could not read whether the run was preempted: %s", str(e).splitlines()[0])
        return None
    return int(step) if reason == early_stop.PREEMPTED else None


class _Reading(NamedTuple):
    global_step: int
    last_push: list[int]
    finished: list[int]
    published: bytes | None  # asked for only until the settings have been compared


def _read_shared(sess, state: sync.SharedState, members: membership.Membership, *,
                 with_published: bool) -> _Reading | None:
    """What the ps watches, all on ps 0, in one run; None while the chief has not initialised
    it (the model and membership are initialised together) or ps 0 does not answer."""
    fetches = [state.global_step, members.last_push, members.finished] + (
        [members.published] if with_published else [])
    try:
        step, last_push, finished, *published = sess.run(
            fetches, options=tf1.RunOptions(timeout_in_ms=int(POLL_SECS * 1000)))
    except (tf.errors.FailedPreconditionError, tf.errors.DeadlineExceededError,
            tf.errors.UnavailableError):
        return None
    return _Reading(int(step), [int(v) for v in last_push], [int(v) for v in finished],
                    published[0] if published else None)


def _entries_waiting(sess, size, options) -> int:
    """How many done entries the queue holds; 0 if the read ran out of time (none is lost)."""
    try:
        return int(sess.run(size, options=options))
    except tf.errors.DeadlineExceededError:
        return 0
