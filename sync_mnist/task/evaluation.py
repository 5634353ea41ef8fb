"""The chief's evaluation: the model function in EVAL mode, in a graph of its own.

Its variables are the training graph's: the same names on the same ps (placement.py places
by name), so its session reads the model as the ps holds it, in float32 whatever
--wire-dtype, without initialising anything there. Only what lives on the chief is initialised,
before each evaluation: the metrics' counters (local variables) and the model's lookup tables.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sync_mnist import api
from sync_mnist.core import placement
from sync_mnist.core.sessions import SideSession
from sync_mnist.core.shard import DataError
from sync_mnist.task import hooks

tf1 = tf.compat.v1

EVAL_BATCH = 1000  # examples per evaluation run on the chief


ACCURACY = "accuracy"  # the metric --eval-every and --target-accuracy read


def check_accuracy_metric(model: api.Model, params: dict, example: tuple) -> None:
    """Raises ContractError unless the model's EVAL spec has the metric "accuracy" (built in a
    scratch graph: every worker checks, so that none trains a run its chief cannot judge)."""
    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        features, labels = placement.placeholders(*example)
        spec = placement.call(model.model_fn, features, labels, api.ModeKeys.EVAL, params)
    if ACCURACY not in spec.eval_metric_ops:
        raise api.ContractError(
            f"--eval-every and --target-accuracy read the model's eval metric {ACCURACY!r}, "
            f"and its eval_metric_ops have {', '.join(map(repr, spec.eval_metric_ops)) or 'none'}")


class Evaluator:
    """Evaluates the model on (features, labels): its loss and its eval_metric_ops.

    Its graph is built from the evaluation data's first batch, as an Estimator's evaluation
    graph was from eval_input_fn's features: they may hold more than the training's (a figure
    only a metric reads, as the click model's planted probability)."""

    def __init__(self, model: api.Model, params: dict, *, num_ps: int, worker: str,
                 target: str, tf_config, ps_hosts: tuple[str, ...]):
        self._model, self._params, self._num_ps, self._worker = model, params, num_ps, worker
        self._session_args = (target, tf_config, ps_hosts)
        self.side: SideSession | None = None  # built with the graph, at the first batch
        self.examples = 0  # in the last evaluation

    def _build(self, features, labels) -> None:
        self.graph = tf.Graph()
        with self.graph.as_default(), tf1.device(self._worker):
            with tf1.device("/job:ps/task:0"):  # where the training graph has it
                tf1.train.get_or_create_global_step()
            self.features, self.labels = placement.placeholders(features, labels)
            spec = placement.build(self._model.model_fn, self.features, self.labels,
                                   api.ModeKeys.EVAL, self._params, num_ps=self._num_ps).spec
            self.loss = spec.loss
            self.values = {k: v for k, (v, _) in spec.eval_metric_ops.items()}
            self.updates = [u for _, u in spec.eval_metric_ops.values()]
            # The metrics' counters, zeroed for each evaluation, and the model's lookup tables
            # (a vocabulary column's), filled (again: the same keys, a no-op): both on the chief.
            self.reset = tf1.train.Scaffold.default_local_init_op()
            self.hooks = hooks.Evaluation(hooks.bounded(spec.evaluation_hooks, "evaluation",
                                                        self._hook_timeout))
            self.hooks.begin()
        target, tf_config, ps_hosts = self._session_args
        self.side = SideSession(target, self.graph, tf_config, ps_hosts)

    def __call__(self, features, labels, options) -> tuple[dict[str, float], float]:
        """({metric: value}, mean loss) over numpy arrays, EVAL_BATCH examples at a time."""
        def batches():
            for start in range(0, len(labels), EVAL_BATCH):
                rows = slice(start, start + EVAL_BATCH)
                yield (({k: v[rows] for k, v in features.items()}
                        if isinstance(features, dict) else features[rows]), labels[rows])

        return self.over(batches(), options)

    def over(self, batches, options) -> tuple[dict[str, float], float]:
        """({metric: value}, mean loss) over `batches` of (features, labels); `examples` is then
        how many examples they held."""
        total_loss, n = 0.0, 0
        # Sync: a model's hooks are bounded by --timeout, as every read of the ps is.
        self._hook_timeout = options.timeout_in_ms / 1000
        for batch, labels in batches:
            if self.side is None:
                self._build(batch, labels)
            if n == 0:
                self.side.run(self.reset, options=options)
                self.hooks.after_create_session(self.side)
            feed = {**placement.feed(self.features, batch), self.labels: labels}
            loss, _ = self.hooks.run(self.side, [self.loss, self.updates], feed, options)
            total_loss += float(loss) * len(labels)
            n += len(labels)
        if n == 0:
            raise DataError("the evaluation data holds no example")
        self.examples = n
        values = self.side.run(self.values, options=options)
        self.hooks.end(self.side)
        return {k: float(np.asarray(v)) for k, v in values.items()}, total_loss / n

    def close(self) -> None:
        if self.side is not None:
            self.side.close()
