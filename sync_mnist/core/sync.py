"""Synchronous training: the SyncReplicasOptimizer wiring, the counters that prove it, the verdict.

How one synchronous update works (SyncReplicasOptimizer, between-graph replication):
  1. Each worker computes gradients and pushes them into one ConditionalAccumulator per
     variable, on that variable's ps, tagged with the worker's local step. An accumulator
     silently drops a gradient whose local step is older than its own (a stale gradient).
  2. The worker then blocks on the token queue.
  3. The chief's queue runner waits until every accumulator holds at least R gradients, applies
     their average with the real optimizer (global_step += 1), and enqueues one token per
     worker; a token's value is the new global step, and becomes the worker's local step.

Counting is done on the ps, never assumed:
  * `pushed[w]` += 1 in worker w's own step, just before its gradients are pushed, once the
    whole gradient has reached the ps (so a worker killed mid-step has pushed all or nothing).
  * `accepted[w]` is written by the update itself. Each worker pushes one_hot(w) into a summing
    accumulator of its own, just before its gradients and with the same local step, so it is
    accepted or dropped exactly as they are. The update takes that sum with the gradients:
    how many gradients of each worker this update averaged.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import tensorflow as tf

from sync_mnist.core import by_scope

tf1 = tf.compat.v1


class SharedState(NamedTuple):
    """Variables on the ps that every task of the cluster reads."""

    global_step: tf.Variable
    pushed: tf.Variable  # int64 [workers]: gradients each worker pushed
    accepted: tf.Variable  # int64 [workers]: gradients of each worker that some update averaged
    repeat_updates: tf.Variable  # updates that averaged two or more gradients of one worker
    solo_updates: tf.Variable  # updates whose gradients all came from a single worker (R > 1)
    over_aggregated: tf.Variable  # updates that averaged more than R gradients


class SyncTraining(NamedTuple):
    train_op: tf.Tensor  # its value (the token): the global step after the update this push joined
    hooks: list
    optimizer: tf1.train.Optimizer  # the SyncReplicasOptimizer (or the plain one in async mode)
    # Sync: for a worker restarted into a running cluster. `rejoin` takes a token without
    # pushing and makes it this worker's local step; `tokens_waiting` is the token queue's size.
    rejoin: tf.Tensor | None = None
    tokens_waiting: tf.Tensor | None = None
    # (global_step, last_push, tokens_waiting), read in that order (needs last_push).
    rejoin_reading: tuple | None = None
    # The step's token where it is taken, on ps 0 (async: global_step after the update), for
    # what must be read after it there (early_stop.build_stop_ops).
    token_on_ps: tf.Tensor | None = None


def build_shared_state(num_workers: int, global_step: tf.Variable | None = None) -> SharedState:
    """Creates global_step (unless given: a program's own, library.py) and the counters, on ps
    0 whatever device scope is around the call.

    Every task's graph finds them there by name. All on one ps: the counting in each step, the
    update's bookkeeping and every reading of the counters then touch ps 0 alone, not one ps
    more for each ps the cluster has (a round-robin would deal them out over all of them).
    """
    # Sync: on ps 0, with the token queue, membership and the stop (SyncReplicasOptimizer puts
    # its queue and the update's sync op on global_step's device).
    if global_step is None:
        with tf1.device("/job:ps/task:0"):
            global_step = tf1.train.get_or_create_global_step()
    with tf1.device("/job:ps/task:0"), tf1.variable_scope("sync_counters"):
        def counter(name, shape=()):
            return tf1.get_variable(name, shape, tf.int64, tf1.zeros_initializer(),
                                    trainable=False)

        return SharedState(global_step, counter("pushed", [num_workers]),
                           counter("accepted", [num_workers]), counter("repeat_updates"),
                           counter("solo_updates"), counter("over_aggregated"))


def build_example_uses(num_ids: int) -> tf.Variable:
    """--count-examples: each id's uses in applied updates, and in which passes (coverage.py's
    judge_ids), on ps 0 beside the counters. Saved with the model, so a ps restored from a
    checkpoint has the counts of its updates."""
    with tf1.device("/job:ps/task:0"), tf1.variable_scope("sync_counters"):
        return tf1.get_variable("example_uses", [num_ids, 2], tf.float32,
                                tf1.zeros_initializer(), trainable=False)


def example_uses_delta(ids: tf.Tensor, passed: tf.Tensor, uses: tf.Variable,
                       replicas: int) -> tuple[tf.IndexedSlices, tf.Variable]:
    """(d, uses) to push beside the gradients as a state delta, so that the update that averages
    this push adds (1, 2**passed) to uses[id] for each of the batch's ids (`passed`: the batch's
    pass, from 0): -replicas times that, summed over the pushes and divided by R
    (_Update._mean), then subtracted (_WithState). Whole numbers all the way (below 2**24 with
    at most COUNTED_PASSES passes), so the counts are exact; a push a restart threw away is
    never counted, as its gradient is never applied."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    use = tf.stack([1.0, tf.pow(2.0, tf.cast(passed, tf.float32))]) * -float(replicas)
    values = tf.tile(use[None], [tf.size(ids), 1])
    return tf.IndexedSlices(values, ids, tf.constant(uses.shape.as_list(), tf.int64)), uses


