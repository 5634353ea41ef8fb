"""Session creation for the chief and the other workers: prompt, bounded, and restart-aware.

The chief keeps a model that is already on the ps (it was restarted into a running cluster),
else restores the latest checkpoint of --logdir, else initialises. Every worker re-creates its
session when a ps is lost (MonitoredSession does so on UnavailableError and AbortedError), but
for at most --timeout seconds: past that it stops and says which ps it could not reach.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import tensorflow as tf

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import membership, placement
from sync_mnist.core.config import ConfigError, TaskTimeout

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

# Sync: how often a non-chief worker checks whether the chief has initialised the variables.
# SessionManager's default is 30 s, which is why the question's workers sat idle for half a
# minute after the chief was ready; a quarter second costs one cheap RPC per poll.
READY_POLL_SECS = 0.25

# Threads (the chief's queue runner) get this long to stop when a session closes. The queue
# runner is blocked on the accumulators when training ends, waiting for gradients that will
# never come; only closing the session cancels that wait, so waiting longer (MonitoredSession's
# default is 120 s) only delays the exit.
STOP_GRACE_SECS = 0.25

_LOST_PS = (tf.errors.UnavailableError, tf.errors.AbortedError)  # what MonitoredSession retries
# What a ps restarted empty answers a read or write of a variable it held: its resource is
# gone (NotFound), or is not initialised again yet (FailedPrecondition).
_EMPTIED = (tf.errors.NotFoundError, tf.errors.FailedPreconditionError)
GLOBAL_STEP = "global_step"  # the variable's name, as tf.train.get_or_create_global_step makes it

# Closing a session whose ps is gone blocks without end (TensorFlow keeps retrying to release
# the graphs it registered there), and MonitoredSession closes the old session before it makes
# a new one. A close gets this long; then it is left to finish, or not, in the background.
CLOSE_SECS = 2.0
# A side session's bounded run whose RunOptions timeout did not hold is given up this long
# after it (SideSession._run); TensorFlow's own DeadlineExceededError comes first when it does.
RUN_GRACE_SECS = 2.0
_abandoned: list = []  # sessions whose close did not return; kept so no destructor re-closes


class ModelLost(RuntimeError):
    """The ps lost the model mid-run and no checkpoint can bring it back."""


@dataclasses.dataclass
class SessionStatus:
    """What session creation did, for the log and the result record."""

    sessions: int = 0  # sessions created; more than one means a ps was lost and came back
    model: str | None = None  # chief: "initialised", "restored" (from a checkpoint), "continued"
    failed_saves: int = 0  # chief: checkpoint saves that failed for want of room (warned)
    save_error: str | None = None  # chief: the last one's warning
    final_save: Callable | None = None  # chief with a logdir: save_final's hook (its end)


def session_config(device_filters: list[str]) -> tf1.ConfigProto:
    return tf1.ConfigProto(device_filters=device_filters, allow_soft_placement=False,
                           log_device_placement=False)


class _Bounded:
    """Shared by both session creators: counts sessions, bounds re-creation after a lost ps."""

    def _setup_bound(self, timeout: float, ps_hosts: Sequence[str], status: SessionStatus):
        self._timeout, self._ps_hosts, self._status = timeout, tuple(ps_hosts), status
        self._failing_since: float | None = None

    def _create_bounded(self, create):
        if self._status.sessions:
            # A ps was lost. TensorFlow's CreateSession waits without end for an absent task,
            # so first wait (bounded) until every ps accepts connections again.
            if self._failing_since is None:
                log.warning("lost the connection to the ps; re-creating the session (waiting "
                            "at most %g s for the ps)", self._timeout)
            for p, address in enumerate(self._ps_hosts):
                try:
                    cluster_lib.wait_reachable(address, f"ps {p}", self._remaining())
                except cluster_lib.ClusterError as e:
                    raise TaskTimeout(
                        f"lost the ps mid-run and it did not come back: {e}") from None
        try:
            sess = create()
        except _LOST_PS as e:
            if self._remaining() <= 0:
                raise TaskTimeout(f"could not re-create a session for {self._timeout:g} s after "
                                  f"losing the ps: {first_line(e)}") from None
            time.sleep(READY_POLL_SECS)
            raise  # MonitoredSession tries again
        self._failing_since = None
        self._status.sessions += 1
        real_close = sess.close
        sess.close = lambda: close_bounded(real_close, sess)
        return sess

    def _remaining(self) -> float:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        return self._timeout - (now - self._failing_since)


def bounded_call(call, timeout: float, what: str):
    """Returns call(), or raises TaskTimeout naming `what` if it has not returned in `timeout` s.

    For TensorFlow calls that no RunOptions can bound: creating a session, and the first run in
    it, wait without end for a task that accepts connections but does not answer. The call
    runs in a thread of its own; past the bound it is left to finish, or not, in the
    background (TaskTimeout then sees that the process ends). Its exceptions are the caller's.
    """
    outcome: dict = {}
    graph = tf1.get_default_graph()  # thread-local: the call's thread starts with the global one

    def run():
        try:
            with graph.as_default():
                outcome["value"] = call()
        except BaseException as e:  # re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TaskTimeout(f"{what}; it did not answer")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@contextlib.contextmanager
def closed_bounded(sess):
    """`with closed_bounded(tf1.Session(...)) as sess:` closes it with close_bounded: closing
    blocks while a peer it ran ops on is gone (say, another ps that has already exited)."""
    try:
        yield sess
    finally:
        close_bounded(sess.close, sess)


def close_bounded(close, sess) -> None:
    """Calls close() for at most CLOSE_SECS; past that, leaves it running in the background.

    A close that fails because the ps is gone is no news: the caller is replacing the session.
    """
    def quietly():
        try:
            close()
        except tf.errors.OpError:
            pass

    closing = threading.Thread(target=quietly, daemon=True)
    closing.start()
    closing.join(CLOSE_SECS)
    if closing.is_alive():
        _abandoned.append(sess)


class _PromptWorkerSessionCreator(tf1.train.WorkerSessionCreator, _Bounded):
    """WorkerSessionCreator whose SessionManager polls every READY_POLL_SECS, not every 30 s."""

    def _get_session_manager(self):
        if self._session_manager is None:
            self._session_manager = tf1.train.SessionManager(
                local_init_op=self._scaffold.local_init_op,
                local_init_feed_dict=self._scaffold.local_init_feed_dict,
                ready_op=self._scaffold.ready_op,
                ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
                graph=tf1.get_default_graph(),
                recovery_wait_secs=READY_POLL_SECS)
        return self._session_manager

    def create_session(self):
        create = super().create_session
        # Sync: each of its polls runs an op on the ps, which waits without end for a ps that
        # accepts connections but does not answer (a stopped process).
        bound = self._max_wait_secs + self._timeout
        return self._create_bounded(lambda: bounded_call(
            create, bound, f"waited {bound:g} s for the ps ({', '.join(self._ps_hosts)}) to "
                           "answer while waiting for the chief's model"))


class _ChiefSessionManager(tf1.train.SessionManager):
    """prepare_session that keeps a model already on the ps, before restoring or initialising.

    The stock chief always restores the latest checkpoint or initialises. A chief restarted
    into a running cluster would so roll the ps back under the other workers' feet (or wipe
    it), and their local steps and counts would no longer match global_step.
    """

    def __init__(self, *, model_missing: tf.Tensor, model_size: int, status: SessionStatus,
                 checkpoint_dir: str | None, restore: Restorable | None, timeout: float,
                 ps_hosts: Sequence[str], **kwargs):
        super().__init__(**kwargs)
        self._model_missing, self._status = model_missing, status
        self._model_size = model_size
        self._checkpoint_dir, self._restore = checkpoint_dir, restore
        self._local_init = kwargs["local_init_op"]
        self._timeout, self._ps_hosts = timeout, tuple(ps_hosts)

    def prepare_session(self, master, **kwargs):
        # The stock part takes no RunOptions, and session creation none at all: bound it whole.
        return bounded_call(lambda: self._prepare(master, **kwargs), self._timeout,
                            f"the chief: waited {self._timeout:g} s for the ps "
                            f"({', '.join(self._ps_hosts)}) to keep, restore or initialise the "
                            "model")

    def _prepare(self, master, **kwargs):
        options = tf1.RunOptions(timeout_in_ms=int(self._timeout * 1000))
        sess = tf1.Session(master, graph=self._model_missing.graph, config=kwargs.get("config"))
        try:
            missing = sess.run(self._model_missing, options=options)
            if not len(missing):
                sess.run(self._local_init, options=options)
                self._status.model = "continued"
                return sess
        except BaseException:
            close_bounded(sess.close, sess)
            raise
        close_bounded(sess.close, sess)
        # The first session restores the checkpoint check_checkpoint chose: the newest intact
        # one, which is not latest_checkpoint's when the newest is damaged (latest_checkpoint
        # would fail mid-restore, or, with its index missing, return None: a silent fresh
        # start). A later one (a ps was lost) restores this run's newest, complete save.
        restore = self._restore if not self._status.sessions else None
        restoring = bool(restore or self._checkpoint_dir and
                         tf.train.latest_checkpoint(self._checkpoint_dir))
        # Sync: some variables there and others not: a ps was restarted and lost its share,
        # while another kept its own and the sync state beside it (accumulators, token
        # queues). Initialising over that would mix the old state into the new updates; a
        # chief restarted after the loss sees it so, as a fresh process.
        partial = len(missing) < self._model_size
        if (self._status.sessions or partial) and not restoring:
            # A restarted ps has lost the model. Initialising it afresh would silently start
            # training over under the workers' feet.
            raise ModelLost("the ps was restarted and has lost the model, and there is no "
                            "checkpoint to restore it from (give the chief --logdir)" + (
                                f"; {len(missing)} of its {self._model_size} variables are "
                                f"missing, such as {missing[0].decode()}" if partial else ""))
        if restore:
            kwargs.update(checkpoint_dir=None, checkpoint_filename_with_path=restore.path)
        sess = super().prepare_session(master, **kwargs)
        if restore:
            # What the stock restore from checkpoint_dir does, less the damaged ones: so the
            # Saver goes on keeping (and in time deletes) the older checkpoints, not only its own.
            kwargs["saver"].recover_last_checkpoints(list(restore.kept))
        self._status.model = "restored" if restoring else "initialised"
        return sess


class _ChiefSessionCreator(tf1.train.ChiefSessionCreator, _Bounded):
    def __init__(self, scaffold, master, config, *, checkpoint_dir, restore, model_missing,
                 model_size, status, prepare_timeout, ps_hosts):
        super().__init__(scaffold, master, config, checkpoint_dir=checkpoint_dir)
        self._model_missing, self._status_for_manager = model_missing, status
        self._restore = restore
        self._model_size = model_size
        self._prepare_timeout, self._ps_hosts_for_manager = prepare_timeout, ps_hosts

    def _get_session_manager(self):
        if self._session_manager is None:
            self._session_manager = _ChiefSessionManager(
                model_missing=self._model_missing, model_size=self._model_size,
                status=self._status_for_manager,
                checkpoint_dir=self._checkpoint_dir, restore=self._restore,
                timeout=self._prepare_timeout,
                ps_hosts=self._ps_hosts_for_manager,
                local_init_op=self._scaffold.local_init_op,
                local_init_feed_dict=self._scaffold.local_init_feed_dict,
                ready_op=self._scaffold.ready_op,
                ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
                graph=tf1.get_default_graph())
        return self._session_manager

    def create_session(self):
        return self._create_bounded(super().create_session)


class _OneLineRecoveryLog(logging.Filter):
    """MonitoredSession logs a lost ps in five lines of advice and gRPC detail; keep one."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "may be due to a preemption" in text:
            lines = [line.strip() for line in text.split("Error: ", 1)[-1].splitlines()]
            record.msg, record.args = "a ps was lost (%s); re-creating the session", (
                " ".join(lines[:2]),)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_recovery_log_filter = _OneLineRecoveryLog()


