"""An embedding table that grows: each int64 id its own row, admitted and evicted once per
update, the same for every worker (api.growing_embedding).

What it is made of, per ps k (the table cut over K ps as placement.py cuts any table, the ids
spread by id mod K):
  - `rows`: the slice of the trainable table [cap, dim] on ps k, an ordinary sparse variable:
    a step's gradient is IndexedSlices of the rows it looked up, averaged and applied by the
    existing sparse path (sync.py), and the optimizer's slots are per row;
  - `ids` and `seen` (int64 [cap], cut like the table): the id a row holds, and the update that
    last saw it (-1: the row is free). They are the truth, saved with the model;
  - `index`: a MutableHashTable id -> row on ps k, what a step's lookup reads;
  - `pending`: a MutableHashTable id -> (sightings, last update seen) of ids not yet admitted.

Sync: a worker's step only reads (the index, the rows). It pushes the ids of its batch, with
their counts, into a summing accumulator on each ps beside its gradients and with the same
local step, so the update takes exactly the ids of the batches whose gradients it averaged.
The chief's update then, after applying the gradients and before it hands out the tokens,
admits and evicts (`maintain`): every worker's next step sees the same table. An evicted row's
value and optimizer slots go back to their initial values.

A graph with no ps (the SavedModel's) finds ids through a table built from `ids` and `seen`
when the model is loaded, so it answers as the trained model does.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

# Sync: a collection that marks the bookkeeping variables (`ids`, `seen`), for placement.py
# to cut them like the table, slice k on ps k beside the rows it describes.
STATE = "sync_mnist_growing_state"
FREE = -1  # `seen` of a row that holds no id; the index's answer for an id without a row


class Settings(NamedTuple):
    """What api.growing_embedding checked: the table's shape and its admission rules."""

    name: str
    dim: int
    cap: int  # rows in all, over every ps
    min_count: int  # sightings (in applied updates) before an id gets a row
    ttl: int | None  # updates an id may go unseen before its row (or count) is dropped


class _Shard(NamedTuple):
    """The table's part on one ps."""

    rows: tf.Variable  # float32 [cap_k, dim]
    ids: tf.Variable  # int64 [cap_k]
    seen: tf.Variable  # int64 [cap_k]
    index: tf.lookup.experimental.MutableHashTable  # id -> row in `rows`
    pending: tf.lookup.experimental.MutableHashTable  # id -> (sightings, last update seen)
    batch_ids: tf.Tensor  # this worker's batch: its distinct ids of this shard, sorted
    batch_counts: tf.Tensor  # how often each is in the batch (float32 [n, 1])


def _slices(v) -> list:
    """A variable's slices in order (placement.py cuts a table over the ps); a whole one is
    its only slice."""
    return [v] if isinstance(v, tf.Variable) else list(v)


def lookup(ids: tf.Tensor, settings: Settings, initializer) -> tf.Tensor:
    """The rows of `ids` (float32, ids.shape + [dim]); an id without a row reads zeros and
    gets no gradient. Makes the variables with get_variable under `settings.name`."""
    ids = tf.cast(ids, tf.int64)
    with tf1.variable_scope(settings.name) as scope:
        table = tf1.get_variable("rows", [settings.cap, settings.dim], tf.float32,
                                 initializer=initializer)
        state = [tf1.GraphKeys.GLOBAL_VARIABLES, STATE]
        row_ids = tf1.get_variable("ids", [settings.cap], tf.int64, tf1.zeros_initializer(),
                                   trainable=False, collections=state)
        seen = tf1.get_variable("seen", [settings.cap], tf.int64,
                                tf1.constant_initializer(FREE), trainable=False,
                                collections=state)
        full_name = scope.name
    rows, id_parts, seen_parts = _slices(table), _slices(row_ids), _slices(seen)
    flat = tf.reshape(ids, [-1])
    if not rows[0].device:
        found = _loaded_lookup(flat, rows, id_parts, seen_parts)
    else:
        found = _ps_lookup(flat, settings, full_name, rows, id_parts, seen_parts)
    return tf.reshape(found, tf.concat([tf.shape(ids), [settings.dim]], axis=0))