def build_train_op(loss: tf.Tensor, state: SharedState,
                   optimizer: tf1.train.Optimizer | Mapping[str, tf1.train.Optimizer], *,
                   worker_index: int, num_workers: int, replicas_to_aggregate: int,
                   is_chief: bool, mode: str = "sync", num_tokens: int = 0,
                   last_push: tf.Variable | None = None, proof: bool = True,
                   after_update: Callable[[tf.Tensor], tf.Operation] | None = None,
                   wire_dtype: str = "float32",
                   state_deltas: Sequence[tuple[tf.Tensor, tf.Variable]] = (),
                   tables: Sequence = ()) -> SyncTraining:
    """Builds one worker's training step.

    Args:
      loss: the scalar loss of this worker's graph.
      state: from build_shared_state.
      optimizer: the real optimizer (Adam by default), or one per variable scope
        (api.ModelSpec), applied together in each update as one (by_scope.ByScope).
      worker_index: this worker, 0 being the chief.
      num_workers: workers in the cluster.
      replicas_to_aggregate: gradients averaged per update; num_workers for strict lockstep.
      is_chief: whether this worker runs the update loop.
      mode: "sync", or "async" for the plain optimizer (every push is an update of its own).
      num_tokens: tokens the chief preloads; 0 is the fix, -1 the stock default (R tokens).
      last_push: int64 [workers] on the ps; each push writes its local step there, so that a
        restarted worker can tell whether its predecessor's last gradient is waiting.
      proof: False leaves out the counters (pushed, the who-accumulator, accepted and the
        rest), for the benchmark to price them; such a run cannot be verified.
      after_update: after_update(new_step) builds ops that each update runs after applying
        the gradients and before it hands out its tokens (sync mode; early_stop.latch).
      wire_dtype: "float32", or "bfloat16": each gradient crosses to its ps in half the bytes
        and is float32 again there (to_ps).
      state_deltas: (d, s) for each write of the model's UPDATE_OPS (audit.state_deltas):
        pushed and averaged like a gradient, applied as s -= mean(d), not by the optimizer.
      tables: the model's growing tables (growing.GrowingTable, sync mode only): each push
        carries the batch's ids beside the gradients, and each update admits and evicts
        after its apply, before it hands out the tokens.

    Returns:
      SyncTraining with the op to run each step and the hooks the session needs.
    """
    if isinstance(optimizer, Mapping):
        optimizer = by_scope.ByScope(optimizer)
    grads_and_vars = optimizer.compute_gradients(loss)
    if all(g is None for g, _ in grads_and_vars):
        from sync_mnist.api import ContractError
        raise ContractError(f"the loss ({loss.name}) depends on none of the model's "
                            f"{len(grads_and_vars)} trainable variables: nothing to train")
    # A variable the loss does not depend on (a frozen layer) has no gradient to aggregate.
    grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None] + list(state_deltas)
    optimizer = _WithState(optimizer, [s for _, s in state_deltas]) if state_deltas else optimizer
    if mode == "async":
        _refuse_tables_in_async_mode(tables)
        return _async_train_op(grads_and_vars, state, optimizer, worker_index, wire_dtype)
    return _sync_train_op(grads_and_vars, state, optimizer, worker_index=worker_index,
                          num_workers=num_workers, replicas_to_aggregate=replicas_to_aggregate,
                          is_chief=is_chief, num_tokens=num_tokens, last_push=last_push,
                          proof=proof, after_update=after_update, wire_dtype=wire_dtype,
                          tables=tables)


def _refuse_tables_in_async_mode(tables: Sequence) -> None:
    if tables:
        from sync_mnist.core.config import ConfigError
        raise ConfigError(f"the growing table {tables[0].settings.name} needs --mode sync: its "
                          "rows are admitted and evicted once per update, for all workers")