def _init_if_uninitialized(v: tf.Variable) -> tf.Operation:
    # The assign is made inside the branch: an op made outside would run either way.
    return tf1.cond(tf1.is_variable_initialized(v), tf.no_op,
                    lambda: tf.group(tf1.assign(v, v.initial_value)))


def monitored_session(master: str, *, is_chief: bool, hooks: list, config: tf1.ConfigProto,
                      timeout: float, checkpoint_dir: str | None = None,
                      save_steps: int | None = None, save_secs: float | None = None,
                      transient: Sequence[tf.Variable] = (), ps_hosts: Sequence[str] = (),
                      recovery_timeout: float | None = None,
                      status: SessionStatus | None = None,
                      restore: Restorable | None = None,
                      events=None) -> tf1.train.MonitoredSession:
    """A MonitoredSession for one worker.

    The chief keeps the model on the ps if it is there, else restores `restore` (see
    check_checkpoint) or else the latest checkpoint in checkpoint_dir, else initialises; it
    saves every save_secs seconds if given, else every save_steps global steps, keeping
    KEEP_CHECKPOINTS. The others wait at most `timeout` seconds for the chief.

    Args:
      transient: variables on the ps that checkpoints leave out; the chief initialises them
        whenever it finds them uninitialised (a fresh or restored model), never otherwise.
      ps_hosts: where the ps tasks listen; after a lost ps, session creation first waits for
        them to accept connections.
      recovery_timeout: how long re-creating a session after a lost ps may take (default:
        `timeout`).
      status: filled in as sessions are created (and, on the chief, as saves fail).
      restore: the checkpoint the chief's first session restores, if the model is not on the
        ps (check_checkpoint's choice); later sessions restore the latest in checkpoint_dir.
      events: the checkpoint saver's writer for its notes in the events file, in place of
        TensorFlow's own (metrics.EventsWriter: a full disk does not fail the run).
    """
    status = status if status is not None else SessionStatus()
    tf.get_logger().addFilter(_recovery_log_filter)  # idempotent: a logger holds a filter once
    hooks = list(hooks)
    bound = timeout if recovery_timeout is None else recovery_timeout
    if is_chief:
        everything = tf1.global_variables()
        kept = [v for v in everything if all(v is not t for t in transient)]
        scaffold = tf1.train.Scaffold(
            saver=tf1.train.Saver(kept if transient else None, sharded=True, allow_empty=True,
                                  max_to_keep=KEEP_CHECKPOINTS),
            ready_for_local_init_op=tf1.report_uninitialized_variables(kept),
            local_init_op=tf.group(tf1.train.Scaffold.default_local_init_op(),
                                   *[_init_if_uninitialized(v) for v in transient]))
        creator = _ChiefSessionCreator(
            scaffold, master, config, checkpoint_dir=checkpoint_dir, restore=restore,
            status=status,
            model_missing=tf1.report_uninitialized_variables(everything),
            model_size=len(everything),
            prepare_timeout=bound, ps_hosts=ps_hosts)
        if checkpoint_dir:
            saver_hook = _SharedCheckpointSaverHook(
                checkpoint_dir, timeout=bound, ps_hosts=ps_hosts, status=status, events=events,
                save_secs=save_secs,
                save_steps=None if save_secs else save_steps, scaffold=scaffold)
            hooks.append(saver_hook)
            status.final_save = _BoundedHook(saver_hook, bound, ps_hosts).end
    else:
        scaffold = tf1.train.Scaffold()
        creator = _PromptWorkerSessionCreator(scaffold, master, config, max_wait_secs=timeout)
    creator._setup_bound(bound, ps_hosts, status)  # pylint: disable=protected-access
    hooks = [_BoundedHook(h, bound, ps_hosts) for h in hooks]
    return tf1.train.MonitoredSession(creator, hooks, stop_grace_period_secs=STOP_GRACE_SECS)


