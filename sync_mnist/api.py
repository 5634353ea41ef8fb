"""The public API: your model, trained synchronously by this package.

A model is one `Model`: a model function in the shape of an Estimator's `model_fn`, and input
functions that return numpy arrays. The package owns everything distribution adds: where the
variables live (split evenly over the ps tasks), the optimizer's `SyncReplicasOptimizer`, the
counters that prove each update averaged one gradient from each worker, the sessions, the
bounded waits, checkpoints, evaluation and the SavedModel. A model function knows nothing of
ps tasks or workers.

    import tensorflow as tf
    import sync_mnist.api as sm
    tf1 = tf.compat.v1

    def model_fn(features, labels, mode, params):
        logits = ...  # built with tf1.get_variable (or tf1.layers with tf-keras)
        predictions = {"classes": tf.argmax(logits, 1)}
        if mode == sm.ModeKeys.PREDICT:
            return sm.ModelSpec(mode, predictions=predictions)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        if mode == sm.ModeKeys.TRAIN:
            return sm.ModelSpec(mode, loss=loss, optimizer=tf1.train.AdamOptimizer(1e-3))
        return sm.ModelSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": tf1.metrics.accuracy(labels, predictions["classes"])})

    MODEL = sm.Model(model_fn, train_input_fn=..., eval_input_fn=..., params={...})

and `sync-mnist-cluster --model path/to/file.py:MODEL`.

Bad input of the user's is one of two errors, each exit 2 with its one line (`error: ...`),
wherever the model's code raises it (its input functions, its check): `ConfigError`, a value
given that cannot work (a param, say); `DataError`, data missing, malformed or inconsistent.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from sync_mnist.core import growing
from sync_mnist.core.config import ConfigError  # noqa: F401 (the model's to raise)
from sync_mnist.core.shard import DataError  # noqa: F401 (the model's to raise)

tf1 = tf.compat.v1


class ModeKeys:
    """The modes a model function is called in (the values tf.estimator.ModeKeys had)."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