def _sync_train_op(grads_and_vars, state: SharedState, optimizer: tf1.train.Optimizer, *,
                   worker_index: int, num_workers: int, replicas_to_aggregate: int,
                   is_chief: bool, num_tokens: int, last_push: tf.Variable | None, proof: bool,
                   after_update: Callable[[tf.Tensor], tf.Operation] | None,
                   wire_dtype: str, tables: Sequence = ()) -> SyncTraining:
    """--mode sync: SyncReplicasOptimizer around `optimizer`, with owned tokens when R = N and
    none preloaded, the counters (unless not `proof`) and the rejoin ops."""
    who, local_step = _who_and_local_step(state, num_workers, proof)
    grads_and_vars = _copy_count_push(grads_and_vars, state, who, local_step,
                                      worker_index=worker_index, num_workers=num_workers,
                                      last_push=last_push, wire_dtype=wire_dtype, tables=tables)
    # Sync: with R = N and no preloaded tokens, every worker has a token queue of its own,
    # filled by each update, so a worker can only ever take its own token (owned_tokens).
    owned = replicas_to_aggregate == num_workers and num_tokens == 0
    own_queues = _own_token_queues(state, num_workers) if owned else None
    update = _Update(optimizer, state, who, replicas_to_aggregate, after_update, own_queues,
                     tables)
    sync_optimizer = tf1.train.SyncReplicasOptimizer(
        update, replicas_to_aggregate=replicas_to_aggregate, total_num_replicas=num_workers)
    with tf1.variable_creator_scope(_local_step_by_reference):
        stock_train_op = sync_optimizer.apply_gradients(grads_and_vars,
                                                        global_step=state.global_step)
    _sparse_accumulators_sum(sync_optimizer)
    # Only a session manager runs it; a task that stops before its session (bad input) would
    # end with TensorFlow's "Object was never used" warning as its last line.
    sync_optimizer.ready_for_local_init_op.mark_used()
    _copy_the_local_step_at_init(sync_optimizer, local_step, who, state, tables)
    token, queue, taken = _token(sync_optimizer, stock_train_op, state,
                                 own_queues[worker_index] if owned else None)
    train_op = tf1.assign(local_step, tf.cast(token, tf.int64))  # a global_step of any int
    # Sync: num_tokens=0 is the fix for the question's asynchrony. The default preloads R
    # tokens that any worker may take, so one fast worker can supply every gradient of an
    # update. With no preloaded tokens, a worker gets its next token only from the update its
    # last gradient joined, so with R = N each update holds exactly one gradient per worker.
    hook = sync_optimizer.make_session_run_hook(is_chief, num_tokens=num_tokens)
    _chief_queue_runner_that_never_closes(sync_optimizer, update.update_op if owned else None)
    rejoin, tokens_waiting, reading = _rejoin_ops(sync_optimizer, queue, state, local_step,
                                                  last_push)
    return SyncTraining(train_op, [hook], sync_optimizer, rejoin, tokens_waiting, reading, taken)


def _async_train_op(grads_and_vars, state: SharedState, optimizer: tf1.train.Optimizer,
                    worker_index: int, wire_dtype: str) -> SyncTraining:
    """--mode async: the plain optimizer, every push an update of its own, counted alike."""
    grads_and_vars = restored(to_ps(grads_and_vars, wire_dtype), grads_and_vars)
    one = tf.ones([1], tf.int64)
    with tf.control_dependencies([tf1.scatter_add(state.pushed, [worker_index], one)]):
        apply = optimizer.apply_gradients(grads_and_vars, state.global_step)
    with tf.control_dependencies([apply]):
        count = tf1.scatter_add(state.accepted, [worker_index], one)
    with tf.control_dependencies([count]):
        step = state.global_step.read_value()
    return SyncTraining(tf.identity(step), [], optimizer, token_on_ps=step)


def _who_and_local_step(state: SharedState, num_workers: int, proof: bool):
    """The who-accumulator (None without the proof) and this worker's private local step."""
    # Sync: who contributed. A summing accumulator beside the gradient accumulators, and this
    # worker's copy of the optimizer's local step, so both are judged stale or fresh alike.
    # (Benchmark only, proof=False: no counters and no who-accumulator. The copies to the ps
    # and last_push, which is membership and not proof, stay: only the proof is priced.)
    with tf1.device(state.global_step.device):
        who = None if not proof else tf1.ConditionalAccumulator(
            tf.float32, shape=[num_workers], reduction_type="SUM",
            shared_name="sync_counters/who_accumulator", name="who_accumulator")
    # A variable's name is shared across the cluster, and replica_device_setter puts every
    # variable on a ps; colocating with an op of this worker keeps this one private, as
    # SyncReplicasOptimizer does for its own local step.
    with tf1.colocate_with(tf.no_op(name="local_anchor")):
        local_step = tf1.get_local_variable("sync_counters/local_step", shape=[],
                                            dtype=tf.int64, initializer=tf1.zeros_initializer())
    return who, local_step


