"""Where a model's variables live, and how a step reads them: the part of a model that
distribution owns, so that a model function knows nothing of ps tasks.

`build` calls a model function twice. First in a scratch graph, to learn its variables (their
names, shapes and initialisers: `Recorded`, also the model's fingerprint that every task
compares). Then in the task's graph, under a custom getter that:

  - makes each trainable variable of at least K rows (K ps tasks) a partitioned variable of K
    slices along its first axis, slice k on ps k, so the bytes are split evenly; any other
    variable lives whole on one ps, chosen from its name (the same in every task's graph);
  - creates every trainable variable first and reads them in one tensor per ps (`pulled`),
    in --wire-dtype, so a step's pull is one transfer per ps, not one per variable;
  - hands the model function that read (float32) where it asks for the variable, so its ops
    run on the worker. Non-trainable variables (batch norm's moving statistics) are handed
    over as variables: the model writes them.

Sparse variables are the exception: a trainable variable that the model function reads only
through gathers (`tf.nn.embedding_lookup`, `tf.gather`), as the scratch graph shows, is an
embedding table. It is cut the same way, but never pulled: the model function gets the
variable itself (a PartitionedVariable with K ps), so `tf.nn.embedding_lookup` gathers on
each ps the rows that ps holds, and only those rows cross to the worker; its gradient is
IndexedSlices of those rows (sync.to_ps keeps it sparse). A read of a sparse variable whole
in the task's graph (tf.gather on a PartitionedVariable concatenates it first) is refused.
"""

from __future__ import annotations

import re
import sys
import zlib
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from sync_mnist import api
from sync_mnist.core import growing

tf1 = tf.compat.v1

_VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")
_PART = re.compile(r"/part_(\d+)$")
# The keyword arguments of tf1.get_variable that a recorded variable is made again with.
_GET_VARIABLE_ARGS = ("shape", "dtype", "initializer", "regularizer", "trainable", "collections",
                      "caching_device", "validate_shape", "use_resource", "constraint",
                      "synchronization", "aggregation")


def _linear_model_takes_values() -> None:
    """Lets tf1.feature_column.linear_model take its bias as this package hands it.

    linear_model lists its bias variable's parts (`_get_expanded_variable_list`: a variable, or
    else the slices of a PartitionedVariable, which it iterates). Here the model function is
    handed a trainable variable's value, a Tensor, which graph mode refuses to iterate, so
    linear_model raised TypeError ("Iterating over a symbolic `tf.Tensor` is not allowed").
    A value is one part, as a variable is. TensorFlow has no public switch for this. Called
    before each call of a model function; once done, it does nothing.
    """
    from tensorflow.python.feature_column import feature_column as fc_v1

    listed = fc_v1._get_expanded_variable_list
    if getattr(listed, "takes_values", False):
        return

    def parts(variable):
        return [variable] if isinstance(variable, tf.Tensor) else listed(variable)

    parts.takes_values = True
    fc_v1._get_expanded_variable_list = parts


class Recorded(NamedTuple):
    """A variable the model function makes with get_variable, as the scratch graph saw it."""

    name: str
    shape: list[int]
    dtype: str
    trainable: bool
    kwargs: dict  # what the model passed to get_variable
    sparse: bool = False  # trainable, and read only through gathers: an embedding table
    made_alone: bool = False  # made as tf.Variable (a Keras 3 layer's), not by get_variable


class Built(NamedTuple):
    spec: api.ModelSpec
    state: dict[str, tf.Variable]  # its non-trainable ones by name (moving statistics, say)
    ops: set[str]  # names of the ops the model function made (audit.py)
    update_ops: list  # what it added to UPDATE_OPS
    # The names of the variables it made as tf.Variable (a Keras layer's), not by get_variable.
    made_alone: frozenset[str] = frozenset()


