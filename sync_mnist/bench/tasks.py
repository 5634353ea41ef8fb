"""The benchmark's own task processes: the transport floor, a single process, and TF2's
MultiWorkerMirroredStrategy. `sync-mnist-bench` (bench.py) starts them; nobody else does.

    python -m sync_mnist.bench.tasks floor-ps     --index 0 --ps-hosts ... --worker-hosts ...
    python -m sync_mnist.bench.tasks floor-worker --index I ...
    python -m sync_mnist.bench.tasks single ...
    python -m sync_mnist.bench.tasks mwms --index I --worker-hosts ...   (TF2, eager + tf.function)
    python -m sync_mnist.bench.tasks mwms --model ctr ...   (the same, the sparse ctr model)

Each worker logs `ready` once it is about to step, then `step=K global_step=G` every
--log-every steps, as the real workers do; bench.py times its window on those lines. The PS
rows themselves run the real `python -m sync_mnist` tasks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

log = logging.getLogger("sync_mnist.bench.tasks")

READY = "ready to step"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sync_mnist.bench.tasks")
    p.add_argument("role", choices=("floor-ps", "floor-worker", "single", "mwms"))
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--ps-hosts", default="")
    p.add_argument("--worker-hosts", default="")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=0.001)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packed", action="store_true",
                   help="floor-worker: move the model as one tensor each way, not 6")
    p.add_argument("--model", choices=("mlp", "ctr"), default="mlp",
                   help="mwms: the question's MLP (Adam) or the sparse ctr model (Adagrad)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [{args.role} {args.index}] %(message)s",
                        datefmt="%H:%M:%S")
    ps_hosts = [h for h in args.ps_hosts.split(",") if h]
    worker_hosts = [h for h in args.worker_hosts.split(",") if h]
    from sync_mnist.core import tfcompat

    if args.role == "mwms" and args.model == "ctr":
        run_mwms_ctr(args, worker_hosts)
    elif args.role == "mwms":
        run_mwms(args, worker_hosts)
    else:
        tfcompat.graph_mode(verbose=False)
        if args.role == "floor-ps":
            run_floor_ps(ps_hosts, worker_hosts)
        elif args.role == "floor-worker":
            run_floor_worker(args, ps_hosts, worker_hosts)
        else:
            run_single(args)
    tfcompat.remove_autograph_files()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the gRPC server has no clean shutdown: leave without its destructor


def _shard(args, num_workers: int):
    from sync_mnist.core.shard import Shard
    from sync_mnist.models import data

    dataset = data.make_synthetic(args.seed)
    return Shard(dataset.train_images, dataset.train_labels, index=args.index,
                      num_workers=num_workers, batch_size=args.batch_size, seed=args.seed)


def _model_shapes() -> list[list[int]]:
    from sync_mnist.models import mlp

    return mlp.variable_shapes()


def _step_line(step: int, global_step: int) -> None:
    log.info("step=%d global_step=%d", step, global_step)


def run_floor_ps(ps_hosts, worker_hosts) -> None:
    """A ps that only serves variables; bench.py kills it when the workers are done."""
    from sync_mnist.core.cluster import ClusterLayout

    ClusterLayout(tuple(ps_hosts), tuple(worker_hosts)).server("ps", 0)
    log.info("serving")
    while True:
        time.sleep(3600)


def run_floor_worker(args, ps_hosts, worker_hosts) -> None:
    """Moves a model's worth of bytes each way per step, and nothing else.

    Each step pulls a copy of the model's weights (same shapes as model.py's) from the ps to
    this worker, scales it there (a trivial op, so the bytes must arrive), and assigns the
    result to a gradient-sized buffer on the ps: the bytes of a pull and a push, no training.
    Each worker has variables of its own, so the workers need not coordinate.
    """
    import tensorflow as tf

    from sync_mnist.core.cluster import ClusterLayout

    tf1 = tf.compat.v1
    server = ClusterLayout(tuple(ps_hosts), tuple(worker_hosts)).server("worker", args.index)
    graph = tf.Graph()
    with graph.as_default():
        with tf1.device("/job:ps/task:0"):
            weights = [tf1.get_variable(f"floor{args.index}/w{k}", s)
                       for k, s in enumerate(_model_shapes())]
            buffers = [tf1.get_variable(f"floor{args.index}/g{k}", s, trainable=False)
                       for k, s in enumerate(_model_shapes())]
        with tf1.device("/job:ps/task:0"):
            sources = [tf.concat([tf.reshape(w, [-1]) for w in weights], 0)] if args.packed \
                else weights
        with tf1.device(f"/job:worker/task:{args.index}"):
            scale = tf1.placeholder(tf.float32, [], name="scale")
            pulled = [w * scale for w in sources]
        with tf1.device("/job:ps/task:0"):
            if args.packed:
                sizes = [b.shape.num_elements() for b in buffers]
                pulled = [tf.reshape(part, b.shape)
                          for part, b in zip(tf.split(pulled[0], sizes), buffers)]
            push = tf.group(*[tf1.assign(b, g) for b, g in zip(buffers, pulled)])
        init = tf1.variables_initializer(weights + buffers)
    config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{args.index}"])
    with tf1.Session(server.target, graph=graph, config=config) as sess:
        sess.run(init)
        sess.run(push, {scale: 1.0})  # registers the graph: not part of the timing
        log.info(READY)
        for step in range(1, args.steps + 1):
            sess.run(push, {scale: 1.0})
            if step % args.log_every == 0:
                _step_line(step, step)


def run_single(args) -> None:
    """The same model, optimizer, batch and input path (feed_dict) in one plain process."""
    import tensorflow as tf

    from sync_mnist import api
    from sync_mnist.core import optimizers
    from sync_mnist.core.cluster import server_config
    from sync_mnist.models import mlp, mnist

    tf1 = tf.compat.v1
    shard = _shard(args, 1)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(args.seed)
        global_step = tf1.train.get_or_create_global_step()
        images = tf1.placeholder(tf.uint8, [None, mnist.IMAGE_PIXELS], name="images")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        spec = mlp.model_fn(images, labels, api.ModeKeys.TRAIN, mlp.MODEL.params)
        train_op = optimizers.make_optimizer("adam", args.learning_rate).minimize(
            spec.loss, global_step)
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph, config=server_config()) as sess:
        sess.run(init)
        log.info(READY)
        for step in range(1, args.steps + 1):
            x, y = shard.batch(step - 1)
            sess.run([train_op, spec.loss, spec.train_metrics], {images: x, labels: y})
            if step % args.log_every == 0:
                _step_line(step, step)


def _mwms_strategy(args, worker_hosts):
    """MultiWorkerMirroredStrategy over `worker_hosts`, RING all-reduce, this task's pools."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": worker_hosts},
                                          "task": {"type": "worker", "index": args.index}})
    import tensorflow as tf
    from tensorflow.python.eager import context

    from sync_mnist.core.cluster import server_config

    # The same pools as the PS tasks' (cluster.server_config). No public API sets them for
    # eager: tf.compat.v1.enable_eager_execution(config=...) leaves them as they were. The
    # strategy's server takes its default session config from this context's.
    context.context()._config = server_config()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def run_mwms(args, worker_hosts) -> None:
    """TF2 MultiWorkerMirroredStrategy on CPU: RING all-reduce over gRPC, no Keras.

    A custom loop under tf.function: variables created in the strategy's scope with
    aggregation=ONLY_FIRST_REPLICA, gradients all-reduced (mean) through the replica context,
    Adam applied by hand with tf.compat.v1.train.AdamOptimizer's arithmetic. The batch comes
    in as an argument each step, as the PS workers feed theirs.
    """
    import tensorflow as tf

    from sync_mnist.models import data

    strategy = _mwms_strategy(args, worker_hosts)
    shard = _shard(args, len(worker_hosts))
    train_step = _mlp_train_step(strategy, _mlp_variables(strategy, args.seed),
                                 args.learning_rate)
    x, y = shard.batch(0)
    train_step(tf.constant(data.to_float(x)), tf.constant(y))  # traces and joins the collective: not timed
    log.info(READY)
    for step in range(1, args.steps + 1):
        x, y = shard.batch(step)
        loss, accuracy = train_step(data.to_float(x), y)
        loss, accuracy = loss.numpy(), accuracy.numpy()  # as sess.run hands back its fetches
        if step % args.log_every == 0:
            _step_line(step, step)