def _copy_count_push(grads_and_vars, state: SharedState, who, local_step: tf.Variable, *,
                     worker_index: int, num_workers: int, last_push: tf.Variable | None,
                     wire_dtype: str, tables: Sequence = ()) -> list:
    """The gradients to push, each on its variable's ps, after this push is counted there."""
    # Sync: copy each gradient to its variable's ps before anything is counted or pushed. The
    # counts and pushes then wait for the whole gradient to be there, and run on the ps alone:
    # a worker killed mid-step has (with one ps) pushed and counted all of it or none of it,
    # which is what lets a restarted worker trust pushed and last_push.
    arrived = to_ps(grads_and_vars, wire_dtype)
    ids_arrived = [t for table in tables for t in table.to_ps()]  # a growing table's batch ids
    # Read now, beside the gradients, not under the gate below: a read made there would wait
    # for the gradients to reach the ps and then cost one more ps -> worker -> ps round trip
    # on every step. Nothing else writes local_step during a step (only its last op does,
    # with the token), so it is the same value; SyncReplicasOptimizer reads its own copy so.
    pushed_step = local_step.read_value()
    # Everything the counts need is made on the ps too, so that nothing waits for this worker
    # once the gradient has arrived.
    with tf1.device(state.global_step.device), \
            tf.control_dependencies([t for a in arrived for t in a.tensors] + ids_arrived):
        counted = [] if who is None else [
            tf1.scatter_add(state.pushed, [worker_index], tf.ones([1], tf.int64)),
            who.apply_grad(tf.one_hot(worker_index, num_workers), local_step=pushed_step)]
        if last_push is not None:
            counted.append(tf1.scatter_update(last_push, [worker_index],
                                              tf.reshape(pushed_step, [1])))
    # Sync: a growing table's batch ids, each shard's on its ps, with the same local step as
    # the gradients: the update takes exactly the ids of the batches it averaged.
    with tf.control_dependencies([t for a in arrived for t in a.tensors] + ids_arrived):
        counted += [push for table in tables for push in table.push(pushed_step)]
    with tf.control_dependencies(counted):  # Sync: count first, then push the gradients
        return restored(arrived, grads_and_vars)


class Arrived(NamedTuple):
    """Every gradient of one ps's variables, as made on that ps (to_ps): the dense ones and
    the sparse ones' rows in one flat tensor; the sparse ones' row numbers in another."""

    device: str
    packed: tf.Tensor  # in the wire dtype
    variables: list  # whose gradients it holds, in order
    rows: tf.Tensor | None = None  # int64: for each sparse gradient its row count, then rows

    @property
    def tensors(self) -> list[tf.Tensor]:
        """What crossed: what the counts wait for."""
        return [self.packed] + ([] if self.rows is None else [self.rows])


def to_ps(grads_and_vars, wire_dtype: str = "float32") -> list[Arrived]:
    """The gradients, made on this worker, copied to their variables' ps: one tensor each ps
    (two when it holds a sparse variable).

    Sync: one push per ps, not one per slice (every RecvTensor costs both tasks CPU). With
    "bfloat16" the packed gradient is cast on this worker, so half the bytes cross; `restored`
    makes it float32 again on the ps, so the accumulators average float32 values and the
    optimizer applies them in float32, each element rounded once (to nearest, 8 significant
    bits: a relative error of at most 2**-9).

    A sparse gradient (IndexedSlices: an embedding table's) stays sparse: its rows are summed
    per row number here and sorted by it, and only those rows and their numbers cross. The
    sparse accumulators on the ps need that form: they merge pushes as sorted lists of unique
    rows (an unsorted or repeated row is added as a row of its own).
    """
    by_device: dict[str, list] = {}
    for g, v in grads_and_vars:
        if g is not None:
            by_device.setdefault(v.device, []).append((g, v))
    arrived = []
    for device, pairs in by_device.items():
        flat, counts, rows = [], [], []
        for g, v in pairs:
            if isinstance(g, tf.IndexedSlices):
                unique, values = _summed_by_row(g)
                flat.append(tf.reshape(values, [-1]))
                counts.append(tf.size(unique, out_type=tf.int64)[None])
                rows.append(unique)
            else:
                flat.append(tf.reshape(g, [-1]))
        packed = tf.concat(flat, axis=0)
        sent = packed if wire_dtype == "float32" else tf.cast(packed, wire_dtype)  # Sync: here
        row_numbers = tf.concat(counts + rows, axis=0) if rows else None
        with tf1.device(device):
            arrived.append(Arrived(device, tf.identity(sent), [v for _, v in pairs],
                                   None if row_numbers is None else tf.identity(row_numbers)))
    return arrived