def record(model_fn: Callable, features, labels, mode: str, params: Mapping[str, Any]
           ) -> list[Recorded]:
    """Calls model_fn in a scratch graph, on placeholders like `features` and `labels`, and
    returns the variables it makes, in the order it makes them."""
    recorded: dict[str, Recorded] = {}
    made: dict[str, tf.Variable] = {}
    getting = []  # a get_variable under way: its variable is the getter's to record

    def recording_getter(getter, name, *args, **kwargs):
        getting.append(name)
        try:
            v = getter(name, *args, **kwargs)
        finally:
            getting.pop()
        if name not in recorded:
            recorded[name] = Recorded(name, v.shape.as_list(), v.dtype.base_dtype.name,
                                      bool(kwargs.get("trainable", True)), dict(kwargs))
            made[name] = v
        return v

    def recording_creator(next_creator, **kwargs):
        v = next_creator(**kwargs)
        if not getting:
            _refuse_partitioner(v)
        if not getting and v.op.name not in recorded:
            recorded[v.op.name] = Recorded(v.op.name, v.shape.as_list(),
                                           v.dtype.base_dtype.name, bool(v.trainable), {},
                                           made_alone=True)
        return v

    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        like_features = _placeholders_like(features)
        like_labels = None if labels is None else _placeholders_like(labels)
        with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=recording_getter), \
                tf1.variable_creator_scope(recording_creator):
            call(model_fn, like_features, like_labels, mode, params)
        return [r._replace(sparse=r.trainable and _read_by_gathers_only(made[r.name]))
                if not r.made_alone else r for r in recorded.values()]


_GATHERS = ("ResourceGather", "GatherV2", "Gather")


def _read_by_gathers_only(v) -> bool:
    """Whether the model function reads `v` (a plain variable, in the scratch graph) through
    gathers only, at least once. Its own initialiser and read ops (`v/...`) do not count."""
    handle = v.op.outputs[0]
    reads = [c for c in handle.consumers() if not c.name.startswith(v.op.name + "/")]
    for c in list(reads):
        if c.type == "Identity":  # a reference variable's read (use_resource=False)
            reads.remove(c)
            reads += c.outputs[0].consumers()
    return bool(reads) and all(c.type in _GATHERS for c in reads)


def _refuse_partitioner(v) -> None:
    """Raises ContractError if `v`, trainable and made as tf.Variable (by a Keras layer, say),
    was made under a variable_scope with a partitioner: tf.Variable ignores it (Keras 3 and
    tf_keras alike), so the variable would stay whole on one ps where the model asked for it
    cut. (A metric's variables, local and small, are left alone.)"""
    if v.trainable and tf1.get_variable_scope().partitioner is not None:
        raise api.ContractError(
            f"the model function makes {v.op.name} as tf.Variable (a Keras layer's, say) under "
            f"the variable_scope {tf1.get_variable_scope().name!r}, whose partitioner it ignores:"
            " it would stay whole on one ps. For a table cut over every ps, make it with "
            "tf.compat.v1.get_variable (sync_mnist cuts it over the ps) and look its rows up "
            "with tf.nn.embedding_lookup, as the ctr model does")


def sparse_names(recorded: Sequence[Recorded]) -> list[str]:
    """The variables that stay on the ps and are read row by row: the embedding tables."""
    return [r.name for r in recorded if r.sparse]


def fingerprint(recorded: Sequence[Recorded]) -> list[str]:
    """The model's variables as every task compares them: 'name shape dtype', sorted."""
    return sorted(f"{r.name} {r.shape} {r.dtype}" for r in recorded)


def _keras_names_afresh() -> None:
    """Keras 3 names its layers (and so their variables: `dense_1/kernel`) by counters it keeps
    for the whole process, not per graph: the evaluation's and the SavedModel's graphs would
    then name a model's variables otherwise than its training graph did (`dense_3/kernel`), and
    find none of them on the ps. Each call of the model function starts the counters afresh, as
    a new process would. (keras.backend.clear_session does too, but also resets TensorFlow's
    default graph, which a graph being built cannot survive.)"""
    if "keras" in sys.modules:
        from keras.src.utils import naming  # pylint: disable=import-outside-toplevel

        naming.reset_uids()


