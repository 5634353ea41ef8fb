"""Session creation for the chief and the other workers: prompt, bounded, and restart-aware.

The chief keeps a model that is already on the ps (it was restarted into a running cluster),
else restores the latest checkpoint of --logdir, else initialises. Every worker re-creates its
session when a ps is lost (MonitoredSession does so on UnavailableError and AbortedError), but
for at most --timeout seconds: past that it stops and says which ps it could not reach.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import tensorflow as tf

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import membership
from sync_mnist.core.bounded import bounded_call, close_bounded
# _SharedCheckpointSaverHook keeps its name: the bounded hook's timeout messages say it.
from sync_mnist.core.checkpoints import KEEP_CHECKPOINTS, Restorable, _SharedCheckpointSaverHook
from sync_mnist.core.config import TaskTimeout, first_line

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
EMPTIED = (tf.errors.NotFoundError, tf.errors.FailedPreconditionError)
# A side session's bounded run whose RunOptions timeout did not hold is given up this long
# after it (SideSession._run); TensorFlow's own DeadlineExceededError comes first when it does.
RUN_GRACE_SECS = 2.0


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


class _BoundedRecreation:
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



class _PromptWorkerSessionCreator(tf1.train.WorkerSessionCreator, _BoundedRecreation):
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
                 ps_hosts: Sequence[str], before_init: Callable[[], None] | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self._before_init = before_init
        self._model_missing, self._status = model_missing, status
        self._model_size = model_size
        self._checkpoint_dir, self._restore = checkpoint_dir, restore
        self._local_init = kwargs["local_init_op"]
        self._timeout, self._ps_hosts = timeout, tuple(ps_hosts)

    def prepare_session(self, master, **kwargs):
        if self._before_init is not None:
            # The graph is final (the scaffold finalised it): what needs no session is written
            # now, so that the chief is ready once the model is, as the other workers are.
            self._before_init()
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


class _ChiefSessionCreator(tf1.train.ChiefSessionCreator, _BoundedRecreation):
    def __init__(self, scaffold, master, config, *, checkpoint_dir, restore, model_missing,
                 model_size, status, prepare_timeout, ps_hosts, before_init=None):
        super().__init__(scaffold, master, config, checkpoint_dir=checkpoint_dir)
        self._before_init = before_init
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
                ps_hosts=self._ps_hosts_for_manager, before_init=self._before_init,
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
            lines = [line.strip() for line in text.split("Error: ", 1)[-1].splitlines()
                     if line.strip().strip("=")]  # not TensorFlow's ===== rules
            record.msg, record.args = "a ps was lost (%s); re-creating the session", (
                " ".join(lines[:2]),)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_recovery_log_filter = _OneLineRecoveryLog()


def _init_if_uninitialized(v: tf.Variable) -> tf.Operation:
    # The assign is made inside the branch: an op made outside would run either way.
    return tf1.cond(tf1.is_variable_initialized(v), tf.no_op,
                    lambda: tf.group(tf1.assign(v, v.initial_value)))


def _saver(kept: list | None) -> tf1.train.Saver:
    """The chief's Saver, of `kept` (None: every variable) and the graph's hash tables that ask
    to be saved (a growing table's index, whose rows `kept` holds): a Saver given a list saves
    only it, where its default would save them too."""
    saved = None if kept is None else kept + tf1.get_collection(
        tf1.GraphKeys.SAVEABLE_OBJECTS)
    return tf1.train.Saver(saved, sharded=True, allow_empty=True, max_to_keep=KEEP_CHECKPOINTS)


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
        TensorFlow's own (progress_log.EventsWriter: a full disk does not fail the run).
    """
    status = status if status is not None else SessionStatus()
    tf.get_logger().addFilter(_recovery_log_filter)  # idempotent: a logger holds a filter once
    hooks = list(hooks)
    bound = timeout if recovery_timeout is None else recovery_timeout
    if is_chief:
        everything = tf1.global_variables()
        kept = [v for v in everything if all(v is not t for t in transient)]
        scaffold = tf1.train.Scaffold(
            saver=_saver(kept if transient else None),
            ready_for_local_init_op=tf1.report_uninitialized_variables(kept),
            local_init_op=tf.group(tf1.train.Scaffold.default_local_init_op(),
                                   *[_init_if_uninitialized(v) for v in transient]))
        saver_hook = None
        if checkpoint_dir:
            saver_hook = _SharedCheckpointSaverHook(
                checkpoint_dir, timeout=bound, ps_hosts=ps_hosts, status=status, events=events,
                save_secs=save_secs, save_steps=None if save_secs else save_steps,
                scaffold=scaffold)
            hooks.append(saver_hook)
            status.final_save = _BoundedHook(saver_hook, bound, ps_hosts).end
        creator = _ChiefSessionCreator(
            scaffold, master, config, checkpoint_dir=checkpoint_dir, restore=restore,
            status=status, model_missing=tf1.report_uninitialized_variables(everything),
            model_size=len(everything), prepare_timeout=bound, ps_hosts=ps_hosts,
            before_init=saver_hook.write_graph if saver_hook else None)
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
            except EMPTIED as e:
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
