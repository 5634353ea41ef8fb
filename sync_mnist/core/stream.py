"""A worker's shard of a streamed input: a `tf.data.Dataset` of examples, cut per worker,
batched, and read in a local session of its own, a few batches ahead, never whole in memory.
A run of that session brings a group of up to 16 batches (group_size), and examples parsed a
block at a time are cut into batches whole (_unbatched): the reading's CPU is taken from the
training's on a busy worker.

Sync: `batch(step)` is a pure function of the update number, as `Shard.batch` is for data in
memory: the batch of update u + 1 is batch u of this worker's stream (its passes over its shard,
each pass's last partial batch dropped). A worker restarted into the cluster at update u starts
its stream there, so the examples of the updates made before it
died are not used again, and none after is skipped: from its latest saved position (tf.data's
iterator state, every POSITION_EVERY batches, kept on ps 0 and in the checkpoints), reading
only the batches since. A step whose gradient was not used (a restart threw it away) is redone
with the same batch.

Every worker's stream is the same function of (the files, the seed, its index): the package sets
the input graph's seed (--seed) before calling the input function, so its shuffles draw the same
orders on a rerun; reading is deterministic (tf.data's default).

Uneven shards: a stream may end before the others (files of different sizes). The worker sees
it one batch ahead (`ends_after`), and asks the cluster to stop on the update of its last batch,
as a preemption asks (early_stop.py): every worker stops there and the run verifies, never a
worker waiting for a gradient that will not come.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import time
from typing import NamedTuple

import tensorflow as tf

from sync_mnist.core import coverage
from sync_mnist.core.cluster import server_config
from sync_mnist.core.config import first_line
from sync_mnist.core.shard import DataError

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

# The run's length when --epochs is given over a stream: not known until the first worker's
# input ends, which stops the cluster (early_stop.INPUT_ENDED). A bound no run reaches.
UNTIL_INPUT_ENDS = 2 ** 62
PREFETCH = 2  # reads (groups of batches, below) ahead in the input's own threads
# Batches between the positions a worker saves (its iterator's state, tf.data's own, at a
# group's start), kept on ps 0 and in the checkpoints: a restart reads at most about twice this
# many batches to find its place, wherever it is in its input.
POSITION_EVERY = 256
# A run of the input's session costs about 0.3 ms of CPU here, whatever it brings: 3 us a click
# in batches of 100. So a run brings a group of up to MAX_GROUP batches, of at most GROUP_BYTES
# (where every feature has a fixed shape: a group is one tensor; else a batch a run).
MAX_GROUP, GROUP_BYTES = 16, 1 << 20
# What tf.data's FILE auto-sharding raises where it cannot cut by file: fewer files than workers,
# or a source that reads no files (data in memory, a generator).
_NOT_BY_FILE = ("Could not apply FILE based sharding", "Found an unshardable source dataset")
# What a bad file, record or value raises when it is read (item 7 of issue 44: exit 2, a line).
_BAD_DATA = (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError)


FILE, DATA = tf.data.experimental.AutoShardPolicy.FILE, tf.data.experimental.AutoShardPolicy.DATA


# Dataset ops whose first input is a list of file names (the readers' own, or the slices a
# reader's flat_map or interleave takes them from), and ops that read records (a reader, or a
# flat_map or interleave of readers): a .shard() before any of them cuts file names.
_LISTS_FILES = ("TensorSliceDataset", "TFRecordDatasetV2", "TFRecordDataset", "TextLineDataset",
                "CSVDatasetV2", "FixedLengthRecordDatasetV2")
_READS = ("TFRecordDatasetV2", "TFRecordDataset", "TextLineDataset", "CSVDatasetV2",
          "FixedLengthRecordDatasetV2", "FlatMapDataset", "InterleaveDataset",
          "ParallelInterleaveDatasetV2", "ParallelInterleaveDatasetV3",
          "ParallelInterleaveDatasetV4", "LegacyParallelInterleaveDatasetV2")
LOCATE_SECS = 60.0  # of reading, to find which file holds bad data


def is_dataset(value) -> bool:
    return isinstance(value, tf.data.Dataset)


class Stream:
    """Worker `index` of `num_workers`: its batches of `dataset`, built in `graph`.

    `dataset` yields single examples `(features, labels)`. Where it cuts itself with a
    .shard() (of the cluster's numbers, else DataError), or is `sharded` (the input function
    took an `input_context`), it is not cut again; else it is cut here: by file where every
    worker's files give it at least one batch, else by record (tf.data's FILE, or DATA,
    auto-sharding; every worker decides alike, from the same files). `plan` says what this
    worker reads, for the data verdict (coverage.py). `epochs`: passes over the shard, None
    without end (--train-steps). Raises DataError for a dataset that cannot be trained on."""

    def __init__(self, graph: tf.Graph, dataset: tf.data.Dataset, *, index: int,
                 num_workers: int, batch_size: int, epochs: int | None, sharded: bool, what: str):
        self._graph, self._what, self._batch_size = graph, what, batch_size
        self._index, self._position, self._dataset, self._pass = index, 0, dataset, 0
        self._pending: collections.deque = collections.deque()  # of the group last read
        self._read_to = 0  # the batch the next group begins with
        with graph.as_default():
            self._start = tf1.placeholder(tf.int64, [], name="input_start")
            _check_element(dataset, what)
            cardinality = dataset.cardinality()
        self._group = group_size(dataset.element_spec, batch_size)
        self._sess = input_session(graph)
        if _read(self._sess, cardinality, None, f"{what}: making its dataset") == \
                tf.data.INFINITE_CARDINALITY:
            raise DataError(f"{what}'s dataset repeats without end: drop its .repeat(); the "
                            "package repeats it (--epochs, --train-steps)")
        policy, own = _decide_cut(self, sharded, index, num_workers)
        self.plan = _plan(self, policy, own, index, num_workers)
        # Sync: whole batches only, so that every update averages equal batches; the
        # remainder of each pass is left unused, as Shard drops it.
        with graph.as_default():
            blocks = _unbatched(dataset) if policy is not DATA else None
            if blocks is not None:  # examples cut from blocks: cut into batches, not one by one
                batches = _cut(self._graph, blocks, policy, index, num_workers).rebatch(
                    batch_size, drop_remainder=True)
            else:
                batches = _cut(self._graph, dataset, policy, index, num_workers).batch(
                    batch_size, drop_remainder=True)
            batches = _passes(batches, epochs).skip(self._start)
            if self._group > 1:
                batches = batches.batch(self._group)
            iterator = _iterator(batches.prefetch(PREFETCH))
            self._init, self._next = iterator.initializer, iterator.get_next()
            self._positions = _Positions(iterator, _fingerprint(self, epochs, num_workers),
                                         _external_state_policy(graph))
        self._seek(0)
        self._built_with = _shapes(self._ahead and self._ahead[0])  # the model's placeholders
        if self._ahead is None:
            raise _no_batch(self, num_workers)

    def batch(self, step: int):
        """The batch of `step` (features, labels), as numpy values (a SparseTensorValue where
        the dataset has a SparseTensor)."""
        if step < 0:
            raise DataError(f"step must be non-negative, got {step}")
        if step != self._position:
            self._seek(step)
        if self._ahead is None:
            raise DataError(f"{self._what}'s input has no batch {step}: it ended before it")
        # In a group every feature's shape is fixed (group_size), so its batches' cannot
        # differ: checked where a batch is read alone, 10 us of a step's Python saved.
        if self._group == 1 and (shapes := _shapes(self._ahead[0])) != self._built_with:
            where, got, first = _difference(shapes, self._built_with)
            raise DataError(f"{self._what}: batch {step} of worker {self._index}'s input has "
                            f"{where} of {got}; the model was built with {first} (the first "
                            "batch's)")
        (current, self._pass), self._position = self._ahead, step + 1
        self._ahead = self._following()
        return current

    def pass_of(self, step: int) -> int:
        """The pass (from 0) of batch `step`, which batch() returned last."""
        if step != self._position - 1:
            raise ValueError(f"the pass of batch {step}: batch() returned {self._position - 1} last")
        return self._pass

    def ends_after(self, step: int) -> bool:
        """Whether batch `step`, which batch() returned last, is the stream's last."""
        return self._position == step + 1 and self._ahead is None

    def _seek(self, step: int) -> None:
        """Starts the stream at batch `step`: from the latest saved position at or before it
        (its iterator's state, then the batches since, read and dropped), else from the start,
        reading past the batches before it."""
        saved = self._positions.before(step)
        self._position, self._ahead = step, None
        self._pending.clear()
        self._read_to = saved[0] if saved else step
        self._run(self._init, {self._start: 0 if saved else step})
        if saved:
            try:
                self._sess.run(self._positions.load, {self._positions.blob: saved[1]})
            except tf.errors.OpError as e:  # a state this tf.data cannot read: from the start
                log.warning("my input's position saved at batch %d cannot be restored (%s: %s)",
                            saved[0], type(e).__name__, first_line(e))
                self._positions.saved.remove(saved)
                return self._seek(step)
            log.info("starting my input at batch %d: from its position saved at batch %d, "
                     "reading the %d batches since", step, saved[0], step - saved[0])
        elif step:
            log.info("starting my input at batch %d (reading past the batches before it)", step)
        self._ahead = self._following()
        # The batch _following returned last is batch read_to - len(pending) - 1.
        while self._ahead is not None and self._read_to - len(self._pending) - 1 < step:
            self._ahead = self._following()

    def resume_from(self, blobs) -> None:
        """Takes the positions saved on the ps (position_blob's, b"" where none), for the seeks
        that follow: those of another dataset (files changed since, say) are passed over."""
        self._positions.take(blobs)

    def position(self) -> bytes | None:
        """A position saved since the last call, to keep on the ps (position_blob), or None."""
        return self._positions.new()

    def _following(self):
        """The batch after those read: the next of the group last read, else of a new group
        (read in one run); None at the input's end."""
        if not self._pending:
            first, last = self._read_to, self._read_to + self._group - 1
            read = self._run(self._next, where=(
                f"batch {first}" if first == last else f"batches {first} to {last}") +
                f" of worker {self._index}'s input")
            if read is None:
                return None
            self._pending.extend(zip(_split(read[0]), read[1].tolist()) if self._group > 1
                                 else [(read[0], int(read[1]))])  # (batch, its pass)
            self._read_to += len(self._pending)
            if self._read_to // POSITION_EVERY > self._positions.last // POSITION_EVERY:
                self._positions.save(self._sess, self._read_to)
        return self._pending.popleft()

    def _run(self, fetch, feed=None, where: str | None = None):
        """A run of the input's session; None at the input's end. Bad data is a DataError that
        names the file where a scan can find it (`_locate`)."""
        try:
            return _read(self._sess, fetch, feed, f"{self._what}: reading " + (
                where or f"batch {self._position} of worker {self._index}'s input"))
        except DataError as e:
            # A file that is gone TensorFlow names itself (a search would name another).
            if isinstance(e.__cause__, _BAD_DATA) and not isinstance(
                    e.__cause__, tf.errors.NotFoundError) and not any(
                    m in str(e) for m in _NOT_BY_FILE):
                raise DataError(f"{e}{_locate(self._graph, self._sess, self._dataset, str(e))}") \
                    from e.__cause__
            raise

    def close(self) -> None:
        self._sess.close()