def save_final(sess: tf1.train.MonitoredSession, status: SessionStatus) -> None:
    """The chief: saves the model as training left it, unless its last step was saved.

    Sync: MonitoredSession saves it only when it closes (the saver hook's end), after the
    finish, the evaluation and the export, which read the ps for seconds more; a ps lost then
    would lose every update since the last periodic save. Saved here, right after the last
    step, the run's final state is on disk before anything else can go wrong. The hook's end
    at close then finds this step saved and saves nothing.
    """
    if status.final_save is not None:
        # The session itself, not MonitoredSession's recovery: after a lost ps, run_step_fn
        # re-creates the session but retries with the closed one ("Attempted to use a closed
        # Session"). A ps lost here fails the chief (201), and the launcher restarts both.
        status.final_save(sess.run_step_fn(lambda step_context: step_context.session))


class _BoundedHook(tf1.train.SessionRunHook):
    """`hook`, with its calls at a session's creation and end bounded (bounded_call).

    Sync: MonitoredSession runs every hook's after_create_session (a checkpoint save, a read of
    global_step) and end (the last save) with no RunOptions, so a stopped ps would hold them
    without end. The calls of each step are left as they are: they run in the step's own
    Session.run, which the caller bounds, and a thread per step would cost the step time.
    """

    def __init__(self, hook: tf1.train.SessionRunHook, timeout: float, ps_hosts: Sequence[str]):
        self.hook, self._timeout = hook, timeout
        self._what = (f"waited {timeout:g} s for the ps ({', '.join(ps_hosts)}) in "
                      f"{type(hook).__name__}")

    def begin(self):
        self.hook.begin()

    def after_create_session(self, session, coord):
        bounded_call(lambda: self.hook.after_create_session(session, coord), self._timeout,
                     f"{self._what}.after_create_session")

    def before_run(self, run_context):
        return self.hook.before_run(run_context)

    def after_run(self, run_context, run_values):
        self.hook.after_run(run_context, run_values)

    def end(self, session):
        bounded_call(lambda: self.hook.end(session), self._timeout, f"{self._what}.end")