class ContractError(ConfigError):
    """A model breaks the contract of this module: bad input (exit 2). The message is one line
    naming what and where; `details` (the user's own traceback, where their code raised) is
    shown below it."""

    def __init__(self, message: str, details: str | None = None):
        super().__init__(message)
        self.details = details


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a model function returns: `tf.estimator.EstimatorSpec`, with an optimizer in place
    of a train op. Checked on construction, as EstimatorSpec was.

    Attributes:
      mode: the mode the model function was called in.
      predictions: PREDICT: a dict of tensors, the SavedModel's outputs (export_outputs).
      loss: TRAIN: the float scalar to minimise; each update averages one from each worker.
        The mean over the batch, usually (a canned model's is v1's sum over it, unless its
        loss_reduction says otherwise). EVAL: a float scalar, the mean over the batch (the chief's
        test_loss averages it over the evaluation set).
      optimizer: TRAIN: the base optimizer (AdamOptimizer, say), or None for the one the
        command line names (--optimizer, --learning-rate, --lr-decay). The package wraps it
        in SyncReplicasOptimizer and builds the train op; a model function must not.
        Or one optimizer per variable scope, as wide & deep trains its linear part with FTRL
        and its deep part with Adagrad: {"linear": FtrlOptimizer(...), "dnn":
        AdagradOptimizer(...)}. A variable is under scope "dnn" if its name is "dnn" or
        starts with "dnn/" ("dnn/" is the same scope; "dnn_1/w" is not under it), and no
        scope may be inside another. Every trainable variable must be under exactly one
        scope (freeze one by making it with trainable=False), and every scope must hold one,
        else ContractError naming it. Each update then applies every optimizer once, to the
        average of its variables' gradients (one from each worker), in one op: one update
        for the counters, one step of global_step. An optimizer's compute_gradients, if it
        changes it, runs on each worker for its own variables.
      train_metrics: TRAIN: float scalars of the batch, logged beside the loss every
        --log-every steps and written as summaries.
      eval_metric_ops: EVAL: {name: (value, update_op)}, as tf1.metrics.* return them; the
        update ops run once per evaluation batch, the values are read at the end.
      export_outputs: PREDICT: the SavedModel's signatures, as EstimatorSpec's were:
        {signature name: ClassificationOutput, RegressionOutput or PredictOutput}. None: one,
        "serving_default", a PredictOutput of `predictions`. One output alone is also the
        default; of several, one must be named "serving_default" (DEFAULT_SERVING_KEY).
      training_hooks: TRAIN: tf.compat.v1.train.SessionRunHooks run on every worker's
        training session, around each step, as the Estimator ran them;
        training_chief_hooks the same on the chief's only; evaluation_hooks: EVAL: around
        each batch of the chief's evaluations. Each call is bounded by --timeout; a hook may
        not request a stop (docs/model-reference.md, "Hooks").
      train_op: refused: see `optimizer`. It is a field so that the refusal can say so.
    """

    mode: str
    predictions: Mapping[str, tf.Tensor] | None = None
    loss: tf.Tensor | None = None
    optimizer: tf1.train.Optimizer | Mapping[str, tf1.train.Optimizer] | None = None
    train_metrics: Mapping[str, tf.Tensor] = dataclasses.field(default_factory=dict)
    eval_metric_ops: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    training_hooks: Sequence[tf1.train.SessionRunHook] = ()
    training_chief_hooks: Sequence[tf1.train.SessionRunHook] = ()
    evaluation_hooks: Sequence[tf1.train.SessionRunHook] = ()
    export_outputs: Mapping[str, ExportOutput] | None = None
    train_op: Any = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ContractError(f"ModelSpec: mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.train_op is not None:
            raise ContractError(
                "ModelSpec: train_op is refused: return the base optimizer as optimizer=... "
                "(or none, for --optimizer); sync_mnist wraps it in SyncReplicasOptimizer and "
                "builds the train op itself")
        if isinstance(self.optimizer, Mapping):
            _check_scopes(self.optimizer)
        elif self.optimizer is not None:
            _check_optimizer("optimizer", self.optimizer)
        if self.mode == ModeKeys.PREDICT:
            if not isinstance(self.predictions, Mapping) or not self.predictions:
                raise ContractError("ModelSpec(PREDICT): predictions must be a non-empty dict "
                                    f"of tensors, got {self.predictions!r}")
            # A frozen dataclass: the outputs as the SavedModel will have them, set once here.
            object.__setattr__(self, "export_outputs",
                               _export_outputs(self.export_outputs, self.predictions))
        else:
            _check_scalar("loss", self.loss)
        for name, metric in dict(self.train_metrics).items():
            # Each is logged as `name=value` beside the progress line's own fields, and written
            # to TensorBoard beside the loss.
            if not (isinstance(name, str) and _METRIC_NAME.fullmatch(name)) or \
                    name in _PROGRESS_FIELDS:
                raise ContractError(f"ModelSpec: train_metrics[{name!r}]: a name must be a "
                                    "word of letters, numbers, _ and /, and not one of the "
                                    f"progress line's own ({', '.join(_PROGRESS_FIELDS)})")
            _check_scalar(f"train_metrics[{name!r}]", metric)
        for field in ("training_hooks", "training_chief_hooks", "evaluation_hooks"):
            hooks = getattr(self, field)
            if isinstance(hooks, tf1.train.SessionRunHook) or not isinstance(
                    hooks, (list, tuple)):
                raise ContractError(f"ModelSpec: {field} must be a list of SessionRunHooks, "
                                    f"got {type(hooks).__name__}")
            for k, hook in enumerate(hooks):
                if not isinstance(hook, tf1.train.SessionRunHook):
                    raise ContractError(f"ModelSpec: {field}[{k}] must be a "
                                        "tf.compat.v1.train.SessionRunHook, got "
                                        f"{type(hook).__name__}")
        for name, pair in dict(self.eval_metric_ops).items():
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ContractError(f"ModelSpec: eval_metric_ops[{name!r}] must be a pair "
                                    "(value, update_op), as tf1.metrics.* return")


_METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_/]*")
_PROGRESS_FIELDS = ("step", "global_step", "loss", "examples_per_sec", "contributions")


def _check_optimizer(what: str, optimizer) -> None:
    if isinstance(optimizer, tf1.train.SyncReplicasOptimizer):
        raise ContractError(
            f"ModelSpec: the {what} is a SyncReplicasOptimizer: return the optimizer it "
            "wraps; sync_mnist wraps it (with its own tokens and counters)")
    if not isinstance(optimizer, tf1.train.Optimizer):
        raise ContractError(f"ModelSpec: {what} must be a tf.compat.v1.train.Optimizer, "
                            f"got {type(optimizer).__name__}")


def _check_scopes(optimizers: Mapping) -> None:
    """{scope: optimizer}: each a non-empty scope name, none inside another."""
    if not optimizers:
        raise ContractError("ModelSpec: optimizer is an empty dict: give one optimizer, or "
                            "one per variable scope, or None for --optimizer")
    scopes: dict[str, str] = {}
    for key, optimizer in optimizers.items():
        if not isinstance(key, str) or not key.rstrip("/"):
            raise ContractError(f"ModelSpec: optimizer[{key!r}]: a key must be a variable "
                                "scope's name, such as 'linear' or 'dnn/'")
        _check_optimizer(f"optimizer[{key!r}]", optimizer)
        scope = key.rstrip("/")
        for other, other_key in scopes.items():
            if scope == other or scope.startswith(other + "/") or \
                    other.startswith(scope + "/"):
                raise ContractError(
                    f"ModelSpec: optimizer scopes {other_key!r} and {key!r} overlap: a "
                    "variable under both would have two optimizers; give each variable one")
        scopes[scope] = key


def _check_scalar(what: str, value) -> None:
    if not isinstance(value, tf.Tensor):
        raise ContractError(f"ModelSpec: {what} must be a tensor, got {type(value).__name__}")
    if not value.dtype.is_floating or value.shape.rank != 0:
        raise ContractError(f"ModelSpec: {what} must be a float scalar, got {value.dtype.name} "
                            f"of shape {value.shape}")


# input_fn(params) -> (features, labels): numpy arrays, features one array or a dict of them,
# all of one length along the first axis.
InputFn = Callable[[Mapping[str, Any]], tuple]
# serving_input_fn(params) -> (inputs, features): inputs a dict of placeholders (the
# SavedModel's signature), features what the model function takes, made from them.
ServingInputFn = Callable[[Mapping[str, Any]], tuple]


@dataclasses.dataclass(frozen=True)
class Model:
    """A model and its data, as `--model SPEC` names it.

    Attributes:
      model_fn: model_fn(features, labels, mode, params) -> ModelSpec. Called once per graph
        and mode: every worker's training graph (TRAIN), the chief's evaluation graph (EVAL),
        the SavedModel's graph (PREDICT, labels None).
      train_input_fn: train_input_fn(params) -> (features, labels), the whole training set as
        numpy arrays: every worker calls it and keeps a disjoint shard of its own, of equal
        length on every worker, in an order drawn from --seed. Or a tf.data.Dataset of single
        examples (features, labels), streamed: the package cuts it per worker, by file where
        it can, and batches it; train_input_fn(params, input_context) cuts its own share
        (docs/model-reference.md, "Your data").
      eval_input_fn: eval_input_fn(params) -> (features, labels), the evaluation set, as
        arrays or a Dataset. Only the chief calls it, after training (or at the first
        --eval-every evaluation).
      serving_input_fn: serving_input_fn(params) -> (inputs, features), for the SavedModel;
        parsing_serving_input_fn(feature_spec) for serialized tf.train.Examples; None: the
        signature takes the features as the training data has them.
      params: the model's options and their defaults: what its functions are given, each
        settable by `--param KEY=VALUE` (read as its default's type), plus "seed" (--seed).
      check: check(params), what can be checked of the model's data before any task starts:
        the launcher calls it once with the params the tasks will give the functions, and
        DataError or ConfigError raised there is exit 2 with its line, no task started (the
        built-in mlp and cnn check their files: a digest, a header). Cheap, as the launcher
        waits for it; the input functions still check what they read. None: nothing to
        check.
    """

    model_fn: Callable
    train_input_fn: InputFn
    eval_input_fn: InputFn
    serving_input_fn: ServingInputFn | None = None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None


# ------------------------------------------------------ a table that grows with its ids

def growing_embedding(ids: tf.Tensor, *, name: str, dim: int, cap: int, min_count: int = 1,
                      ttl: int | None = None, initializer=None) -> tf.Tensor:
    """The rows of `ids` in a table where each id (int64, any value) gets a row of its own.

    An id gets its row once it was seen `min_count` times in the batches of applied updates;
    until then it reads zeros and gets no gradient. A row goes back to free when its id went
    unseen for `ttl` updates, or, when more ids are ready than rows are free, least recently
    seen first (an id ready but without room waits, the most seen first). An evicted row's
    value and optimizer slots start again from their initial values. All of it happens in
    the update, once for all workers, so every worker's next step sees the same table. The
    table is cut over the ps as any table, each id on ps id mod K (docs/sparse.md).

    Call it in a model function, with the optimizer of your ModelSpec (the package's sync
    mode only); in the SavedModel an id without a row reads zeros too.

    Args:
      ids: integer ids, any shape.
      name: the table's variable scope (its variables: NAME/rows, NAME/ids, NAME/seen).
      dim: floats a row.
      cap: rows in all, over every ps.
      min_count: sightings before an id gets a row; 1: at its first update.
      ttl: updates an id may go unseen before its row (or its count of sightings) is
        dropped; None: never for that reason.
      initializer: the rows' initializer (a tf.compat.v1 initializer); None: zeros.

    Returns:
      float32 of shape ids.shape + [dim].
    """
    settings = _growing_settings("growing_embedding", name, dim, cap, min_count, ttl)
    if not isinstance(ids, tf.Tensor) or not ids.dtype.is_integer:
        got = ids.dtype.name if isinstance(ids, tf.Tensor) else type(ids).__name__
        raise ContractError(f"growing_embedding {name!r}: ids must be an integer tensor, got "
                            f"{got}")
    return growing.lookup(ids, settings, initializer or tf1.zeros_initializer())


def growing_embedding_column(key: str, *, dimension: int, cap: int, min_count: int = 1,
                             ttl: int | None = None, combiner: str = "mean",
                             initializer=None):
    """growing_embedding as a feature column, for tf.compat.v1.feature_column.input_layer (and
    so the canned DNN models): the rows of feature `key`'s int64 ids, combined over each
    example's ids ("mean", "sum" or "sqrtn", as embedding_column's combiner). The feature is a
    SparseTensor (tf.io.VarLenFeature: an example may have no id, and reads zeros) or a dense
    tensor [batch] or [batch, n], every value of it an id. The table's name is `key`; its
    variables are made under input_layer's scope for the column. No linear_model form.
    """
    if not isinstance(key, str) or not key:
        raise ContractError(f"growing_embedding_column: key must be a feature's name, got "
                            f"{key!r}")
    if combiner not in growing.COMBINERS:
        raise ContractError(f"growing_embedding_column {key!r}: combiner must be one of "
                            f"{', '.join(growing.COMBINERS)}, got {combiner!r}")
    settings = _growing_settings("growing_embedding_column", key, dimension, cap, min_count,
                                 ttl)
    return growing.Column(key, settings, combiner, initializer or tf1.zeros_initializer())


def _growing_settings(what: str, name, dim, cap, min_count, ttl) -> growing.Settings:
    """The table's settings, each checked: ContractError naming the bad one."""
    if not isinstance(name, str) or not name:
        raise ContractError(f"{what}: name must be a non-empty string, got {name!r}")
    for field, value in (("dim", dim), ("cap", cap), ("min_count", min_count), ("ttl", ttl)):
        if field == "ttl" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            shown = "dimension" if field == "dim" and what.endswith("column") else field
            raise ContractError(f"{what} {name!r}: {shown} must be an integer of at least 1, "
                                f"got {value!r}")
    return growing.Settings(name, dim, cap, min_count, ttl)