def _gathered(rows: tf.Variable, ids_rows: tf.Tensor, n: tf.Tensor, dim: int) -> tf.Tensor:
    """[n, dim]: rows[ids_rows[i]] where ids_rows[i] >= 0, zeros elsewhere. Only the rows found
    are gathered, so only they get a gradient."""
    found = tf.where(ids_rows >= 0)
    values = tf.gather(rows, tf.gather_nd(ids_rows, found))
    return tf.scatter_nd(found, values, tf.stack([n, tf.constant(dim, n.dtype)]))


def _ps_lookup(flat, settings: Settings, full_name: str, rows, id_parts, seen_parts):
    """A step's lookup, on the ps that hold the rows: ids spread over them by id mod K."""
    k_count = len(rows)
    n = tf.size(flat, out_type=tf.int64)
    shard_of = tf.cast(tf.math.floormod(flat, k_count), tf.int32)
    parts = tf.dynamic_partition(flat, shard_of, k_count)
    positions = tf.dynamic_partition(tf.range(n), shard_of, k_count)
    shards, pieces = [], []
    for k in range(k_count):
        with tf1.device(rows[k].device):
            # Sync: shared by node name with every task's graph (the workers', the chief's
            # evaluation): the absolute name scope keeps the name the same in each. A
            # checkpoint names a table by its node's last part alone, so that part names the
            # table and the shard in full.
            saved = f"{full_name.replace('/', '.')}.shard_{k}"
            with tf.name_scope(f"{full_name}/shard_{k}/"):
                index = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=FREE, name=f"{saved}.index",
                    checkpoint=True)
                pending = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=tf.constant([0, FREE], tf.int64),
                    name=f"{saved}.pending", checkpoint=True)
            local_rows = tf.reshape(index.lookup(parts[k]), [-1])
            values = _gathered(rows[k], local_rows, tf.size(parts[k], out_type=tf.int64),
                               settings.dim)
        distinct, _, counts = tf.unique_with_counts(parts[k], out_idx=tf.int64)
        order = tf.argsort(distinct)  # the sparse accumulator merges sorted rows
        shards.append(_Shard(rows[k], id_parts[k], seen_parts[k], index, pending,
                             tf.gather(distinct, order),
                             tf.cast(tf.gather(counts, order), tf.float32)[:, None]))
        pieces.append(tf.scatter_nd(positions[k][:, None], values,
                                    tf.stack([n, tf.constant(settings.dim, tf.int64)])))
    graph = tf1.get_default_graph()
    setattr(graph, _MADE, [*getattr(graph, _MADE, []), GrowingTable(settings, shards)])
    return tf.add_n(pieces)


def _loaded_lookup(flat, rows, id_parts, seen_parts):
    """The lookup of a graph with no ps (the SavedModel's): the table id -> row is built from
    `ids` and `seen` when the model is loaded (TABLE_INITIALIZERS, after the variables)."""
    row_ids = tf.concat([v.read_value() for v in id_parts], axis=0)
    held = tf.concat([v.read_value() for v in seen_parts], axis=0) >= 0
    numbers = tf.range(tf.size(row_ids, out_type=tf.int64))
    index = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.boolean_mask(row_ids, held), tf.boolean_mask(numbers, held)), default_value=FREE)
    found = index.lookup(flat)
    dim = rows[0].shape[1]
    if len(rows) == 1:
        return _gathered(rows[0], found, tf.size(flat, out_type=tf.int64), dim)
    where = tf.where(found >= 0)
    values = tf.nn.embedding_lookup(rows, tf.gather_nd(found, where))  # "div", as cut
    return tf.scatter_nd(where, values, tf.stack([tf.size(flat, out_type=tf.int64), dim]))