ROOM_RETRY_SECS = 1.0  # between tries of a write that found no room (retry_for_room)


def retry_for_room(write: Callable, no_room: type[Exception], window: float,
                   stop: Callable[[], bool] = lambda: False):
    """(write(), tries): a write that found no room on its disk (raised `no_room`) is tried
    again every ROOM_RETRY_SECS for up to `window` s (half of --timeout: a disk freed
    meanwhile keeps it), with one warning; then, or once `stop()`, its error is raised."""
    deadline, tries = time.monotonic() + window, 0
    while True:
        tries += 1
        try:
            return write(), tries
        except no_room as e:
            if deadline - time.monotonic() < ROOM_RETRY_SECS or stop():
                raise
            if tries == 1:
                log.warning("%s; trying again every %g s for up to %g s (half of --timeout)",
                            e, ROOM_RETRY_SECS, window)
        time.sleep(ROOM_RETRY_SECS)  # a disk's room: nothing to wait on but time


class _NoRoom(ConfigError):
    """The run's first checkpoint found no room under --logdir."""


class _SharedCheckpointSaverHook(tf1.train.CheckpointSaverHook):
    """CheckpointSaverHook that checks, at a session's first save, that the checkpoint is
    complete where the chief restores from, and that outlives a full disk.

    Sync: the saver is sharded. Each ps runs the save of its own variables and writes their
    shard to its own filesystem, and the last ps merges the shards' indexes there; the chief
    writes only the `checkpoint` file. On hosts that do not share --logdir, the chief would
    never find a checkpoint to restore: a lost ps would be a lost model, a resume a fresh start.

    A save that fails for want of room (ENOSPC, EDQUOT, EFBIG: TensorFlow's
    ResourceExhaustedError) is a warning, and training goes on: the model is on the ps, and the
    `checkpoint` file, written only after a save is complete, still names the last complete
    one. Stopping would lose the run for the sake of a checkpoint. The first save of the run is
    the exception: nothing is trained yet, and a --logdir with no room for one checkpoint is
    bad input (ConfigError, exit 2), once it has been tried again (retry_for_room) for half
    of --timeout (a disk freed meanwhile: the run goes on; the workers wait for the
    chief's first update for --timeout).
    """

    def __init__(self, checkpoint_dir: str, *, timeout: float, ps_hosts: Sequence[str],
                 status: SessionStatus, events=None, **kwargs):
        super().__init__(checkpoint_dir, **kwargs)
        self._logdir, self._timeout, self._ps_hosts = checkpoint_dir, timeout, tuple(ps_hosts)
        self._status, self._checked, self._events = status, False, events
        self._graph_written = False

    def begin(self):
        super().begin()
        if self._events is not None:  # the same events file, behind a guard against ENOSPC
            self._summary_writer = self._events

    def _save(self, session, step):
        # The graph is written (graph.pbtxt, the events): a first save tried again for want of
        # room (after_create_session) is this alone.
        self._graph_written = True
        # Sync: the ps write the shards; a save has no RunOptions, so a stopped ps would hold
        # the chief's step (this runs in after_run) without end.
        try:
            return bounded_call(
                lambda: super(_SharedCheckpointSaverHook, self)._save(session, step),
                self._timeout, f"the chief: waited {self._timeout:g} s for the ps "
                               f"({', '.join(self._ps_hosts)}) to save the checkpoint of "
                               f"global_step {step} in {self._logdir}")
        except tf.errors.ResourceExhaustedError as e:
            # A shard that was written (another ps's) would hold room the next save needs.
            shutil.rmtree(f"{self._save_path}-{step}_temp", ignore_errors=True)
            self._no_room(e, f"the checkpoint of global_step {step}")
            return False

    def _no_room(self, error: tf.errors.ResourceExhaustedError, what: str) -> None:
        reason = storage_error(error)
        if not self._checked:
            raise _NoRoom(f"--logdir {self._logdir} has no room for a checkpoint: {reason} "
                              f"while saving {what}: free some space there, or give another "
                              "--logdir") from None
        self._status.failed_saves += 1
        self._status.save_error = (f"could not save {what} in {self._logdir}: {reason}; "
                                   "training on: the model is on the ps")
        log.warning("%s", self._status.save_error)

    def after_create_session(self, session, coord):
        saved, tries = retry_for_room(lambda: self._first_save(session, coord), _NoRoom,
                                      self._timeout / 2)
        if not saved:
            return
        if tries > 1:
            log.info("saved the first checkpoint in %s (try %d)", self._logdir, tries)
        self._check_first_save()

    def _first_save(self, session, coord) -> bool:
        """Writes graph.pbtxt and the model as it is now; False if graph.pbtxt found no room
        once the first save had been made (a session made again: a warning, no save)."""
        if self._graph_written:  # tried before as far as the save: the save alone again
            step = session.run(self._global_step_tensor)
            self._save(session, step)
            self._timer.update_last_triggered_step(step)
            return True
        try:
            super().after_create_session(session, coord)
        except tf.errors.ResourceExhaustedError as e:  # writing graph.pbtxt, before the save
            self._no_room(e, "graph.pbtxt")
            return False
        except tf.errors.OpError as e:
            missing = re.search(r"NOT_FOUND: (\S+) not found", str(e))
            if "MergeV2Checkpoints" not in str(e) or not missing:
                raise
            raise ConfigError(_not_shared(self._logdir, f"the last ps cannot find "
                                          f"{missing.group(1)}, another ps's shard, to merge "
                                          "the checkpoint")) from None
        return True

    def _check_first_save(self):
        # Not tf.train.latest_checkpoint, which logs an error of its own for a missing shard.
        state = tf.train.get_checkpoint_state(self._logdir)  # the chief's own file: present
        path = state.model_checkpoint_path
        damage = checkpoint_damage(path)
        if damage is not None:
            raise ConfigError(_not_shared(self._logdir, f"the chief cannot read "
                                          f"{Path(path).name}: {damage}"))
        self._checked = True