def call(model_fn: Callable, features, labels, mode: str, params) -> api.ModelSpec:
    """model_fn(features, labels, mode, params), checked to return a ModelSpec of `mode`."""
    _linear_model_takes_values()
    _keras_names_afresh()
    try:
        spec = model_fn(features, labels, mode, dict(params))
    except api.ContractError:
        raise
    except Exception as e:
        from sync_mnist.models.registry import user_traceback
        hint = (": a trainable variable is handed to the model function as its value, read "
                "from the ps; only the optimizer writes it" if isinstance(e, AttributeError)
                and "has no attribute 'assign" in str(e) else "")
        raise api.ContractError(f"the model function raised {type(e).__name__} in mode "
                                f"{mode!r}: {_one_line(e)}{hint}", user_traceback(e)) from None
    if not isinstance(spec, api.ModelSpec):
        raise api.ContractError(f"the model function returned {type(spec).__name__} in mode "
                                f"{mode!r}, not a sync_mnist.api.ModelSpec")
    if spec.mode != mode:
        raise api.ContractError(f"the model function was called in mode {mode!r} and returned "
                                f"a ModelSpec of mode {spec.mode!r}")
    return spec


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def build(model_fn: Callable, features, labels, mode: str, params: Mapping[str, Any], *,
          num_ps: int, wire_dtype: str = "float32", ps_job: str | None = "ps",
          recorded: Sequence[Recorded] | None = None) -> Built:
    """Calls model_fn in the current graph with the variables placed and read as above.

    Args:
      model_fn, features, labels, mode, params: the model function and what it is given.
      num_ps: ps tasks to split the variables over.
      wire_dtype: what a pull crosses in: "float32", or "bfloat16" (cast where the slices
        live, float32 again here; the variables and what the optimizer applies stay float32).
      ps_job: the job the variables live in; None: no device at all (the SavedModel's graph).
      recorded: from `record`; made here if None.
    """
    if recorded is None:
        recorded = record(model_fn, features, labels, mode, params)
    graph = tf1.get_default_graph()
    first = len(graph.get_operations())
    updates = len(graph.get_collection(tf1.GraphKeys.UPDATE_OPS))
    getter = _Getter(num_ps, tf.as_dtype(wire_dtype), ps_job)
    getter.create_first([r for r in recorded if r.trainable and not r.made_alone])
    with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=getter), \
            tf1.variable_creator_scope(getter.create_alone):
        spec = call(model_fn, features, labels, mode, params)
    ops = {op.name for op in graph.get_operations()[first:]}
    _check_sparse_reads(getter.sparse, graph, ops)
    return Built(spec, getter.state, ops,
                 graph.get_collection(tf1.GraphKeys.UPDATE_OPS)[updates:],
                 frozenset(getter.made_alone))


def _check_sparse_reads(sparse: dict[str, list], graph: tf.Graph, model_ops: set[str]) -> None:
    """Raises ContractError if the model function read a sparse variable other than by
    gathers of its slices: tf.gather on a PartitionedVariable, say, which concatenates the
    whole table on the worker (every row crossing in every step)."""
    for name, slices in sparse.items():
        for v in slices:
            for c in v.op.outputs[0].consumers():
                if (c.name in model_ops and c.type not in _GATHERS
                        and not c.name.startswith(v.op.name + "/")):  # its own init and read
                    raise api.ContractError(
                        f"the model function reads the embedding table {name} whole ({c.type} "
                        f"{c.name}), which would move all of it to the worker in every step: "
                        "look its rows up with tf.nn.embedding_lookup")