# ------------------------------------------------------ serving: what the SavedModel answers

DEFAULT_SERVING_KEY = "serving_default"  # the signature a client gets when it names none
EXAMPLES = "examples"  # parsing_serving_input_fn's input: serialized tf.train.Examples


class ExportOutput:
    """One signature of the SavedModel (tf.estimator.export.ExportOutput)."""


@dataclasses.dataclass(frozen=True)
class ClassificationOutput(ExportOutput):
    """A `classify` signature, TensorFlow Serving's Classify API: serialized tf.train.Examples
    in (input "inputs"), "scores" (float32 [batch, classes]) and "classes" (string [batch,
    classes], the class of each score) out; either may be None, not both. Exported only when
    the serving input is one string tensor (parsing_serving_input_fn's)."""

    scores: tf.Tensor | None = None
    classes: tf.Tensor | None = None

    def __post_init__(self) -> None:
        if self.scores is None and self.classes is None:
            raise ContractError("ClassificationOutput: give scores, classes or both")
        if self.scores is not None:
            _check_tensor("ClassificationOutput: scores", self.scores, tf.float32)
        if self.classes is not None:
            _check_tensor("ClassificationOutput: classes", self.classes, tf.string)


@dataclasses.dataclass(frozen=True)
class RegressionOutput(ExportOutput):
    """A `regress` signature, TensorFlow Serving's Regress API: serialized tf.train.Examples in
    (input "inputs"), "outputs" (float32, one value per example) out. Exported only when the
    serving input is one string tensor."""

    value: tf.Tensor

    def __post_init__(self) -> None:
        _check_tensor("RegressionOutput: value", self.value, tf.float32)