def _mlp_variables(strategy, seed: int):
    """(params, Adam's first and second moments, its step count t), in the strategy's scope,
    initialised as the MLP's (glorot_uniform weights, zero biases) from `seed`."""
    import tensorflow as tf

    first = tf.VariableAggregation.ONLY_FIRST_REPLICA
    tf.random.set_seed(seed)
    with strategy.scope():
        params, slots_m, slots_v = [], [], []
        for shape in _model_shapes():
            if len(shape) == 2:
                limit = (6.0 / (shape[0] + shape[1])) ** 0.5
                value = tf.random.uniform(shape, -limit, limit, seed=seed)
            else:
                value = tf.zeros(shape)
            params.append(tf.Variable(value, aggregation=first))
            slots_m.append(tf.Variable(tf.zeros(shape), aggregation=first))
            slots_v.append(tf.Variable(tf.zeros(shape), aggregation=first))
        t = tf.Variable(0.0, aggregation=first)
    return params, slots_m, slots_v, t


def _mlp_train_step(strategy, variables, lr: float):
    """The MLP's step under `strategy` (a tf.function of the batch): forward, gradients
    all-reduced (mean), Adam by hand; returns (loss, accuracy)."""
    import tensorflow as tf

    params, slots_m, slots_v, t = variables
    beta1, beta2, eps = 0.9, 0.999, 1e-8

    def forward(x, y):
        h = x
        for k in range(0, len(params), 2):
            h = tf.matmul(h, params[k]) + params[k + 1]
            if k < len(params) - 2:
                h = tf.nn.relu(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(h, axis=1), y), tf.float32))
        return loss, accuracy

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss, accuracy = forward(x, y)
        grads = tape.gradient(loss, params)
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        step = t.assign_add(1.0)
        lr_t = lr * tf.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step)
        for p, m, v, g in zip(params, slots_m, slots_v, grads):
            m_new = m.assign(beta1 * m + (1.0 - beta1) * g)
            v_new = v.assign(beta2 * v + (1.0 - beta2) * tf.square(g))
            p.assign_sub(lr_t * m_new / (tf.sqrt(v_new) + eps))
        return loss, accuracy

    @tf.function
    def train_step(x, y):
        return strategy.run(replica_step, args=(x, y))

    return train_step