def storage_error(error: tf.errors.OpError) -> str:
    """What a failed file write says, with its errno's name: "No space left on device
    (ENOSPC)"; TensorFlow's message ends in "<file>; <strerror>"."""
    for line in error.message.splitlines():
        for number, name in errno.errorcode.items():
            if line.endswith(f"; {os.strerror(number)}"):
                return f"{os.strerror(number)} ({name})"
    return first_line(error)


def _not_shared(logdir: str, reason: str) -> str:
    return (f"--logdir {logdir}: the checkpoint just saved is not complete where the chief "
            f"restores from ({reason}): each ps writes its own variables to its own filesystem, "
            "so --logdir must be storage that every ps and the chief share, at the same path")


# Sync: a checkpoint can be damaged where it lies: a sharded save that lost a shard while the
# `checkpoint` file already named it (tensorflow#14608), an index cut short by a crash ("too
# short to be an sstable", #13588, #6644; neither the shards nor the `checkpoint` file are
# fsynced). A resume then falls back to the newest intact one, so the Saver keeps more than one.
KEEP_CHECKPOINTS = 5


@dataclasses.dataclass(frozen=True)
class Restorable:
    """The checkpoint a resume restores (check_checkpoint's choice), and the ones the chief's
    Saver goes on keeping: those listed in the `checkpoint` file up to it, oldest first, less
    any found damaged."""

    path: str
    kept: tuple[str, ...]