class GrowingTable:
    """One growing table of a worker's training graph: what its step pushes, and what the
    chief's update does with it (sync.build_train_op's `tables`)."""

    def __init__(self, settings: Settings, shards: list[_Shard]):
        self.settings, self.shards = settings, shards
        self._accumulators: list | None = None
        self._arrived: list | None = None

    @property
    def accumulators(self) -> list:
        """One summing accumulator of ids per shard, on its ps, shared by every worker."""
        if self._accumulators is None:
            self._accumulators = []
            for k, shard in enumerate(self.shards):
                # Made outside whatever control dependencies the first caller is under: the
                # chief's init sets their step without running a step.
                with tf.control_dependencies(None), tf1.device(shard.rows.device):
                    self._accumulators.append(tf1.SparseConditionalAccumulator(
                        tf.float32, shape=tf.TensorShape([None, 1]), reduction_type="SUM",
                        shared_name=f"{self.settings.name}/shard_{k}/sightings",
                        name=f"growing_sightings_{k}"))
        return self._accumulators

    @property
    def state_names(self) -> set[str]:
        """The names of what only the update may write: rows, ids, seen, index and pending."""
        return {t.op.name if hasattr(t, "op") else t.resource_handle.op.name
                for s in self.shards for t in (s.rows, s.ids, s.seen, s.index, s.pending)}

    def to_ps(self) -> list[tf.Tensor]:
        """Sync: this worker's batch ids and counts, copied to each shard's ps: what the step's
        counts wait for beside the gradients, so that with one ps a worker killed mid-step has
        pushed and counted all of it or none."""
        if self._arrived is None:
            self._arrived = []
            for shard in self.shards:
                with tf1.device(shard.rows.device):
                    self._arrived.append((tf.identity(shard.batch_ids),
                                          tf.identity(shard.batch_counts)))
        return [t for pair in self._arrived for t in pair]

    def push(self, local_step: tf.Tensor) -> list[tf.Operation]:
        """Sync: the ids and counts (to_ps), pushed as the gradients are (the same local step:
        accepted or dropped with them)."""
        self.to_ps()
        pushes = []
        for (ids, counts), shard, accumulator in zip(self._arrived, self.shards,
                                                      self.accumulators):
            with tf1.device(shard.rows.device):
                pushes.append(accumulator.apply_indexed_slices_grad(
                    tf.IndexedSlices(counts, ids), local_step=local_step))
        return pushes

    def chief_init(self, global_step: tf.Variable) -> list[tf.Operation]:
        """The accumulators' step set to global_step (each chief session, as SyncReplicas-
        Optimizer sets its own accumulators')."""
        return [a.set_global_step(global_step) for a in self.accumulators]

    def maintain(self, replicas: int, new_step: tf.Tensor, slots_of: Callable) -> tf.Operation:
        """The update's admission and eviction, on each ps, to run after the apply.

        Args:
          replicas: pushes each update takes (R).
          new_step: the update's number (global_step + 1), what `seen` records.
          slots_of: slots_of(variable) -> the optimizer's slot variables of it.
        """
        return tf.group(*[self._maintain_shard(shard, accumulator, replicas, new_step,
                                               slots_of(shard.rows))
                          for shard, accumulator in zip(self.shards, self.accumulators)])

    def _maintain_shard(self, shard: _Shard, accumulator, replicas: int, now: tf.Tensor,
                        slots: list) -> tf.Operation:
        with tf1.device(shard.rows.device), tf.name_scope("growing_update"):
            taken = accumulator.take_indexed_slices_grad(replicas)
            decided = _decide(shard, self.settings, tf.reshape(taken.indices, [-1]),
                              tf.cast(tf.round(tf.reshape(taken.values, [-1])), tf.int64), now)
            return _write(shard, self.settings, decided, now, slots)


class _Decision(NamedTuple):
    """What one update does to one shard (all int64)."""

    admitted: tf.Tensor  # ids that get a row
    new_rows: tf.Tensor  # their rows, in order
    evicted: tf.Tensor  # rows given up (lapsed, or pushed out beyond the cap)
    waiting: tf.Tensor  # ids that go on waiting for a row
    sightings: tf.Tensor  # their counts so far