def _summed_by_row(g: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """(rows, values): the rows g touches, sorted and unique (int64), and g's values summed
    over each."""
    indices = tf.cast(g.indices, tf.int64)
    unique, position = tf.unique(indices)
    order = tf.argsort(unique)
    summed = tf.math.unsorted_segment_sum(g.values, position, tf.size(unique))
    return tf.gather(unique, order), tf.gather(summed, order)


def restored(arrived: list[Arrived], grads_and_vars) -> list:
    """grads_and_vars with each gradient as it arrived (to_ps): float32, cut out of its ps's
    packed tensor on that ps, in new ops (None stays None); a sparse one as IndexedSlices.

    The cast back comes after the copy, not in it: Grappler's arithmetic optimizer swaps an
    Identity that follows a widening cast with it, and in doing so moved the counts' wait
    from the gradient's arrival on the ps to a signal from the worker (the partition graphs
    showed it; tests/inprocess/test_partition.py checks the wait).
    """
    sparse = {id(v) for g, v in grads_and_vars if isinstance(g, tf.IndexedSlices)}
    grads = {}
    for a in arrived:
        with tf1.device(a.device):
            flat = tf.identity(a.packed) if a.packed.dtype == tf.float32 else tf.cast(
                a.packed, tf.float32)
            cut = [v for v in a.variables if id(v) in sparse]
            if not cut:
                pieces = tf.split(flat, [v.shape.num_elements() for v in a.variables])
                grads.update((id(v), tf.reshape(p, v.shape)) for v, p in zip(a.variables, pieces))
                continue
            counts = a.rows[:len(cut)]
            rows = dict(zip((id(v) for v in cut),
                            tf.split(a.rows[len(cut):], counts, num=len(cut))))
            count = {id(v): counts[k] for k, v in enumerate(cut)}
            sizes = [count[id(v)] * v.shape[1:].num_elements() if id(v) in sparse
                     else tf.constant(v.shape.num_elements(), tf.int64) for v in a.variables]
            for v, p in zip(a.variables, tf.split(flat, tf.stack(sizes), num=len(sizes))):
                grads[id(v)] = tf.IndexedSlices(
                    tf.reshape(p, [-1, *v.shape[1:]]), rows[id(v)],
                    tf.constant(v.shape.as_list(), tf.int64)) if id(v) in sparse \
                    else tf.reshape(p, v.shape)
    return [(None if g is None else grads[id(v)], v) for g, v in grads_and_vars]


def _own_token_queues(state: SharedState, num_workers: int) -> list:
    """One token queue per worker, beside global_step (owned tokens)."""
    with tf1.device(state.global_step.device):
        return [tf1.FIFOQueue(-1, state.global_step.dtype.base_dtype, shapes=[()],
                              name=f"sync_token_q_worker_{w}",
                              shared_name=f"sync_token_q_worker_{w}")
                for w in range(num_workers)]


def _copy_the_local_step_at_init(sync_optimizer, local_step: tf.Variable, who,
                                 state: SharedState, tables: Sequence = ()) -> None:
    """Patches the optimizer's init ops to set our local step (and the who-accumulator's)."""
    # Sync: keep our copy of the local step equal to the optimizer's: set from the value its
    # init op assigns, and from every token. (Both init ops are public attributes the session
    # hook reads in begin(), so replacing them here is enough.)
    copy_init = tf1.assign(local_step, tf.cast(sync_optimizer.local_step_init_op, tf.int64))
    sync_optimizer.local_step_init_op = copy_init
    sync_optimizer.chief_init_op = tf.group(
        sync_optimizer.chief_init_op, copy_init,
        *([] if who is None else [who.set_global_step(state.global_step)]),
        *[op for table in tables for op in table.chief_init(state.global_step)])


def _sparse_accumulators_sum(sync_optimizer) -> None:
    """Makes each sparse gradient accumulator sum its pushes; _Update divides by R.

    Sync: a SparseConditionalAccumulator that averages ("MEAN", SyncReplicasOptimizer's only
    choice) divides each row by the number of pushes that held that row, not by the number of
    pushes: a row that one worker of three looked up got that worker's gradient whole, three
    times its weight in the mean of the three gradients (tests/inprocess/test_sparse.py shows
    it). Summed and divided by R, each row is the mean of one gradient from each worker, a
    worker that did not look the row up counting as zero: what the dense accumulators give.
    (The optimizer has no public handle on its accumulators, nor a way to choose this.)
    """
    from tensorflow.core.framework import attr_value_pb2

    for accumulator, _ in sync_optimizer._accumulator_list:  # pylint: disable=W0212
        if isinstance(accumulator, tf1.SparseConditionalAccumulator):
            accumulator.accumulator_ref.op._set_attr(  # pylint: disable=W0212
                "reduction_type", attr_value_pb2.AttrValue(s=b"SUM"))


def _optimizer_local_step(sync_optimizer) -> tf.Variable:
    # The optimizer has no public handle on its token queue or local step.
    return sync_optimizer._local_step  # pylint: disable=protected-access


def _token(sync_optimizer, stock_train_op: tf.Tensor, state: SharedState, own_queue):
    """The token this worker's step takes, the queue it takes it from (its own queue with owned
    tokens, else the optimizer's shared one), and the token as taken there, on ps 0."""
    if own_queue is None:
        _pushes_before_the_token(stock_train_op)  # checks that inputs[1] is the dequeue
        return (stock_train_op, sync_optimizer._sync_token_queue,  # pylint: disable=W0212
                stock_train_op.op.inputs[1])
    pushes = _pushes_before_the_token(stock_train_op)
    with tf1.device(state.global_step.device), tf.control_dependencies(pushes):
        mine = own_queue.dequeue()
    return tf1.assign(_optimizer_local_step(sync_optimizer), mine), own_queue, mine


def _rejoin_ops(sync_optimizer, queue, state: SharedState, local_step: tf.Variable,
                last_push: tf.Variable | None):
    """(rejoin, tokens_waiting, rejoin_reading) for SyncTraining."""
    # Sync: a worker restarted into a running cluster may find the token its predecessor never
    # took, or its predecessor's gradient waiting in the accumulators; it then takes a token
    # without pushing again (see rejoin_needed).
    with tf1.device(state.global_step.device):
        taken = queue.dequeue()
        # The queue is read after global_step and last_push: with owned tokens, whoever reads
        # an update's new step then also finds its token (_Update).
        seen = [state.global_step.read_value()] + (
            [] if last_push is None else [last_push.read_value()])
        with tf.control_dependencies(seen):
            waiting_after = queue.size()
    with tf.control_dependencies([tf1.assign(_optimizer_local_step(sync_optimizer), taken)]):
        rejoin = tf1.assign(local_step, tf.cast(taken, tf.int64))
    return rejoin, queue.size(), (*seen, waiting_after) if last_push is not None else None


def _pushes_before_the_token(stock_train_op: tf.Tensor) -> list[tf.Operation]:
    """This worker's gradient pushes, from the train op SyncReplicasOptimizer built.

    The stock op is assign(local_step, shared_token_queue.dequeue()), the dequeue under a
    control dependency on every push. The optimizer keeps no other handle on the pushes.
    """
    dequeue = stock_train_op.op.inputs[1].op
    if not dequeue.type.startswith("QueueDequeue") or not dequeue.control_inputs:
        raise RuntimeError(f"SyncReplicasOptimizer's train op changed shape: {dequeue.type} "
                           "where its token dequeue was expected (sync.py owns the tokens)")
    return list(dequeue.control_inputs)


def _local_step_by_reference(next_creator, **kwargs):
    """Makes SyncReplicasOptimizer's local step a reference variable.

    Each of its accumulators reads the local step for its push. A resource variable makes a
    read op per accumulator, and each read crosses from this worker to the ps in an RPC of its
    own: six per step for this model. A reference variable has one snapshot, which all of them
    share, so it crosses once.
    """
    if kwargs.get("name") == "sync_rep_local_step":
        kwargs["use_resource"] = False
    return next_creator(**kwargs)


class _Wrapper(tf1.train.Optimizer):
    """An optimizer around another: its gradients, slots and variables are the other's."""

    def __init__(self, optimizer: tf1.train.Optimizer):
        super().__init__(use_locking=False, name=optimizer.get_name())
        self._optimizer = optimizer

    def compute_gradients(self, *args, **kwargs):
        return self._optimizer.compute_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self):
        return self._optimizer.variables()