class _Getter:
    def __init__(self, num_ps: int, wire_dtype: tf.DType, ps_job: str | None):
        self.num_ps, self.wire_dtype, self.ps_job = num_ps, wire_dtype, ps_job
        self.values: dict[str, tf.Tensor] = {}  # full name -> what the model is handed
        self.state: dict[str, tf.Variable] = {}
        self.sparse: dict[str, list[tf.Variable]] = {}  # full name -> its slices
        self.made_alone: set[str] = set()  # the names of those create_alone made
        self._getting = 0  # get_variable calls under way (create_alone leaves theirs alone)

    def device(self, op) -> str:
        """Sync: slice k on ps k; a whole variable on the ps its name hashes to."""
        if self.ps_job is None:
            return ""
        if op.type not in _VARIABLE_OPS:
            return op.device
        part = _PART.search(op.name)
        task = int(part.group(1)) if part else zlib.crc32(op.name.encode()) % self.num_ps
        return f"/job:{self.ps_job}/task:{task}"

    def partitioner(self, shape, trainable: bool):
        shape = tf.TensorShape(shape)
        if (self.num_ps > 1 and trainable and shape.rank and shape[0] is not None
                and shape[0] >= self.num_ps):
            return tf1.fixed_size_partitioner(self.num_ps)
        return None

    def create_first(self, recorded: Sequence[Recorded]) -> None:
        """Creates the trainable variables before the model asks for them, and reads them all
        at once: one pull per ps. Those whose initial value is not a function (a constant
        tensor, made in the scratch graph) are made when the model asks, and pulled alone."""
        made = []
        for r in recorded:
            kwargs = {k: v for k, v in r.kwargs.items() if k in _GET_VARIABLE_ARGS}
            if kwargs.get("initializer") is not None and not callable(kwargs["initializer"]):
                continue
            kwargs.update(shape=r.shape, dtype=tf.as_dtype(r.dtype))
            partitioner = self.partitioner(r.shape, True)
            with tf1.device(self.device):
                v = tf1.get_variable(r.name, partitioner=partitioner, **kwargs)
            if r.sparse:
                # Sync: never pulled. The model's gathers run where the rows are (on each ps),
                # and only the rows a batch looks up cross to the worker.
                self.values[r.name] = v
                self.sparse[r.name] = list(v) if partitioner else [v]
                continue
            made.append((r.name, list(v) if partitioner else [v]))
        self._pull(made)

    def _pull(self, made: list[tuple[str, list[tf.Variable]]]) -> None:
        """made: (name, its slices) of each variable, read together."""
        for (name, _), value in zip(made, pulled([s for _, s in made], self.wire_dtype)):
            self.values[name] = value

    def create_alone(self, next_creator, **kwargs):
        """A variable the model makes as tf.Variable (a Keras 3 layer's), not by get_variable:
        on the ps its name hashes to, uncut, read where the model reads it; a non-trainable one
        is model state, as get_variable's. (get_variable's own come through here too, inside
        __call__'s placement: left as they are.)"""
        if self._getting:
            return next_creator(**kwargs)
        with tf1.device(self.device):
            v = next_creator(**kwargs)
        _refuse_partitioner(v)
        self.made_alone.add(v.op.name)
        if not v.trainable:
            self.state[v.op.name] = v
        return v

    def __call__(self, getter, name, *args, **kwargs):
        self._getting += 1
        try:
            return self._get(getter, name, *args, **kwargs)
        finally:
            self._getting -= 1

    def _get(self, getter, name, *args, **kwargs):
        if name in self.values:
            return self.values[name]
        trainable = kwargs.get("trainable", True)
        if trainable is None:
            trainable = True
        # Sync: a growing table's bookkeeping (which id each row holds) is cut as its rows are.
        bookkeeping = growing.STATE in (kwargs.get("collections") or ())
        shape = kwargs.get("shape")
        partitioner = None if shape is None else self.partitioner(shape,
                                                                  trainable or bookkeeping)
        kwargs["partitioner"] = partitioner
        with tf1.device(self.device):
            v = getter(name, *args, **kwargs)
        if bookkeeping:  # written by the update alone (growing.py), not model state
            return v
        if not trainable:
            self.state[v.op.name] = v
            return v
        self._pull([(name, list(v) if partitioner else [v])])
        return self.values[name]


def _placeholders_like(value):
    if isinstance(value, Mapping):
        return {k: _placeholders_like(v) for k, v in value.items()}
    if isinstance(value, tf.Tensor):
        return tf1.placeholder(value.dtype, value.shape)
    if isinstance(value, tf.SparseTensor):  # a variable-length feature (tf.io.VarLenFeature)
        return tf1.sparse_placeholder(value.dtype, value.shape)
    raise api.ContractError(f"features and labels must be tensors, SparseTensors or a dict of "
                            f"them, got {type(value).__name__}")