def _decide(shard: _Shard, s: Settings, ids: tf.Tensor, counts: tf.Tensor,
            now: tf.Tensor) -> _Decision:
    """The update's admissions and evictions, from the ids its batches held (sorted, unique)
    and their counts; marks the rows of those ids seen now (the one write here)."""
    rows_of = tf.reshape(shard.index.lookup(ids), [-1])
    has_row = rows_of >= 0
    found = tf.boolean_mask(rows_of, has_row)
    touched = tf1.scatter_update(shard.seen, found, tf.fill(tf.shape(found), now))
    # Sightings of the ids without a row: a count lapses when its id went unseen for ttl
    # updates, as a row does.
    waiting = tf.boolean_mask(ids, ~has_row)
    before = tf.reshape(shard.pending.lookup(waiting), [-1, 2])
    kept = before[:, 1] >= 0
    if s.ttl is not None:
        kept = tf.logical_and(kept, now - before[:, 1] <= s.ttl)
    sightings = tf.where(kept, before[:, 0], 0) + tf.boolean_mask(counts, ~has_row)
    ready = sightings >= s.min_count
    with tf.control_dependencies([touched]):
        seen = shard.seen.read_value()
    held = seen >= 0
    lapsed = tf.logical_and(held, now - seen >= s.ttl) if s.ttl is not None \
        else tf.zeros_like(held)
    free = tf.logical_or(~held, lapsed)
    # Beyond the cap: rows not seen in this update, least recently seen first (then the lower
    # row), make room for as many of the ready ids as they can.
    can_go = tf.logical_and(tf.logical_and(held, ~lapsed), seen < now)
    n_free = tf.reduce_sum(tf.cast(free, tf.int64))
    candidates, candidate_counts = tf.boolean_mask(waiting, ready), tf.boolean_mask(
        sightings, ready)
    n_admit = tf.minimum(tf.size(candidates, out_type=tf.int64),
                         n_free + tf.reduce_sum(tf.cast(can_go, tf.int64)))
    order = tf.argsort(-candidate_counts, stable=True)  # the most seen, then the lower id
    n_out = tf.maximum(n_admit - n_free, 0)
    pushed_out = tf.cond(n_out > 0, lambda: tf.argsort(  # a sort of every row, only if needed
        tf.where(can_go, seen, np.iinfo(np.int64).max), stable=True)[:n_out],
        lambda: tf.zeros([0], tf.int32))
    evict = tf.logical_or(lapsed, tf.scatter_nd(pushed_out[:, None], tf.ones_like(pushed_out),
                                                tf.shape(seen)) > 0)
    return _Decision(
        admitted=tf.gather(candidates, order[:n_admit]),
        new_rows=tf.cast(tf.where(tf.logical_or(free, evict))[:n_admit, 0], tf.int64),
        evicted=tf.cast(tf.where(evict)[:, 0], tf.int64),
        waiting=tf.concat([tf.boolean_mask(waiting, ~ready),
                           tf.gather(candidates, order[n_admit:])], axis=0),
        sightings=tf.concat([tf.boolean_mask(sightings, ~ready),
                             tf.gather(candidate_counts, order[n_admit:])], axis=0))


def _write(shard: _Shard, s: Settings, d: _Decision, now: tf.Tensor,
           slots: list) -> tf.Operation:
    """Makes the decision so: the index, the bookkeeping, the evicted rows reset, the counts."""
    evicted_ids = tf.gather(shard.ids.read_value(), d.evicted)
    removed = shard.index.remove(evicted_ids)
    with tf.control_dependencies([removed]):
        inserted = shard.index.insert(d.admitted, d.new_rows)
    cleared = tf1.scatter_update(shard.seen, d.evicted,
                                 tf.fill(tf.shape(d.evicted), tf.constant(FREE, tf.int64)))
    with tf.control_dependencies([cleared]):
        marked = tf1.scatter_update(shard.seen, d.new_rows, tf.fill(tf.shape(d.new_rows), now))
    with tf.control_dependencies([evicted_ids]):  # read before it is written
        unnamed = tf1.scatter_update(shard.ids, d.evicted, tf.zeros_like(d.evicted))
    with tf.control_dependencies([unnamed]):
        named = tf1.scatter_update(shard.ids, d.new_rows, d.admitted)
    # Sync: an evicted row starts again as it was made: its value and every slot.
    reset = [tf1.scatter_update(v, d.evicted, _initial_rows(v, d.evicted))
             for v in [shard.rows, *slots]]
    counted = shard.pending.insert(d.waiting, tf.stack(
        [d.sightings, tf.fill(tf.shape(d.sightings), now)], axis=1))
    with tf.control_dependencies([counted]):
        forgotten = shard.pending.remove(d.admitted)
    writes = [inserted, marked, named, *reset, forgotten]
    if s.ttl is not None:
        # The counts of ids unseen for ttl updates go, every ttl updates: a pass over all the
        # waiting ids (one id of an endless log is seen once, so they are many). A count
        # that waits longer is never read (_decide keeps one only while it is fresh).
        def sweep():
            keys, values = shard.pending.export()
            keys, values = tf.reshape(keys, [-1]), tf.reshape(values, [-1, 2])
            return shard.pending.remove(tf.boolean_mask(keys, now - values[:, 1] >= s.ttl))

        with tf.control_dependencies([forgotten]):
            writes.append(tf.cond(tf.equal(now % s.ttl, 0), lambda: tf.group(sweep()),
                                  tf.no_op))
    return tf.group(*writes)