def _cut(graph: tf.Graph, dataset, policy, index: int, num_workers: int) -> tf.data.Dataset:
    """Worker `index`'s share of `dataset` by tf.data's auto-sharding `policy` (None: all)."""
    if policy is None:
        return dataset
    from tensorflow.python.data.experimental.ops import distribute

    with graph.as_default():
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = policy
        return distribute._AutoShardDataset(  # what MultiWorkerMirroredStrategy uses
            dataset.with_options(options), num_workers, index, num_workers)


def _locate(graph: tf.Graph, sess: tf1.Session, dataset: tf.data.Dataset,
            message: str) -> str:
    """Where the bad data is: the file (the k-th that the dataset reads, read alone through
    the user's own pipeline, cut by file) and how many examples it gave first. Only where
    TensorFlow's line does not name it already, and for at most LOCATE_SECS of reading."""
    files = files_read(graph, sess, dataset)
    if not files or any(f in message for f in files):
        return ""
    deadline = time.monotonic() + LOCATE_SECS
    for k, name in enumerate(files):
        with graph.as_default():
            iterator = _iterator(_cut(graph, dataset, FILE, k, len(files)))
            element = iterator.get_next()
        read = 0
        try:
            sess.run(iterator.initializer)
            while time.monotonic() < deadline:
                sess.run(element)
                read += 1
        except tf.errors.OutOfRangeError:
            continue
        except _BAD_DATA:
            return f" (in {name}, after {read} of its examples came through the pipeline)"
        except tf.errors.OpError:  # the pipeline cannot be read file by file
            return ""
        break
    return (f" (in one of the {len(files)} files it reads; not found within "
            f"{LOCATE_SECS:g} s of reading them one by one)")