class _WithState(_Wrapper):
    """The real optimizer for the model's variables; s -= d for its state (audit.py)."""

    def __init__(self, optimizer: tf1.train.Optimizer, state: Sequence[tf.Variable]):
        super().__init__(optimizer)
        self._state = {id(s) for s in state}

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        applied = self._optimizer.apply_gradients(
            [(g, v) for g, v in grads_and_vars if id(v) not in self._state], global_step, name)
        moved = []
        for d, s in grads_and_vars:
            if id(s) in self._state:
                with tf1.colocate_with(s):  # Sync: once per update, the workers' mean of d
                    moved.append(tf1.scatter_sub(s, d.indices, d.values)
                                 if isinstance(d, tf.IndexedSlices) else tf1.assign_sub(s, d))
        return tf.group(applied, *moved)


class _Update(_Wrapper):
    """One update, as SyncReplicasOptimizer's inner optimizer: the real optimizer, the proof's
    bookkeeping, and (with owned tokens) every worker's token, in the order the protocol needs.

    SyncReplicasOptimizer hands it the averaged gradients of each update. In one op it applies
    them, takes the who-accumulator's sum into the counters, runs `after_update` (the early
    stop's latch), puts the new global step into each worker's own token queue, and only then
    makes the step visible (global_step += 1).
    """

    def __init__(self, optimizer: tf1.train.Optimizer, state: SharedState, who, replicas: int,
                 after_update: Callable[[tf.Tensor], tf.Operation] | None = None,
                 own_queues: list | None = None, tables: Sequence = ()):
        super().__init__(optimizer)
        self._state, self._who, self._replicas = state, who, replicas
        self._tables = tables
        self._after_update, self._own_queues = after_update, own_queues
        self.update_op: tf.Operation | None = None

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        # Sync: a sparse gradient arrives summed (_sparse_accumulators_sum): the mean of the R
        # gradients is the sum over R, as a dense accumulator divides it.
        grads_and_vars = [(self._mean(g) if isinstance(g, tf.IndexedSlices) else g, v)
                          for g, v in grads_and_vars]
        # Each slice's apply waits for its own gradient's take alone (its input), on its ps:
        # nothing of one ps waits for another until the new step is handed out.
        applied = self._optimizer.apply_gradients(grads_and_vars, name=name)
        handed_out = [applied]
        if self._tables:
            # Sync: admission and eviction after the apply (which used the rows the workers
            # looked up) and before the tokens: every worker's next step sees the new table.
            with tf.control_dependencies([applied]):
                number = global_step.read_value() + 1  # only this op writes it
                handed_out += [table.maintain(self._replicas, number, self._slots_of)
                               for table in self._tables]
        per_worker = None
        if self._who is not None:
            # Gradients of each worker in this update. take_grad(R) waits for R but sums all
            # that arrived, as the gradient accumulators average all that arrived. The
            # who-push precedes the gradient push; the who-take follows the gradient take and
            # precedes the update's hand-out. Both accumulators thus see the same pushes,
            # unless one worker's two pushes straddle the take, microseconds apart.
            with tf.control_dependencies([g.values if isinstance(g, tf.IndexedSlices) else g
                                          for g, _ in grads_and_vars if g is not None]):
                per_worker = tf.cast(tf.round(self._who.take_grad(self._replicas)), tf.int64)
            handed_out.append(per_worker)
        with tf.control_dependencies(handed_out):
            new_step = global_step.read_value() + 1  # only this op writes it, one at a time
        if self._after_update is not None:
            with tf.control_dependencies(handed_out):
                handed_out.append(self._after_update(new_step))
        if self._own_queues is not None:
            # Sync: the tokens go in before the step is visible, so that whoever reads the new
            # global_step also finds the tokens (a successor's rejoin reads exactly so).
            with tf.control_dependencies(handed_out):
                handed_out = [q.enqueue(new_step) for q in self._own_queues]
        with tf.control_dependencies(handed_out):
            step = tf1.assign_add(global_step, 1)
        counts = []
        if per_worker is not None:
            state, r = self._state, self._replicas
            most, total = tf.reduce_max(per_worker), tf.reduce_sum(per_worker)

            def count_if(var, condition):
                return tf1.assign_add(var, tf.cast(condition, tf.int64))

            counts = [tf1.assign_add(state.accepted, per_worker),
                      count_if(state.repeat_updates, most > 1),
                      count_if(state.solo_updates, tf.logical_and(tf.equal(most, total), r > 1)),
                      count_if(state.over_aggregated, total > r)]
        self.update_op = tf.group(step, *counts, *_witnesses(new_step, grads_and_vars))
        return self.update_op

    def _slots_of(self, variable: tf.Variable) -> list[tf.Variable]:
        slots = (self._optimizer.get_slot(variable, n) for n in self._optimizer.get_slot_names())
        return [s for s in slots if s is not None]

    def _mean(self, summed: tf.IndexedSlices) -> tf.IndexedSlices:
        with tf1.colocate_with(summed.values):  # on the table's ps, not global_step's
            return tf.IndexedSlices(summed.values / self._replicas, summed.indices,
                                    summed.dense_shape)