def run_mwms_ctr(args, worker_hosts) -> None:
    """The ctr model (models/ctr.py) under MultiWorkerMirroredStrategy: every worker holds the
    whole table and its Adagrad accumulator, looks its batch's rows up locally, and the
    gradients are all-reduced (mean) through the replica context. The table's gradient is
    IndexedSlices, which TensorFlow's collective all-reduce all-gathers (values and indices
    from every worker, padded to the longest: cross_device_utils.all_reduce_indexed_slices);
    the dense layers' gradients are all-reduced. Same data and shards (ctr.generate from
    --seed), batch, table shape, hashing, MLP and initializers as `--model ctr`, and Adagrad
    through the kernels tf.compat.v1.train.AdagradOptimizer runs: duplicate rows summed first
    (its _apply_sparse_duplicate_indices: the gathered rows of two workers may coincide), then
    ResourceSparseApplyAdagrad on the table, ResourceApplyAdagrad on the dense layers.

    The step reads and updates this worker's own copy of each variable (the strategy's local
    component, strategy.experimental_local_results), which it may: every worker applies the
    same all-reduced gradient to identical copies. Not the MirroredVariable itself: in
    TensorFlow 2.21 `tf.gather` and `tf.nn.embedding_lookup` of a MirroredVariable read the
    whole variable (ReadVariableOp, 64 MB, then GatherV2) in every step, which cost this step
    about 6 ms more at 1 worker (docs/sparse.md); the local component's is a ResourceGather of
    the rows.

    After the last step worker 0 logs the log-loss on the evaluation clicks (ctr.eval_input_fn's
    50,000) beside the planted model's, as the PS chief's evaluation does.
    """
    import tensorflow as tf

    from sync_mnist.core.shard import Shard
    from sync_mnist.models import ctr

    strategy = _mwms_strategy(args, worker_hosts)
    params = {**ctr.PARAMS, "seed": args.seed}  # the seed as model_params sets it
    features, labels = ctr.train_input_fn(params)
    shard = Shard({ctr.IDS: features[ctr.IDS]}, labels, index=args.index,
                       num_workers=len(worker_hosts), batch_size=args.batch_size,
                       seed=args.seed)
    del features, labels  # only the shard is kept, as the PS workers do
    variables = _ctr_variables(strategy, params, args.seed)
    train_step, logits_of = _ctr_train_step(strategy, variables, params)
    x, y = shard.batch(0)
    train_step(tf.constant(x[ctr.IDS]), tf.constant(y))  # traces, joins the collective: untimed
    log.info(READY)
    for step in range(1, args.steps + 1):
        x, y = shard.batch(step)
        train_step(x[ctr.IDS], y).numpy()  # as sess.run hands back its fetch
        if step % args.log_every == 0:
            _step_line(step, step)
    if args.index == 0:
        _log_ctr_log_loss(tf.function(logits_of), params)


