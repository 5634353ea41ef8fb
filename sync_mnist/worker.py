"""One worker's life: join the cluster, train its shard in lockstep, verify, report done.

Lines that exist only because training is distributed and synchronous carry a `# Sync:` tag.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import tensorflow as tf

from sync_mnist import cluster as cluster_lib
from sync_mnist import data, model, report, session, sync
from sync_mnist.config import TaskConfig
from sync_mnist.ps import TaskTimeout, done_queue, finished_queue

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

EVAL_BATCH = 1000  # test examples per evaluation run on the chief


class _Graph(NamedTuple):
    images: tf.Tensor
    labels: tf.Tensor
    outputs: model.ModelOutputs
    state: sync.SharedState
    training: sync.SyncTraining
    finish: tf.Operation  # Sync: enter the finish barrier
    finished_count: tf.Tensor  # Sync: workers in the barrier so far
    report_done: tf.Operation  # Sync: one entry in every ps's done-queue


def build_graph(config: TaskConfig, num_tokens: int = 0) -> _Graph:
    """This worker's graph: variables on the ps tasks, computation on this worker.

    num_tokens is 0 for the fixed setup; question.py passes -1, the stock default.
    """
    n, i = config.cluster.num_workers, config.index
    # Sync: between-graph replication. Variables go round-robin onto the ps tasks; every other
    # op stays on this worker.
    with tf1.device(tf1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{i}", cluster=config.cluster.spec())):
        state = sync.build_shared_state(n)  # Sync: first, so every task places it the same way
        images = tf1.placeholder(tf.float32, [None, model.IMAGE_PIXELS], name="images")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        outputs = model.build_model(images, labels)
        training = sync.build_train_op(
            outputs.loss, state, model.make_optimizer(config.train.optimizer,
                                                      config.train.learning_rate),
            worker_index=i, num_workers=n, replicas_to_aggregate=config.train.aggregate(n),
            is_chief=config.is_chief, mode=config.train.mode, num_tokens=num_tokens)
    barrier = finished_queue(n)
    report_done = tf.group(*[done_queue(p, n).enqueue(i)
                             for p in range(config.cluster.num_ps)])
    return _Graph(images, labels, outputs, state, training, barrier.enqueue(i), barrier.size(),
                  report_done)


def run_worker(config: TaskConfig, *, dataset: data.Dataset | None = None,
               server=None) -> report.TaskResult:
    """Trains this worker's shard to the end and returns its result record.

    Args:
      config: the task and training configuration.
      dataset: data to train on; loaded from config.train when None (tests pass their own).
      server: an already started tf.distribute.Server for this task (tests); started if None.
    """
    started = time.monotonic()
    train, n, i = config.train, config.cluster.num_workers, config.index
    timeout_ms = int(train.timeout * 1000)
    bounded = tf1.RunOptions(timeout_in_ms=timeout_ms)
    if server is None:
        cluster_lib.check_port_free(config.cluster.address("worker", i), config.name)
        server = tf.distribute.Server(config.cluster.spec(), job_name="worker", task_index=i,
                                      start=True)
    if dataset is None:
        dataset = data.load_dataset(train.dataset, train.data_dir, seed=train.seed)
    log.info("dataset %s", dataset.description)
    # Sync: a disjoint shard per worker, equal in length, so every worker runs as many batches.
    shard = data.Shard(dataset.train_images, dataset.train_labels, index=i, num_workers=n,
                       batch_size=train.batch_size, seed=train.seed)
    target = train.train_steps or train.epochs * shard.batches_per_epoch
    for p, address in enumerate(config.cluster.ps_hosts):
        cluster_lib.wait_reachable(address, f"ps {p}", train.timeout)

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(train.seed)
        g = build_graph(config)
    result = report.TaskResult(role="worker", index=i, mode=train.mode, target_steps=target,
                               replicas_to_aggregate=train.aggregate(n), dataset=dataset.name,
                               dataset_description=dataset.description)
    tf_config = session.session_config(config.cluster.device_filters("worker", i))
    logdir = str(train.logdir) if train.logdir and config.is_chief else None
    writer = tf1.summary.FileWriter(logdir, graph) if logdir else None
    if not config.is_chief:
        log.info("%s to initialise the model (polling every %g s, for at most %g s)",
                 report.WAITING_FOR_CHIEF, session.READY_POLL_SECS, train.timeout)

    with graph.as_default():
        try:
            monitored = session.monitored_session(
                server.target, is_chief=config.is_chief, hooks=g.training.hooks,
                config=tf_config, timeout=train.timeout, checkpoint_dir=logdir,
                save_steps=train.save_steps)
        except tf.errors.DeadlineExceededError:
            raise TaskTimeout(f"worker {i}: waited {train.timeout:g} s for the chief (worker 0 "
                              f"at {config.cluster.address('worker', 0)}) to initialise the "
                              "model") from None
    with graph.as_default(), monitored as sess, \
            tf1.Session(server.target, graph=graph, config=tf_config) as side:
        result.ready_at = time.time()
        result.startup_s = time.monotonic() - started
        start_step = int(side.run(g.state.global_step, options=bounded))
        stop_on_token = train.mode == "sync" and train.aggregate(n) < n
        planned = target if train.mode == "async" else target - start_step
        log.info("ready after %.2f s; %s (global_step %d)", result.startup_s,
                 f"training until global_step {target}" if stop_on_token else
                 f"{planned} local steps planned", start_step)
        progress = Progress(config, side, g.state, writer, target)

        def run_step(local: int) -> int:
            x, y = shard.batch(start_step + local)
            try:
                token, loss, accuracy = sess.run(
                    [g.training.train_op, g.outputs.loss, g.outputs.accuracy],
                    {g.images: x, g.labels: y}, options=bounded)
            except tf.errors.DeadlineExceededError:
                raise TaskTimeout(
                    f"worker {i}: waited {train.timeout:g} s for an update after local step "
                    f"{local}; contributions so far {contributions_so_far(side, g.state)}") from None
            progress.step(local + 1, loss, accuracy)
            return int(token)

        train_started = time.monotonic()
        local = sync.train_loop(run_step, start_step=start_step, planned=planned,
                                target=target, stop_on_token=stop_on_token)
        result.finished_at = time.time()
        result.local_steps = local
        result.train_s = time.monotonic() - train_started
        result.examples_per_sec = train.batch_size * local / max(result.train_s, 1e-9)

        # Sync: wait until every worker has pushed its last gradient, so that every task reads
        # the same, final counters and so reaches the same verdict.
        side.run(g.finish, options=bounded)
        _wait_for(side, g.finished_count, n, train.timeout,
                  f"worker {i}: waited {train.timeout:g} s for the other workers to finish")
        counters = sync.Counters.read(side, g.state, options=bounded)
        verdict = sync.verify(counters, mode=train.mode, target_steps=target,
                              replicas_to_aggregate=train.aggregate(n))
        result.global_step = counters.global_step
        result.contributions, result.pushed = counters.accepted, counters.pushed
        result.dropped = counters.unused
        result.solo_updates = counters.solo_updates
        result.synchronous, result.verdict = verdict.synchronous, verdict.line
        if config.is_chief:
            result.test_accuracy = evaluate(side, g, dataset, bounded)
            log.info("test_accuracy=%.4f on %d test examples of %s", result.test_accuracy,
                     len(dataset.test_labels), dataset.name)
            if writer:
                _write_summaries(writer, counters, test_accuracy=result.test_accuracy)
    if writer:
        writer.close()
    # Sync: only now may the ps tasks exit: the chief has read everything it needs from them.
    with graph.as_default(), tf1.Session(server.target, config=tf_config) as side:
        side.run(g.report_done, options=bounded)
    log.info("verdict: %s", verdict.line)
    return result


class Progress:
    """One key=value line every --log-every local steps; the chief also writes summaries."""

    def __init__(self, config: TaskConfig, side, state: sync.SharedState, writer, target: int):
        self._config, self._side, self._state = config, side, state
        self._writer, self._target = writer, target
        self._since, self._last_logged = time.monotonic(), 0

    def step(self, local: int, loss: float, accuracy: float) -> None:
        train = self._config.train
        if local % train.log_every:
            return
        now = time.monotonic()
        rate = train.batch_size * (local - self._last_logged) / max(now - self._since, 1e-9)
        self._since, self._last_logged = now, local
        counters = sync.Counters.read(self._side, self._state,
                                      options=tf1.RunOptions(timeout_in_ms=5000))
        log.info("step=%d global_step=%d/%d loss=%.4f accuracy=%.3f examples_per_sec=%.0f "
                 "contributions=%s", local, counters.global_step, self._target, loss, accuracy,
                 rate, counters.accepted)
        if self._writer:
            _write_summaries(self._writer, counters, loss=loss, accuracy=accuracy,
                             examples_per_sec=rate)


def contributions_so_far(side, state: sync.SharedState) -> str:
    try:
        return str(sync.Counters.read(side, state,
                                      options=tf1.RunOptions(timeout_in_ms=5000)).accepted)
    except tf.errors.OpError:
        return "unreadable (the ps is unreachable)"


def _wait_for(side, size: tf.Tensor, expected: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        seen = int(side.run(size, options=tf1.RunOptions(timeout_in_ms=5000)))
        if seen >= expected:
            return
        time.sleep(0.05)
    raise TaskTimeout(f"{what}; {seen} of {expected} finished")


def evaluate(side, g: _Graph, dataset: data.Dataset, options) -> float:
    correct = 0.0
    for start in range(0, len(dataset.test_labels), EVAL_BATCH):
        x = dataset.test_images[start:start + EVAL_BATCH]
        y = dataset.test_labels[start:start + EVAL_BATCH]
        correct += side.run(g.outputs.accuracy, {g.images: x, g.labels: y},
                            options=options) * len(y)
    return float(correct / len(dataset.test_labels))


def _write_summaries(writer, counters: sync.Counters, **scalars) -> None:
    values = [tf1.Summary.Value(tag=name, simple_value=float(v))
              for name, v in scalars.items() if v is not None]
    for w, (pushed, accepted) in enumerate(zip(counters.pushed, counters.accepted)):
        values.append(tf1.Summary.Value(tag=f"sync/accepted/worker{w}", simple_value=accepted))
        values.append(tf1.Summary.Value(tag=f"sync/unused/worker{w}",
                                        simple_value=pushed - accepted))
    values.append(tf1.Summary.Value(tag="sync/repeat_updates",
                                    simple_value=counters.repeat_updates))
    writer.add_summary(tf1.Summary(value=values), counters.global_step)
    writer.flush()