def _witnesses(new_step: tf.Tensor, grads_and_vars) -> list[tf.Operation]:
    """A copy of the update's new step on each ps but the one where it is made, each part of
    the update: no part of an update outlives another on its ps.

    Sync: each ps runs its part of an update, and the ps where the new step is made waits, from
    the update's start, for every other ps's part (the applies it counts); the other parts wait
    for nothing from it. A ps told that the chief running the update has died ends its part:
    when that is another ps, the part that waits for it then fails and ends too; when it is
    this one, a part elsewhere that no packet told went on waiting for the next gradients, took
    them from the chief's replacement, and its update stopped half made (the zombie update:
    tests/network/test_zombie_update.py). With the copy each other part waits for this one as
    well, and so ends with it, before it has taken anything. A part that no ps is told to end
    takes the next gradients whole and makes the update as the replacement would have.
    """
    home = tf.DeviceSpec.from_string(new_step.device)
    devices = {v.device for _, v in grads_and_vars
               if tf.DeviceSpec.from_string(v.device) != home}
    witnesses = []
    for device in sorted(devices):
        # An Assert, as Grappler prunes a bare copy that nothing reads.
        with tf1.device(device), tf.name_scope("update_witness"):
            witnesses.append(tf.raw_ops.Assert(condition=new_step > 0, data=[new_step]))
    return witnesses