def _ctr_variables(strategy, params: dict, seed: int):
    """(table, its accumulator, dense layers, their accumulators): this worker's own copy of
    each (the strategy's local component; one device per worker, so one), created in the
    strategy's scope with the ctr model's shapes and initializers from `seed`."""
    import tensorflow as tf

    rows, fields, dimension = params["rows"], params["fields"], params["dimension"]
    first = tf.VariableAggregation.ONLY_FIRST_REPLICA
    tf.random.set_seed(seed)

    def variable(value):
        return tf.Variable(value, aggregation=first)

    with strategy.scope():
        table = variable(lambda: tf.random.truncated_normal([rows, dimension], stddev=0.05,
                                                            seed=seed))
        shapes, units = [], fields * dimension
        for width in [*params["hidden_units"], 1]:
            shapes += [[units, width], [width]]
            units = width
        dense = []
        for shape in shapes:
            if len(shape) == 2:
                limit = (6.0 / (shape[0] + shape[1])) ** 0.5  # glorot_uniform, as ctr._dense
                dense.append(variable(tf.random.uniform(shape, -limit, limit, seed=seed)))
            else:
                dense.append(variable(tf.zeros(shape)))
        initial = params["initial_accumulator"]
        table_accumulator = variable(lambda: tf.fill([rows, dimension], initial))
        dense_accumulators = [variable(tf.fill(shape, initial)) for shape in shapes]

    def local(v):
        return strategy.experimental_local_results(v)[0]

    return (local(table), local(table_accumulator), [local(v) for v in dense],
            [local(v) for v in dense_accumulators])


def _ctr_train_step(strategy, variables, params: dict):
    """(the ctr model's step under `strategy`, a tf.function of (ids, labels) returning the
    loss; logits_of, ids -> logits on this worker's copies). Gradients all-reduced (mean),
    duplicate rows summed, then Adagrad's kernels."""
    import tensorflow as tf

    from sync_mnist.models import ctr

    table, table_accumulator, dense, dense_accumulators = variables
    rows, fields, dimension = params["rows"], params["fields"], params["dimension"]
    lr = params["learning_rate"]

    def logits_of(ids):
        distinct, position = tf.unique(tf.reshape(ctr.hashed_rows(ids, rows), [-1]))
        vectors = tf.gather(table, distinct)  # this worker's own copy of the table
        x = tf.reshape(tf.gather(vectors, position), [-1, fields * dimension])
        for k in range(0, len(dense), 2):
            x = tf.matmul(x, dense[k]) + dense[k + 1]
            if k < len(dense) - 2:
                x = tf.nn.relu(x)
        return tf.squeeze(x, axis=1)

    def replica_step(ids, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=y, logits=logits_of(ids)))
        grads = tape.gradient(loss, [table, *dense])
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        sparse = grads[0]  # IndexedSlices: every worker's touched rows, all-gathered
        unique, position = tf.unique(sparse.indices)
        summed = tf.math.unsorted_segment_sum(sparse.values, position, tf.size(unique))
        tf.raw_ops.ResourceSparseApplyAdagrad(
            var=table.handle, accum=table_accumulator.handle, lr=tf.constant(lr),
            grad=summed, indices=unique, use_locking=False)
        for v, a, g in zip(dense, dense_accumulators, grads[1:]):
            tf.raw_ops.ResourceApplyAdagrad(var=v.handle, accum=a.handle, lr=tf.constant(lr),
                                            grad=g, use_locking=False)
        return loss

    @tf.function
    def train_step(ids, y):
        return strategy.run(replica_step, args=(ids, y))

    return train_step, logits_of


def _log_ctr_log_loss(logits_of, params: dict, chunk: int = 10_000) -> None:
    """Logs the log-loss of `logits_of` (ids -> logits) on the ctr model's evaluation clicks
    (ctr.eval_input_fn's), beside the planted model's, as the PS chief's evaluation does."""
    import numpy as np
    import tensorflow as tf

    from sync_mnist.models import ctr

    clicks = ctr.generate(params, params["eval_examples"], part=1)
    logits = np.concatenate([logits_of(tf.constant(clicks.ids[k:k + chunk])).numpy()
                             for k in range(0, len(clicks.labels), chunk)])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=clicks.labels, logits=logits)).numpy()
    log.info("log_loss=%.4f planted_log_loss=%.4f on %d evaluation examples", loss,
             clicks.planted_log_loss(), len(clicks.labels))


if __name__ == "__main__":
    sys.exit(main())