def _initial_rows(v: tf.Variable, rows: tf.Tensor) -> tf.Tensor:
    """`rows` of v's initial value: a constant's without making the whole of it (Adagrad's
    accumulator, Momentum's zeros); a random initializer's drawn whole, only when a row is
    evicted."""
    init = v.initial_value
    while init.op.type == "Identity":
        init = init.op.inputs[0]
    shape = tf.concat([tf.shape(rows, out_type=tf.int64),
                       tf.constant(v.shape[1:].as_list(), tf.int64)], axis=0)
    if init.op.type == "Fill":
        return tf.fill(shape, init.op.inputs[1])
    if init.op.type == "Const":
        value = tf.make_ndarray(init.op.get_attr("value"))
        if value.size and (value == value.flat[0]).all():
            return tf.fill(shape, tf.constant(value.flat[0], v.dtype.base_dtype))
    return tf.cond(tf.size(rows) > 0, lambda: tf.gather(v.initial_value, rows),
                   lambda: tf.zeros(shape, v.dtype.base_dtype))


# The graph's attribute that lists the GrowingTable of each lookup on the ps. Not a graph
# collection: a Saver would try to write the Python objects into its meta graph. Not a
# dictionary by graph here either: a table's tensors hold their graph, which would then live
# as long as the process.
_MADE = "_sync_mnist_growing_tables"


def tables(graph: tf.Graph | None = None) -> list[GrowingTable]:
    """The growing tables made in `graph` (the default graph), in the order made."""
    return list(getattr(graph or tf1.get_default_graph(), _MADE, []))


COMBINERS = ("mean", "sum", "sqrtn")


def _dense_column_base():
    # TensorFlow's v1 feature columns have no public base class to write a column on:
    # input_layer takes instances of this one (as the v2 columns it accepts are).
    from tensorflow.python.feature_column import feature_column as fc_v1

    return fc_v1._DenseColumn  # pylint: disable=protected-access


class Column(_dense_column_base()):
    """A growing table as a feature column, for input_layer (api.growing_embedding_column): the
    rows of a feature's ids, combined over each example's ids."""

    def __init__(self, key: str, settings: Settings, combiner: str, initializer):
        self.key, self.settings, self.combiner = key, settings, combiner
        self.initializer = initializer

    @property
    def name(self) -> str:
        return f"{self.key}_growing_embedding"

    @property
    def _parse_example_spec(self) -> dict:
        return {self.key: tf.io.VarLenFeature(tf.int64)}

    def _transform_feature(self, inputs):
        return inputs.get(self.key)

    @property
    def _variable_shape(self) -> tf.TensorShape:
        return tf.TensorShape([self.settings.dim])

    def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
        """[batch, dim]: each example's rows combined; an example of no ids (a SparseTensor's
        empty row) reads zeros. A dense feature's values are all ids, [batch] or [batch, n]."""
        ids = inputs.get(self)
        if isinstance(ids, tf.SparseTensor):
            rows = lookup(ids.values, self.settings, self.initializer)
            example = ids.indices[:, 0]
            batch = ids.dense_shape[0]
        else:
            flat = tf.reshape(ids, [tf.shape(ids)[0], -1])
            rows = lookup(tf.reshape(flat, [-1]), self.settings, self.initializer)
            batch = tf.shape(flat, out_type=tf.int64)[0]
            example = tf.repeat(tf.range(batch), tf.shape(flat, out_type=tf.int64)[1])
        summed = tf.math.unsorted_segment_sum(rows, example, batch)
        if self.combiner == "sum":
            return summed
        counts = tf.math.unsorted_segment_sum(tf.ones_like(example, tf.float32), example, batch)
        scale = counts if self.combiner == "mean" else tf.sqrt(counts)
        return tf.math.divide_no_nan(summed, scale[:, None])