def placeholders(features, labels, name: str = "features"):
    """Placeholders for batches of numpy `features` (an array or a dict of them) and `labels`:
    their dtypes, any number of rows. A SparseTensorValue (a streamed input's variable-length
    feature) gets a sparse placeholder of its rank."""
    def like(value, name):
        if isinstance(value, tf1.SparseTensorValue):
            return tf1.sparse_placeholder(tf.as_dtype(value.values.dtype),
                                          [None] * len(value.dense_shape), name=name)
        value = np.asarray(value)
        return tf1.placeholder(tf.as_dtype(value.dtype), [None, *value.shape[1:]], name=name)

    if isinstance(features, dict):
        return {k: like(v, k) for k, v in features.items()}, like(labels, "labels")
    return like(features, name), like(labels, "labels")


def feed(placeholder, value) -> dict:
    """{placeholder: value}, for one placeholder or a dict of them."""
    if isinstance(placeholder, dict):
        return {placeholder[k]: value[k] for k in placeholder}
    return {placeholder: value}


def pulled(parts: Sequence[Sequence[tf.Variable]], dtype: tf.DType = tf.float32
           ) -> list[tf.Tensor]:
    """Each variable whole (given as its slices in order; a plain one is its only slice), as
    float32 where the caller's ops run, read from each device that holds some of them in one
    tensor, as `dtype`.

    Sync: one pull per ps, not one per slice. Each ps packs every slice it holds into one flat
    tensor (cast to `dtype` there, so a narrow copy crosses), and this side cuts it up again:
    every RecvTensor costs both tasks CPU, and a step pulled 6 of them from each ps. Variables
    on no device (the export's graph) are read as they are; so are variables of another dtype
    than float32, whole.
    """
    by_device: dict[str, list[tf.Variable]] = {}
    value = {}
    for part in parts:
        for v in part:
            if v.dtype.base_dtype != tf.float32:
                value[id(v)] = v.value()
            else:
                by_device.setdefault(v.device, []).append(v)
    for device, held in by_device.items():
        if not device and dtype == tf.float32:
            value.update((id(v), v.value()) for v in held)
            continue
        with tf1.device(device):  # Sync: packed (and cast) where the slices live
            packed = tf.concat([tf.reshape(v.value(), [-1]) for v in held], axis=0)
            sent = packed if dtype == tf.float32 else tf.cast(packed, dtype)
        here = sent if dtype == tf.float32 else tf.cast(sent, tf.float32)
        pieces = tf.split(here, [v.shape.num_elements() for v in held])
        value.update((id(v), tf.reshape(p, v.shape)) for v, p in zip(held, pieces))
    return [value[id(part[0])] if len(part) == 1 else
            tf.concat([value[id(v)] for v in part], axis=0) for part in parts]


class Whole(NamedTuple):
    """A variable as a checkpoint and the export hold it: whole, under its full name."""

    shape: list[int]
    slices: list[tf.Variable]  # in order along the first axis; a plain variable is its only one


def whole_variables(variables: Sequence[tf.Variable]) -> dict[str, Whole]:
    """{full name: Whole} for `variables`, their slices gathered under the variable they cut.

    A slice (a trainable variable cut over K ps, and each optimizer slot made for one, such as
    `layer0/weights/part_1/Adam`) belongs to `layer0/weights` or `layer0/weights/Adam`,
    as tf1.train.Saver writes it; a plain variable stands for itself.
    """
    parts: dict[str, tuple[list[int], list[tuple[int, tf.Variable]]]] = {}
    for v in variables:
        # TensorFlow has no public reader of this; its Saver reads the same attribute.
        info = getattr(v, "_save_slice_info", None)
        if info is None:
            parts[v.op.name] = (v.shape.as_list(), [(0, v)])
        else:
            parts.setdefault(info.full_name, (list(info.full_shape), []))[1].append(
                (info.var_offset[0], v))
    return {name: Whole(shape, [v for _, v in sorted(slices, key=lambda s: s[0])])
            for name, (shape, slices) in parts.items()}