def check_checkpoint(logdir: Path, variables: Sequence[tf.Variable],
                     planned: int | None = None) -> Restorable | None:
    """The checkpoint in logdir that a resume restores: the newest intact one that logdir's
    `checkpoint` file lists; None if there is none to restore.

    A damaged newer one is passed over with one warning line. Raises ConfigError if none is
    intact, if the one found cannot be restored into `variables`, or if it is already past
    `planned` updates (global steps). Restoring it would fail mid-start with a long
    TensorFlow error; this names the variable.
    A `checkpoint` file that TensorFlow cannot use (unparsable, or naming files that are not
    there, as after the directory moved: a TF1 Saver writes absolute paths) is refused too:
    TensorFlow would ignore it and silently train from scratch.
    A variable cut into slices (one per ps: placement.py) is checked whole, under the
    name and shape the checkpoint holds it by, so a checkpoint of a cluster with another
    number of ps passes: it restores.
    """
    index = Path(logdir) / "checkpoint"
    if not index.exists():
        return None
    try:
        state = tf.train.get_checkpoint_state(str(logdir))
    except ValueError:  # empty, no model_checkpoint_path, or not UTF-8
        state = None
    if state is None:
        raise ConfigError(f"--logdir {logdir} has a checkpoint file that cannot be read as one "
                          f"({index}): fix or remove it, or give a new --logdir")
    chosen = _newest_intact(Path(logdir), state)
    path = chosen.path
    shapes = dict(tf.train.list_variables(path))
    wholes = placement.whole_variables(variables)
    for name, whole in wholes.items():  # a shape that differs says more than a missing name
        if name in shapes and list(shapes[name]) != whole.shape:
            raise ConfigError(f"--logdir {logdir} holds a checkpoint of a different model: "
                              f"{name} has shape {list(shapes[name])} there, {whole.shape} here")
    for name, whole in wholes.items():
        if name not in shapes:
            raise ConfigError(f"--logdir {logdir} holds a checkpoint of a different model: it "
                              f"has no variable {name} (shape {whole.shape} here)")
    step = int(tf.train.load_variable(path, GLOBAL_STEP)) if GLOBAL_STEP in shapes else None
    if planned is not None and step is not None and step > planned:
        # Resumed, it would train nothing and then fail the verdict (global_step != planned).
        raise ConfigError(f"--logdir {logdir} holds a checkpoint at global_step {step}, past "
                          f"the {planned} updates planned (--train-steps or --epochs): give a "
                          f"new --logdir, or plan at least {step}")
    return chosen


