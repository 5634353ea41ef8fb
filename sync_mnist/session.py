"""Session creation for the chief and the other workers, with no 30-second wait."""

from __future__ import annotations

import tensorflow as tf

tf1 = tf.compat.v1

# Sync: how often a non-chief worker checks whether the chief has initialised the variables.
# SessionManager's default is 30 s, which is why the question's workers sat idle for half a
# minute after the chief was ready; a quarter second costs one cheap RPC per poll.
READY_POLL_SECS = 0.25

# Threads (the chief's queue runner) get this long to stop when a session closes. The queue
# runner is blocked on the accumulators when training ends, waiting for gradients that will
# never come; only closing the session cancels that wait, so waiting longer (MonitoredSession's
# default is 120 s) only delays the exit.
STOP_GRACE_SECS = 0.25


class _PromptWorkerSessionCreator(tf1.train.WorkerSessionCreator):
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


def session_config(device_filters: list[str]) -> tf1.ConfigProto:
    return tf1.ConfigProto(device_filters=device_filters, allow_soft_placement=False,
                           log_device_placement=False)


def monitored_session(master: str, *, is_chief: bool, hooks: list, config: tf1.ConfigProto,
                      timeout: float, checkpoint_dir: str | None = None,
                      save_steps: int | None = None) -> tf1.train.MonitoredSession:
    """A MonitoredSession for one worker.

    The chief initialises (or restores from checkpoint_dir) and saves checkpoints every
    save_steps global steps. The others wait at most `timeout` seconds for the chief.
    """
    scaffold = tf1.train.Scaffold()
    hooks = list(hooks)
    if is_chief:
        creator = tf1.train.ChiefSessionCreator(scaffold, master, config,
                                                checkpoint_dir=checkpoint_dir)
        if checkpoint_dir:
            hooks.append(tf1.train.CheckpointSaverHook(checkpoint_dir, save_steps=save_steps,
                                                       scaffold=scaffold))
    else:
        creator = _PromptWorkerSessionCreator(scaffold, master, config, max_wait_secs=timeout)
    return tf1.train.MonitoredSession(creator, hooks, stop_grace_period_secs=STOP_GRACE_SECS)