@dataclasses.dataclass(frozen=True)
class PredictOutput(ExportOutput):
    """A `predict` signature: the serving input's tensors in, these tensors out."""

    outputs: Mapping[str, tf.Tensor]

    def __post_init__(self) -> None:
        if not isinstance(self.outputs, Mapping) or not self.outputs:
            raise ContractError("PredictOutput: outputs must be a non-empty dict of tensors, "
                                f"got {self.outputs!r}")
        for name, tensor in self.outputs.items():
            if not isinstance(name, str) or not tf.is_tensor(tensor):
                raise ContractError(f"PredictOutput: outputs[{name!r}] must be a tensor under "
                                    f"a string key, got {type(tensor).__name__}")


def _check_tensor(what: str, value, dtype: tf.DType) -> None:
    if not isinstance(value, tf.Tensor) or value.dtype != dtype:
        got = value.dtype.name if isinstance(value, tf.Tensor) else type(value).__name__
        raise ContractError(f"{what} must be a {dtype.name} tensor, got {got}")


def _export_outputs(export_outputs, predictions) -> dict[str, ExportOutput]:
    """EstimatorSpec's rules: none given, a PredictOutput of the predictions; one given, it is
    also the default; several, one of them must be the default."""
    if export_outputs is None:
        return {DEFAULT_SERVING_KEY: PredictOutput(dict(predictions))}
    if not isinstance(export_outputs, Mapping) or not export_outputs:
        raise ContractError("ModelSpec: export_outputs must be a non-empty dict {signature "
                            f"name: ExportOutput}}, got {export_outputs!r}")
    for name, output in export_outputs.items():
        if not isinstance(name, str) or not isinstance(output, ExportOutput):
            raise ContractError(f"ModelSpec: export_outputs[{name!r}] must be a "
                                "ClassificationOutput, RegressionOutput or PredictOutput under "
                                f"a string key, got {type(output).__name__}")
    outputs = dict(export_outputs)
    if DEFAULT_SERVING_KEY not in outputs:
        if len(outputs) > 1:
            raise ContractError(f"ModelSpec: export_outputs has {len(outputs)} signatures "
                                f"({', '.join(outputs)}) and none is the default: name one "
                                f"{DEFAULT_SERVING_KEY!r}")
        outputs[DEFAULT_SERVING_KEY] = next(iter(outputs.values()))
    return outputs


def parsing_serving_input_fn(feature_spec: Mapping[str, Any]) -> ServingInputFn:
    """A serving_input_fn whose SavedModel takes serialized tf.train.Examples, as
    tf.estimator.export.build_parsing_serving_input_receiver_fn(feature_spec) did: one string
    tensor [batch] (input "examples"), parsed with tf.io.parse_example into the features.

    Args:
      feature_spec: {feature key: tf.io.FixedLenFeature, VarLenFeature, ...}, for feature
        columns tf.compat.v1.feature_column.make_parse_example_spec(columns). The labels and
        the weights are no serving input: leave them out.
    """
    if not isinstance(feature_spec, Mapping) or not feature_spec:
        raise ContractError("parsing_serving_input_fn: feature_spec must be a non-empty dict "
                            f"{{feature key: tf.io.FixedLenFeature, ...}}, got {feature_spec!r}")
    feature_spec = dict(feature_spec)

    def serving_input_fn(params):
        # The Estimator's name for it, which some clients' code looks for.
        serialized = tf1.placeholder(tf.string, [None], name="input_example_tensor")
        return {EXAMPLES: serialized}, tf.io.parse_example(serialized, feature_spec)

    return serving_input_fn