def _newest_intact(logdir: Path, state) -> Restorable:
    """The newest checkpoint `state` lists whose every tensor reads back intact."""
    listed = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path not in listed:
        listed.append(state.model_checkpoint_path)
    if not any(tf.io.gfile.glob(f"{p}.*") for p in listed):
        raise ConfigError(f"--logdir {logdir}: its checkpoint file ({logdir / 'checkpoint'}) "
                          f"names {state.model_checkpoint_path}, which does not exist (was the "
                          "directory moved?): fix or remove that file, or give a new --logdir")
    damaged = []
    for n in range(len(listed) - 1, -1, -1):
        reason = checkpoint_damage(listed[n])
        if reason is None:
            if damaged:
                log.warning("--logdir %s: the newest checkpoint, %s, is damaged (%s); restoring "
                            "%s, the newest intact one", logdir, Path(damaged[0][0]).name,
                            damaged[0][1], Path(listed[n]).name)
            return Restorable(listed[n], tuple(listed[:n + 1]))
        damaged.append((listed[n], reason))
    raise ConfigError(f"--logdir {logdir}: none of its {len(listed)} checkpoints is intact (" +
                      "; ".join(f"{Path(p).name}: {reason}" for p, reason in damaged) +
                      "): restore them, or give a new --logdir")


