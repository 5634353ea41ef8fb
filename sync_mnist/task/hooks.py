"""A model's own SessionRunHooks (ModelSpec's training_hooks, training_chief_hooks and
evaluation_hooks), run where the Estimator ran them, each call bounded.

Training hooks join the worker's MonitoredSession (the chief's hooks the chief's only):
begin, after_create_session, before_run and after_run around every step, end at its close.
Evaluation hooks run around the chief's evaluation: begin when its graph is built, then
after_create_session, before_run and after_run around each batch, and end, at every
evaluation. Whatever a before_run asks for is run in that step or batch, as in an Estimator.

Every call of a hook's is bounded by --timeout: one that does not return is a TaskTimeout
naming the hook and the call (exit 200). One that raises is the model's error: a
ContractError naming the hook, the call and the exception, with the user's traceback below
(exit 2); a TensorFlow error (a lost ps under a hook's read) passes on as it came. A hook may
not stop (run_context.request_stop()): in synchronous training one worker cannot stop alone,
the cluster stops on --train-steps, --epochs or --target-accuracy; and an evaluation reads
its whole input (ContractError).
"""

from __future__ import annotations

import traceback
from typing import Sequence

import tensorflow as tf

from sync_mnist import api
from sync_mnist.core.bounded import bounded_call

tf1 = tf.compat.v1


class Bounded(tf1.train.SessionRunHook):
    """`hook`, the model's (`kind`: "training", "training chief" or "evaluation"), with each
    call bounded by `timeout` seconds and its errors the model's."""

    def __init__(self, hook: tf1.train.SessionRunHook, kind: str, timeout: float):
        self.hook, self._kind, self._timeout = hook, kind, timeout
        self._name = f"the model's {kind} hook {type(hook).__name__}"

    def _call(self, method: str, *args):
        what = f"{self._name}.{method}"

        def call():
            try:
                return getattr(self.hook, method)(*args)
            except tf.errors.OpError:
                raise
            except Exception as e:
                raise api.ContractError(f"{what} raised {type(e).__name__}: {e}",
                                        details=traceback.format_exc()) from None

        return bounded_call(call, self._timeout, f"{what} did not return in {self._timeout:g} s")

    def begin(self):
        self._call("begin")

    def after_create_session(self, session, coord):
        self._call("after_create_session", session, coord)

    def before_run(self, run_context):
        return self._call("before_run", run_context)

    def after_run(self, run_context, run_values):
        self._call("after_run", run_context, run_values)
        if run_context.stop_requested:
            raise api.ContractError(
                f"{self._name} asked to stop (run_context.request_stop()): "
                + ("an evaluation reads its whole input" if self._kind == "evaluation" else
                   "in synchronous training a worker cannot stop alone; the cluster stops "
                   "together on --train-steps, --epochs or --target-accuracy"))

    def end(self, session):
        self._call("end", session)


def bounded(hooks: Sequence, kind: str, timeout: float) -> list[Bounded]:
    """Each of `hooks` Bounded; api.ModelSpec has checked that each is a SessionRunHook."""
    return [Bounded(h, kind, timeout) for h in hooks]


class Evaluation:
    """The evaluation hooks around each batch of one evaluation, in a session of the
    evaluation's (SideSession: run(fetches, feed_dict, options))."""

    def __init__(self, hooks: Sequence[Bounded]):
        self._hooks = list(hooks)

    def begin(self) -> None:
        for h in self._hooks:
            h.begin()

    def after_create_session(self, session) -> None:
        for h in self._hooks:
            h.after_create_session(session, None)

    def run(self, session, fetches, feed_dict, options):
        """session.run(fetches, feed_dict), with what each hook's before_run asks for run in
        the same call, and its after_run given those values."""
        if not self._hooks:
            return session.run(fetches, feed_dict, options=options)
        context = tf1.train.SessionRunContext(
            tf1.train.SessionRunArgs(fetches, feed_dict), session)
        asked = [h.before_run(context) for h in self._hooks]
        feed = dict(feed_dict or {})
        for args in asked:
            if args is not None and args.feed_dict:
                feed.update(args.feed_dict)
        results = session.run([fetches, [a.fetches if a else [] for a in asked]], feed,
                              options=options)
        for h, values in zip(self._hooks, results[1]):
            h.after_run(context, tf1.train.SessionRunValues(values, options, None))
        return results[0]

    def end(self, session) -> None:
        for h in self._hooks:
            h.end(session)