def _chief_queue_runner_that_never_closes(sync_optimizer, update_op) -> None:
    """Rebuilds the chief's queue runner so that it never closes a queue the cluster shares.

    The stock runner closes the token queue on the ps when the chief's session ends: when it
    closes at the end, but also when MonitoredSession re-creates it after a transient
    AbortedError or UnavailableError. Every other worker's token wait then ended in
    OutOfRangeError mid-run. This one closes nothing; closing the session cancels its pending
    update, and that CancelledError counts as a normal end, like a closed queue, instead of a
    traceback from its thread. With owned tokens it runs the update alone: the update fills
    every worker's queue itself. (Private attribute: the optimizer offers no public way to
    configure its runner.)
    """
    stock = sync_optimizer._chief_queue_runner  # pylint: disable=protected-access
    sync_optimizer._chief_queue_runner = tf1.train.QueueRunner(  # pylint: disable=protected-access
        stock.queue, stock.enqueue_ops if update_op is None else [update_op],
        close_op=tf.no_op(name="never_close_the_token_queue"),
        cancel_op=tf.no_op(name="never_cancel_the_token_queue"),
        queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError))


def train_loop(run_step: Callable[[int], int], *, start_step: int, planned: int, target: int,
               stop_on_token: bool, stopped: Callable[[int], bool] | None = None) -> int:
    """Runs one worker's steps until it is done; returns how many it ran.

    Args:
      run_step: run_step(step) pushes one gradient computed on batch `step` and returns the
        token it was handed. In sync mode `step` is this worker's local step: the global step
        its push is for.
      start_step: this worker's local step when it starts (the global step, or the token it
        took when it rejoined a running cluster).
      planned: local steps to run when stopping on the local count (async mode).
      target: the global step training ends at, when stopping on tokens.
      stop_on_token: stop once a token reaches `target` (sync mode) instead of after `planned`
        local steps (async mode, where every push is an update of its own).
      stopped: stopped(token), asked after each step, ends the loop early when True: the
        cluster reached --target-accuracy (early_stop.should_stop). None: never.
    """
    # Sync: the token a worker is handed is the global step after the update its push joined,
    # and becomes its local step. With R = N every local step joins exactly one update, so the
    # token after k steps is start + k + 1 and stopping on it is stopping on the local count:
    # nobody decides by reading global_step (a read in the same run as the train op may land
    # before or after the update, which is how the question's workers disagreed about when to
    # stop). Unlike a count, the token stays right when the ps is restored from a checkpoint
    # mid-run (it goes back) or a worker rejoins. With backups local counts differ by design;
    # the token is then the only stop signal. After the last update there is one token per
    # worker, and a worker takes only one. The batch follows the token too, so a worker trains
    # on the same batch for the same update however often it was restarted.
    local, token = 0, start_step
    while not ran_the_plan(local=local, token=token, planned=planned, target=target,
                           stop_on_token=stop_on_token):
        token = run_step(token if stop_on_token else start_step + local)
        local += 1
        if stopped is not None and stopped(token):
            break
    return local


def ran_the_plan(*, local: int, token: int, planned: int, target: int,
                 stop_on_token: bool) -> bool:
    """Whether a worker has run its planned length (train_loop's arguments): its token reached
    `target` (sync mode), or it ran `planned` local steps (async mode). An earlier stop is the
    target accuracy's (early_stop.should_stop)."""
    return token >= target if stop_on_token else local >= planned


def rejoin_needed(*, last_push: int, global_step: int, tokens_waiting: int) -> bool:
    """Whether a worker restarted into a running cluster must take a token before pushing.

    With R = N each worker holds exactly one token per update. A worker killed after pushing
    has either its gradient waiting for the update (its last push was for this global step)
    or, if the update came, its token left in the queue. Pushing again would put two of its
    gradients into one update; taking the token first resumes the lockstep exactly.

    Args:
      last_push: the local step of this worker's last push since the model was last
        initialised or restored on the ps (-1: none).
      global_step: the global step now.
      tokens_waiting: tokens in the queue; with R = N only a dead worker leaves one there.
    """
    return tokens_waiting > 0 or last_push == global_step