def checkpoint_damage(path: str) -> str | None:
    """Why the checkpoint `path` cannot be restored, or None if it is intact.

    Every tensor is read: that checks each one's checksum against the index, so a data file
    cut short or overwritten is found, not only a missing or truncated index (which costs a
    read of the checkpoint, as the restore does once more).
    """
    if not tf.io.gfile.glob(f"{path}.index"):
        return "its index file is missing"  # load_checkpoint's error would not say which
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a data file cut short
        return first_line(e)
    return None


def first_line(error: Exception) -> str:
    text = getattr(error, "message", None) or str(error)
    return (text.strip().splitlines() or [type(error).__name__])[0]


class SideSession:
    """A plain session for reads beside the training session, re-created after a lost ps.

    MonitoredSession re-creates its own session when a ps is lost; a plain one would keep
    failing against the restarted ps, so this one is re-created too: once per call, and only
    when every ps accepts connections again (creating a session waits without end for an
    absent ps). While the ps is still away, the error goes to the caller.
    """

    def __init__(self, target: str, graph: tf.Graph, config: tf1.ConfigProto,
                 ps_hosts: tuple[str, ...] = ()):
        self._args, self._ps_hosts = (target, graph, config), ps_hosts
        self._sess = tf1.Session(*self._args)

    def run(self, fetches, feed_dict=None, options=None):
        try:
            return self._run(fetches, feed_dict, options)
        except _LOST_PS as lost:
            if any(membership.probe(address) for address in self._ps_hosts):
                raise
            self.close()
            self._sess = tf1.Session(*self._args)
            try:
                return self._run(fetches, feed_dict, options)
            except _EMPTIED as e:
                # The ps came back empty (restarted) and the chief has not restored the model
                # into it yet: still the lost ps (exit 201, which the launcher counts in that
                # ps's fault), not a failure of this task's own (exit 1; .ci/run saw a worker
                # end so with NotFoundError, the ps killed at the end and restarted).
                raise lost from e

    def _run(self, fetches, feed_dict, options):
        """A run whose RunOptions timeout holds even where TensorFlow does not apply it.

        The first run of a fetch in a session registers its graph on the ps first, and that
        RPC takes no timeout: with the ps silent (partitioned, its packets dropped) it waits on
        TCP for many minutes (the chief's finish barrier did, issue 35). So a bounded run goes
        to a thread of its own; RUN_GRACE_SECS past its timeout it is left there and reported
        as the DeadlineExceededError TensorFlow gives when the timeout does hold.
        """
        if options is None or not options.timeout_in_ms:
            return self._sess.run(fetches, feed_dict, options=options)
        bound = options.timeout_in_ms / 1000 + RUN_GRACE_SECS
        try:
            return bounded_call(lambda: self._sess.run(fetches, feed_dict, options=options),
                                bound, "")
        except TaskTimeout as e:
            e.handled()  # the caller decides, as with TensorFlow's own DeadlineExceededError
            raise tf.errors.DeadlineExceededError(
                None, None, f"no answer within {bound:g} s (the graph's registration on a "
                            "ps, which no timeout bounds, did not return)") from None

    def close(self) -> None:
        close_bounded(self._sess.close, self._sess)