class WholeInput:
    """An evaluation input, read whole at each evaluation, `batch_size` examples at a time (the
    last batch partial), in a local session: never held whole in memory."""

    def __init__(self, graph: tf.Graph, dataset: tf.data.Dataset, *, batch_size: int,
                 what: str):
        self._what = what
        with graph.as_default():
            _check_element(dataset, what)
            cardinality = dataset.cardinality()
            iterator = _iterator(dataset.batch(batch_size).prefetch(PREFETCH))
            self._init, self._next = iterator.initializer, iterator.get_next()
        self._sess = input_session(graph)
        if _read(self._sess, cardinality, None, f"{what}: making its dataset") == \
                tf.data.INFINITE_CARDINALITY:
            raise DataError(f"{what}'s dataset repeats without end: an evaluation reads it "
                            "whole; drop its .repeat()")

    def __iter__(self):
        where = f"{self._what}: reading the evaluation data"
        _read(self._sess, self._init, None, where)
        while (batch := _read(self._sess, self._next, None, where)) is not None:
            yield batch

    def close(self) -> None:
        self._sess.close()


def _iterator(dataset: tf.data.Dataset):
    """An initializable iterator of `dataset`, with tf.data's autotuning off.

    Autotuning runs a thread per iterator that wakes at periods growing to a minute, and an
    iterator's end waits for it: a worker's input took 10 to 27 s to close when its run ended
    (3 workers reading the click files, gdb: ~RootDataset::Iterator waiting on
    Model::OptimizeLoop), which held back the chief's evaluation. Without it, a map's
    num_parallel_calls=AUTOTUNE reads as many in parallel as the worker has cores.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf1.data.make_initializable_iterator(dataset.with_options(options))


def input_session(graph: tf.Graph) -> tf1.Session:
    """The local session an input is read in, with thread pools of its own that do not spin.

    A worker shares the cores with the other tasks (the server's pools do not spin either:
    cluster.server_config); a session's default pools spin for work before they sleep, and
    the input's, woken a few times a batch, spun in the worker's CPU profile (perf, 2 workers
    and a ps on 2 cores: docs/sparse.md).
    """
    config = server_config()
    # Its own pools: the process's shared one takes the options of whichever session came first.
    config.use_per_session_threads = True
    return tf1.Session(graph=graph, config=config)


def _unbatched(dataset: tf.data.Dataset) -> tf.data.Dataset | None:
    """The dataset of blocks that `dataset` is the .unbatch() of (the tf.data guide's vectorized
    parsing: batch, parse, unbatch), where every feature is dense and of a fixed shape but the
    block's length; else None. tf.data's rebatch cuts such blocks into batches in one copy, the
    same batches as unbatch().batch() (its documentation), without passing examples one by one:
    the click files' reading cost 2.3 us of CPU a click so, 3.8 unbatched and batched.

    Each block is copied first: a block may be a view into a larger one (the input function's
    own rebatch, a split), and rebatch then logs an error a block ("Tensor RefCount not
    reliable if buf_ points to a SubBuffer") though it cuts right."""
    blocks = getattr(dataset, "_input_dataset", None)
    if blocks is None or dataset._variant_tensor.op.type != "UnbatchDataset":
        return None
    columns = _columns(blocks.element_spec)
    fixed = all(isinstance(c, tf.TensorSpec) and c.shape.rank and c.shape[1:].is_fully_defined()
                for c in columns)
    return blocks.map(_copied) if fixed else None


def _copied(features, labels):
    """The block in buffers of its own."""
    return tf.nest.map_structure(lambda t: tf.raw_ops.DeepCopy(x=t), (features, labels))


def group_size(spec, batch_size: int) -> int:
    """Batches of `spec`'s examples a run of the input's session brings: up to MAX_GROUP, of at
    most GROUP_BYTES; 1 where a feature is sparse, a string or of a shape not fixed (its batches
    may differ in size or shape: a group is one tensor)."""
    columns = _columns(spec)
    if not all(isinstance(c, tf.TensorSpec) and c.shape.is_fully_defined()
               and c.dtype != tf.string for c in columns):
        return 1
    size = batch_size * sum(c.shape.num_elements() * c.dtype.size for c in columns)
    return max(1, min(MAX_GROUP, GROUP_BYTES // max(size, 1)))


def _columns(spec) -> list:
    """The specs of an element (features, labels): each feature's, then the labels'."""
    features, labels = spec
    return [*(features.values() if isinstance(features, dict) else [features]), labels]


def _passes(one_pass: tf.data.Dataset, epochs: int | None) -> tf.data.Dataset:
    """`one_pass` `epochs` times over (None: without end), each batch with its pass's number
    (from 0): (batch, pass), for --count-examples. The user's options stay the pipeline's."""
    passes = tf.data.Dataset.range(epochs) if epochs is not None else \
        tf.data.Dataset.counter()
    return passes.flat_map(lambda p: one_pass.map(lambda *batch: (batch, p))).with_options(
        one_pass.options())


def _split(group) -> list:
    """The batches of a group (features, labels) that tf.data stacked: views, not copies."""
    features, labels = group
    if isinstance(features, dict):
        return [({k: v[j] for k, v in features.items()}, labels[j])
                for j in range(len(labels))]
    return [(features[j], labels[j]) for j in range(len(labels))]


def _own_cut(dataset: tf.data.Dataset, run, what: str, index: int,
             num_workers: int) -> _OwnCut | None:
    """The .shard() `dataset` cuts itself with, checked against the cluster; None where it has
    none. Raises DataError for a cut that is not this worker's of this cluster. `run` is the
    stream's session's (Stream._run)."""
    ops = [op for op in _upstream(dataset) if op.type == "ShardDataset"]
    if not ops:
        return None
    numbers = run([[op.inputs[1], op.inputs[2]] for op in ops],
                  where="the numbers of its .shard()")
    for op, (shards, shard) in zip(ops, numbers):
        if (int(shards), int(shard)) != (num_workers, index):
            raise DataError(
                f"{what}'s dataset cuts itself with .shard({int(shards)}, "
                f"{int(shard)}) ({op.name}), but this is worker {index} of {num_workers}: "
                f"cut with .shard({num_workers}, {index}) (input_context's "
                "num_input_pipelines and input_pipeline_id, or TF_CONFIG of this "
                "cluster), or drop the .shard() and the package cuts it")
    op = ops[-1]  # the first cut the data meets: the file names', where it cuts them
    return _OwnCut(op, not any(o.type in _READS for o in _upstream_of(op)))

def _plan(stream: Stream, policy, own: _OwnCut | None, index: int, n: int) -> coverage.Plan:
    """What `stream` reads of its input, for the data verdict (coverage.py)."""
    lists = _file_lists(stream._graph, stream._sess, stream._dataset)
    listed = tuple(dict.fromkeys(f for names in lists for f in names))
    records = (f"<the records of its {len(listed)} file{'s' * (len(listed) != 1)}, in its "
               "order>" if listed else
               f"<the records of {stream._what}'s dataset, in its order>")
    if policy is FILE:  # tf.data cuts every list of file names: worker k reads k, k + n, ..
        return coverage.Plan(stream.sharding, {f: coverage.WHOLE for names in lists
                                               for f in names[index::n]}, listed)
    if policy is DATA or own is not None and not own.by_file:
        return coverage.Plan(stream.sharding, {records: (index, n)})
    if own is not None:  # the file names this worker's .shard() lets through, in a pass
        with stream._graph.as_default():
            iterator = _iterator(tf.data.experimental.from_variant(
                own.op.outputs[0], tf.TensorSpec([], tf.string)))
            name = iterator.get_next()
        stream._run(iterator.initializer, where="its file names")
        mine = []
        while (value := stream._run(name, where="its file names")) is not None:
            mine.append(value.decode())
        return coverage.Plan(stream.sharding, dict.fromkeys(mine, coverage.WHOLE), listed)
    # input_context, and no cut the package can see: every file it lists, read whole
    return coverage.Plan(stream.sharding, dict.fromkeys(listed, coverage.WHOLE), listed)


def _no_batch(stream: Stream, num_workers: int) -> DataError:
    files = files_read(stream._graph, stream._sess, stream._dataset)
    return DataError(f"{stream._what}'s dataset has no full batch of {stream._batch_size} "
                     f"examples for worker {stream._index} of {num_workers} (sharded "
                     f"{stream.sharding}; " + (f"it reads {len(files)} files)" if files else
                                               "it reads no file that exists: does its pattern "
                                               "match any?)"))


def _gives_a_batch(stream: Stream, dataset, worker: int) -> bool:
    """Whether `dataset`, cut by file for `worker`, gives a full batch (False: it cannot be
    cut so)."""
    with stream._graph.as_default():
        iterator = _iterator(dataset.batch(stream._batch_size, drop_remainder=True).take(1))
        first = iterator.get_next()
    where = f"the first batch of worker {worker}'s files"
    try:
        stream._run(iterator.initializer, where=where)
        return stream._run(first, where=where) is not None
    except DataError as e:
        if any(m in first_line(e.__cause__) for m in _NOT_BY_FILE):
            return False
        raise


def _decide_cut(stream: Stream, sharded: bool, index: int, num_workers: int):
    """(tf.data's auto-shard policy, the dataset's own .shard()) of `stream`'s input, and its
    `sharding` in words: by its own cut where it has one, else by the package's."""
    dataset = stream._dataset
    own = _own_cut(dataset, stream._run, stream._what, index, num_workers)
    # Sync: a dataset that cuts itself (a .shard() of the cluster's numbers) is never cut
    # again: a second cut would leave most examples unused, and every worker unaware.
    if own is not None:
        stream.sharding = f"by {'file' if own.by_file else 'record'}, by the input " \
                          "function's .shard()"
        return None, own
    if sharded:
        stream.sharding = "by the input function (input_context)"
        return None, None
    by_file = all(_gives_a_batch(stream, _cut(stream._graph, dataset, FILE, k, num_workers), k)
                  for k in range(num_workers))
    stream.sharding = f"by {'file' if by_file else 'record'}, by the package"
    return (FILE if by_file else DATA), None


class PositionVars(NamedTuple):
    """Each worker's last two saved input positions, on ps 0, saved with the checkpoints (so a
    resumed run and a restored ps have them as well as a restarted worker): slot 2 w + k."""

    blobs: tf.Variable  # string [2 workers]; b"" where none
    slot: tf.Tensor  # placeholder int32 [1]
    blob: tf.Tensor  # placeholder string [1]
    write: tf.Tensor  # blobs[slot] = blob


def build_position_vars(num_workers: int) -> PositionVars:
    with tf1.device("/job:ps/task:0"), tf1.variable_scope("sync_input"):
        blobs = tf1.get_variable("positions", initializer=tf.fill([2 * num_workers], ""),
                                 trainable=False)
        slot = tf1.placeholder(tf.int32, [1], name="position_slot")
        blob = tf1.placeholder(tf.string, [1], name="position_blob")
        return PositionVars(blobs, slot, blob, tf1.scatter_update(blobs, slot, blob))


def position_slot(worker: int, blob: bytes) -> int:
    """Where worker `worker` keeps `blob`: its two slots in turn, by the position's number."""
    batch = json.loads(blob.partition(b"\n")[0])["batch"]
    return 2 * worker + (batch // POSITION_EVERY) % 2


class _Positions:
    """Saved positions of a stream: tf.data's iterator state at a group's first batch, tagged
    with the batch's number and the stream's fingerprint (a blob: JSON line, then the state).
    A dataset whose state tf.data refuses to save (external state) saves none, and a restart
    reads past the batches before it. (A seeded random op's state is saved.)"""

    def __init__(self, iterator, fingerprint: str, policy: int):
        self.fingerprint, self.last = fingerprint, 0
        self.saved: list[tuple[int, bytes]] = []  # this process's and the ps's, by batch
        self._new: bytes | None = None
        self._failed = False
        handle = iterator._iterator_resource  # pylint: disable=protected-access
        self._save = tf.io.serialize_tensor(tf.raw_ops.SerializeIterator(
            resource_handle=handle, external_state_policy=policy))
        self.blob = tf1.placeholder(tf.string, [], name="input_position")
        self.load = tf.raw_ops.DeserializeIterator(
            resource_handle=handle, serialized=tf.io.parse_tensor(self.blob, tf.variant))

    def save(self, sess: tf1.Session, batch: int) -> None:
        self.last = batch
        if self._failed:
            return
        try:
            state = sess.run(self._save)
        except tf.errors.OpError as e:
            self._failed = True
            log.info("my input's position cannot be saved (%s): a restart reads past the "
                     "batches before its place", first_line(e))
            return
        self._new = json.dumps({"fingerprint": self.fingerprint, "batch": batch}).encode() + \
            b"\n" + state
        self.saved = [*self.saved, (batch, state)][-2:]

    def new(self) -> bytes | None:
        new, self._new = self._new, None
        return new

    def take(self, blobs) -> None:
        for blob in blobs:
            head, _, state = bytes(blob).partition(b"\n")
            try:
                tag = json.loads(head) if head else None
            except ValueError:
                tag = None
            if tag and tag.get("fingerprint") == self.fingerprint:
                self.saved.append((int(tag["batch"]), state))
            elif tag:
                log.info("passing over my input's position saved at batch %s: it is of another "
                         "input (its files, the cut or the batch differ)", tag.get("batch"))
        self.saved.sort(key=lambda s: s[0])

    def before(self, step: int) -> tuple[int, bytes] | None:
        """The latest saved position at or before batch `step`, where it saves reading."""
        fit = [s for s in self.saved if 0 < s[0] <= step]
        return fit[-1] if fit else None


# Stateful ops that keep no state a position must hold: _copied's DeepCopy (stateful only so
# that it is never folded away), the checks a parse makes, and the datasets a function reads
# (TFRecordDataset, say: their state is the iterator's, which tf.data saves).
_NO_STATE = {"DeepCopy", "Assert", "PrintV2", "Print"}


def _external_state_policy(graph: tf.Graph) -> int:
    """SerializeIterator's external_state_policy for the input's graph: 1 (ignore) where the only
    stateful ops its functions run keep no state (_NO_STATE); else 2 (fail where tf.data finds
    a state it cannot save, rather than restore a stream that gives other batches)."""
    from tensorflow.python.framework import op_def_registry

    stateful = {node.op for f in graph._functions.values()  # pylint: disable=protected-access
                for node in f.definition.node_def
                if (op := op_def_registry.get(node.op)) is not None and op.is_stateful}
    return 1 if all(op in _NO_STATE or op.endswith("Dataset") or "DatasetV" in op
                    for op in stateful) else 2


def _fingerprint(stream: Stream, epochs: int | None, num_workers: int) -> str:
    """What a saved position is good for: this worker's cut of these files (names, sizes and
    times), batched and repeated alike."""
    files = files_read(stream._graph, stream._sess, stream._dataset)
    stats = [(f, *(lambda s: (s.st_size, s.st_mtime_ns))(os.stat(f))) for f in files
             if os.path.exists(f)]
    spec = repr(stream._dataset.element_spec)
    text = json.dumps([stats, stream.sharding, spec, stream._batch_size, epochs, stream._index,
                       num_workers, stream._group])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class _OwnCut(NamedTuple):
    op: tf.Operation  # the dataset's ShardDataset
    by_file: bool  # it cuts the file names, before any reader


def _upstream(dataset: tf.data.Dataset) -> list[tf.Operation]:
    """The ops `dataset`'s graph is made of, itself first (not inside its functions)."""
    return _upstream_of(dataset._variant_tensor.op)


def _upstream_of(first: tf.Operation) -> list[tf.Operation]:
    ops, seen, stack = [], set(), [first]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        ops.append(op)
        stack.extend(t.op for t in op.inputs)
    return ops


def _file_lists(graph: tf.Graph, sess: tf1.Session, dataset: tf.data.Dataset) -> list[list[str]]:
    """The lists of file names `dataset`'s graph holds (each reader's, or the files a pattern
    matched), each in its order, keeping only files that exist; [] where it holds none."""
    with graph.as_default():
        names = [op.inputs[0] for op in _upstream(dataset) if op.type in _LISTS_FILES
                 and op.inputs and op.inputs[0].dtype == tf.string]
    try:
        values = sess.run(names)
    except tf.errors.OpError:  # a pattern that matches nothing, say: the caller's error says so
        return []
    return [[f.decode() for f in value.reshape(-1) if tf.io.gfile.exists(f.decode())]
            for value in values]


def files_read(graph: tf.Graph, sess: tf1.Session, dataset: tf.data.Dataset) -> list[str]:
    """The files `dataset` reads, in its order, where its graph lists them (a reader's list of
    file names, or the files a pattern matched); [] where it does not."""
    return list(dict.fromkeys(f for names in _file_lists(graph, sess, dataset) for f in names))


def _read(sess: tf1.Session, fetch, feed, where: str):
    """A run of an input's session; None at the input's end; bad data a DataError saying
    `where`, with TensorFlow's own line (its readers name the record or line they can)."""
    try:
        return sess.run(fetch, feed)
    except tf.errors.OutOfRangeError:
        return None
    except _BAD_DATA as e:
        raise DataError(f"{where}: {type(e).__name__}: {first_line(e)}") from e


def _shapes(batch) -> list[tuple[str, str]] | None:
    """(name, "dtype [dims after the batch's]") of each of a batch's features and its labels:
    what a placeholder was made from (a sparse feature: its rank)."""
    if batch is None:
        return None
    features, labels = batch
    columns = features if isinstance(features, dict) else {"": features}
    out = []
    for name, value in [*sorted(columns.items()), ("labels", labels)]:
        where = "labels" if name == "labels" else f"features[{name!r}]" if name else "features"
        if isinstance(value, tf1.SparseTensorValue):
            out.append((where, f"{value.values.dtype} sparse, rank {len(value.dense_shape)}"))
        else:
            out.append((where, f"{value.dtype} {list(value.shape[1:])}"))
    return out


def _difference(shapes, built_with) -> tuple[str, str, str]:
    """(where, this batch's, the first batch's) of the first feature that differs."""
    return next((mine[0], mine[1], first[1]) for mine, first in zip(shapes, built_with)
                if mine != first)


def _check_element(dataset: tf.data.Dataset, what: str) -> None:
    """A dataset of (features, labels): features a tensor, a SparseTensor, or a dict of them;
    labels a tensor. Raises DataError naming what it yields instead."""
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise DataError(f"{what}'s dataset yields {spec}, not pairs (features, labels)")
    features, labels = spec
    columns = features if isinstance(features, dict) else {"": features}
    for name, column in [*columns.items(), ("labels", labels)]:
        where = "labels" if name == "labels" else f"features[{name!r}]" if name else "features"
        dense = isinstance(column, tf.TensorSpec)
        if not (dense or isinstance(column, tf.SparseTensorSpec) and name != "labels"):
            raise DataError(f"{what}'s dataset yields {where} as {type(column).__name__}: "
                            "give a dense tensor" + ("" if name == "labels" else
                                                     " or a SparseTensor (tf.io.VarLenFeature)"))
