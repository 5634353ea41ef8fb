"""One worker's life: join the cluster, train its shard in lockstep, verify, report done.

Lines that exist only because training is distributed and synchronous carry a `# Sync:` tag.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import tensorflow as tf

from sync_mnist import cluster as cluster_lib
from sync_mnist import data, membership, model, report, session, sync
from sync_mnist.config import START_SECS, TaskConfig
from sync_mnist.ps import TaskTimeout, done_queue

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

EVAL_BATCH = 1000  # test examples per evaluation run on the chief
_LOST_PS = (tf.errors.UnavailableError, tf.errors.AbortedError)


class _Graph(NamedTuple):
    images: tf.Tensor
    labels: tf.Tensor
    outputs: model.ModelOutputs
    state: sync.SharedState
    training: sync.SyncTraining
    members: membership.Membership  # Sync: published settings, last pushes, the finish barrier
    report_done: tf.Operation  # Sync: one entry in every ps's done-queue


def build_graph(config: TaskConfig, num_tokens: int = 0, dataset: str | None = None) -> _Graph:
    """This worker's graph: variables on the ps tasks, computation on this worker.

    num_tokens is 0 for the fixed setup; question.py passes -1, the stock default. `dataset`
    (the resolved name) is published by the chief and compared by the others.
    """
    n, i = config.cluster.num_workers, config.index
    # Sync: between-graph replication. Variables go round-robin onto the ps tasks; every other
    # op stays on this worker.
    setter = tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{i}",
                                             cluster=config.cluster.spec())
    with tf1.device(setter):
        state = sync.build_shared_state(n)  # Sync: first, so every task places it the same way
        images = tf1.placeholder(tf.float32, [None, model.IMAGE_PIXELS], name="images")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        outputs = model.build_model(images, labels)
    # Sync: outside the setter (explicitly on ps 0), so the ps, which builds no model, places
    # the counters exactly as the workers do.
    members = membership.build_membership(n, membership.settings(config, dataset))
    with tf1.device(setter):
        training = sync.build_train_op(
            outputs.loss, state, model.make_optimizer(config.train.optimizer,
                                                      config.train.learning_rate),
            worker_index=i, num_workers=n, replicas_to_aggregate=config.train.aggregate(n),
            is_chief=config.is_chief, mode=config.train.mode, num_tokens=num_tokens,
            last_push=members.last_push, proof=config.train.proof)
    report_done = tf.group(*[done_queue(p, n).enqueue(i)
                             for p in range(config.cluster.num_ps)])
    return _Graph(images, labels, outputs, state, training, members, report_done)


class SideSession:
    """A plain session for reads beside the training session, re-created after a lost ps.

    MonitoredSession re-creates its own session when a ps is lost; a plain one would keep
    failing against the restarted ps, so this one is re-created too: once per call, and only
    when every ps accepts connections again (creating a session waits without end for an
    absent ps). While the ps is still away, the error goes to the caller.
    """

    def __init__(self, target: str, graph: tf.Graph, config: tf1.ConfigProto,
                 ps_hosts: tuple[str, ...] = ()):
        self._args, self._ps_hosts = (target, graph, config), ps_hosts
        self._sess = tf1.Session(*self._args)

    def run(self, fetches, feed_dict=None, options=None):
        try:
            return self._sess.run(fetches, feed_dict, options=options)
        except _LOST_PS:
            if any(membership.probe(address) for address in self._ps_hosts):
                raise
            self.close()
            self._sess = tf1.Session(*self._args)
            return self._sess.run(fetches, feed_dict, options=options)

    def close(self) -> None:
        session.close_bounded(self._sess.close, self._sess)


def load_shard(config: TaskConfig, dataset: data.Dataset | None = None
               ) -> tuple[data.Dataset, data.Shard, int]:
    """The dataset, this worker's shard of it, and the steps to train: --train-steps, or
    --epochs passes over the shard."""
    train = config.train
    if dataset is None:
        dataset = data.load_dataset(train.dataset, train.data_dir, seed=train.seed)
    log.info("dataset %s", dataset.description)
    # Sync: a disjoint shard per worker, equal in length, so every worker runs as many batches.
    shard = data.Shard(dataset.train_images, dataset.train_labels, index=config.index,
                       num_workers=config.cluster.num_workers, batch_size=train.batch_size,
                       seed=train.seed)
    return dataset, shard, train.train_steps or train.epochs * shard.batches_per_epoch


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
    r = train.aggregate(n)
    timeout_ms = int(train.timeout * 1000)
    bounded = tf1.RunOptions(timeout_in_ms=timeout_ms)
    # Only the chief writes checkpoints and summaries; it checks where, before anything slow.
    logdir = train.logdir if train.logdir and config.is_chief else None
    if logdir:
        session.check_logdir(logdir)
    if server is None:
        cluster_lib.check_port_free(config.cluster.address("worker", i), config.name)
        server = tf.distribute.Server(config.cluster.spec(), job_name="worker", task_index=i,
                                      start=True)
    dataset, shard, target = load_shard(config, dataset)

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(train.seed)
        g = build_graph(config, dataset=dataset.name)
        if logdir:
            # A checkpoint of another model (say, of a cluster with another number of workers)
            # would fail mid-restore with a long error: name the variable instead.
            session.check_checkpoint(logdir, [v for v in tf1.global_variables()
                                              if all(v is not t for t in g.members.transient)])
    for p, address in enumerate(config.cluster.ps_hosts):
        cluster_lib.wait_reachable(address, f"ps {p}", train.timeout)
    result = report.TaskResult(role="worker", index=i, mode=train.mode, target_steps=target,
                               replicas_to_aggregate=r, dataset=dataset.name,
                               dataset_description=dataset.description)
    tf_config = session.session_config(config.cluster.device_filters("worker", i))
    # The writer CheckpointSaverHook also uses (one cache per logdir), so one events file.
    writer = tf1.summary.FileWriterCache.get(str(logdir)) if logdir else None
    chief_wait = START_SECS + train.timeout  # the chief may start after this worker
    mine = membership.settings(config, dataset.name)
    waiting_since = time.monotonic()
    if not config.is_chief:
        log.info("%s to initialise the model (polling every %g s, for at most %g s)",
                 report.WAITING_FOR_CHIEF, session.READY_POLL_SECS, chief_wait)
        # Sync: compare settings with the chief's as soon as it has published them, before
        # anything that a different cluster size or model would break.
        with graph.as_default():
            _check_published(SideSession(server.target, graph, tf_config), g.members, mine,
                             config.name, chief_wait,
                             f"worker 0 at {config.cluster.address('worker', 0)}")

    status = session.SessionStatus()
    with graph.as_default():
        try:
            monitored = session.monitored_session(
                server.target, is_chief=config.is_chief, hooks=g.training.hooks,
                config=tf_config, timeout=chief_wait,
                checkpoint_dir=str(logdir) if logdir else None, save_steps=train.save_steps,
                save_secs=train.save_secs, transient=g.members.transient,
                ps_hosts=config.cluster.ps_hosts, recovery_timeout=train.timeout,
                status=status)
        except tf.errors.DeadlineExceededError:
            raise TaskTimeout(f"worker {i}: waited {chief_wait:g} s for the chief (worker 0 "
                              f"at {config.cluster.address('worker', 0)}) to initialise the "
                              "model") from None
    side = SideSession(server.target, graph, tf_config, config.cluster.ps_hosts)
    with graph.as_default(), monitored as sess:
        result.ready_at = time.time()
        result.startup_s = time.monotonic() - started
        if not config.is_chief:
            result.chief_wait_s = time.monotonic() - waiting_since
        if status.model == "continued":
            # A chief restarted into a running cluster: the settings are its predecessor's.
            membership.check_agreement(mine, side.run(g.members.published, options=bounded),
                                       me=config.name, restarted_chief=True)
        start_step = int(side.run(g.state.global_step, options=bounded))
        how = {"restored": f"restored from the checkpoint in {logdir}",
               "continued": "the model was already on the ps",
               "initialised": "initialised"}.get(status.model)
        if train.mode == "sync" and r == n:
            # Sync: restarted into a running cluster, take the token the predecessor left (or
            # wait for the update its last gradient joined) instead of pushing twice.
            token = _rejoin(side, g, i, bounded, train.timeout)
            if token is not None:
                log.info("rejoined at global_step %d: my predecessor's last gradient was "
                         "already pushed; took its token %d without pushing again",
                         start_step, token)
                result.rejoined = True
                start_step = token
        result.start_step = start_step
        stop_on_token = train.mode == "sync"
        planned = target if train.mode == "async" else target - start_step
        log.info("ready after %.2f s; %s (global_step %d%s)", result.startup_s,
                 f"training until global_step {target}" if r < n else
                 f"{planned} local steps planned", start_step, f"; {how}" if how else "")
        progress = Progress(config, side, g.state, writer, target)
        steps_run = [0]

        def run_step(step: int) -> int:
            x, y = shard.batch(step)
            try:
                token, loss, accuracy = sess.run(
                    [g.training.train_op, g.outputs.loss, g.outputs.accuracy],
                    {g.images: x, g.labels: y}, options=bounded)
            except tf.errors.DeadlineExceededError:
                raise TaskTimeout(
                    f"worker {i}: waited {train.timeout:g} s for an update after local step "
                    f"{step}; {_stalled(side, g, config)}") from None
            if train.mode == "sync" and token != step + 1 and r == n:
                # Sync: the ps was lost and the chief restored it from the last checkpoint.
                log.warning("global_step went back from %d to %d: the ps was restored from "
                            "a checkpoint; training on from there", step + 1, token)
            steps_run[0] += 1
            progress.step(steps_run[0], loss, accuracy)
            return int(token)

        train_started = time.monotonic()
        local = sync.train_loop(run_step, start_step=start_step, planned=planned,
                                target=target, stop_on_token=stop_on_token)
        result.finished_at = time.time()
        result.local_steps = local
        result.train_s = time.monotonic() - train_started
        result.examples_per_sec = train.batch_size * local / max(result.train_s, 1e-9)
        result.sessions = status.sessions

        # Sync: wait until every worker has pushed its last gradient (or is lost), so that
        # every task reads the same, final counters and so reaches the same verdict.
        lost = membership.finish_barrier(
            lambda fetches, feed=None: side.run(fetches, feed, options=bounded), g.members,
            index=i, cluster=config.cluster, timeout=train.timeout, log=log)
        counters = sync.Counters.read(side, g.state, options=bounded)
        verdict = sync.verify(counters, mode=train.mode, target_steps=target,
                              replicas_to_aggregate=r, lost=lost) if train.proof else \
            sync.Verdict(None, None, "not verified: --bench-no-proof left the counters out")
        result.global_step = counters.global_step
        result.contributions, result.pushed = counters.accepted, counters.pushed
        result.dropped = counters.unused
        result.solo_updates = counters.solo_updates
        result.lost = lost
        result.synchronous, result.verdict = verdict.synchronous, verdict.line
        if config.is_chief:
            result.test_accuracy = evaluate(side, g, dataset, bounded)
            log.info("test_accuracy=%.4f on %d test examples of %s", result.test_accuracy,
                     len(dataset.test_labels), dataset.name)
            if writer:
                _write_summaries(writer, counters, test_accuracy=result.test_accuracy)
    side.close()
    if writer:
        tf1.summary.FileWriterCache.clear()  # closes, so the events file ends complete
    # Sync: only now may the ps tasks exit: the chief has read everything it needs from them.
    with graph.as_default(), tf1.Session(server.target, config=tf_config) as done:
        done.run(g.report_done, options=bounded)
    log.info("verdict: %s", verdict.line)
    return result


def _check_published(side: SideSession, members: membership.Membership, mine: dict,
                     me: str, wait: float, chief: str) -> None:
    """Waits (bounded) for the chief's published settings and compares them with `mine`.

    Raises ConfigError on a difference, TaskTimeout if nothing is published within `wait`.
    """
    deadline = time.monotonic() + wait
    poll = tf1.RunOptions(timeout_in_ms=5000)
    try:
        while not side.run(members.published_ready, options=poll):
            if time.monotonic() > deadline:
                raise TaskTimeout(f"{me}: waited {wait:g} s for the chief ({chief}) to "
                                  "initialise the model")
            time.sleep(session.READY_POLL_SECS)
        published = side.run(members.published, options=poll)
    except tf.errors.OpError:
        return  # the session creation that follows waits for the ps and reports it
    finally:
        side.close()
    membership.check_agreement(mine, published, me=me, restarted_chief=False)


def _rejoin(side: SideSession, g: _Graph, index: int, options,
            timeout: float) -> int | None:
    """With R = N: takes a token without pushing if this worker's predecessor left one.

    Returns the token taken, or None when this worker should simply push. The reading is
    repeated until two in a row agree, so that it does not fall inside an update (between its
    global_step increment and its tokens).
    """
    fetches = [g.state.global_step, g.members.last_push, g.training.tokens_waiting]
    reading, previous = None, object()
    for _ in range(50):
        step, last_push, waiting = side.run(fetches, options=options)
        reading = (int(step), int(last_push[index]), int(waiting))
        if reading == previous:
            break
        previous = reading
        time.sleep(0.1)
    step, last_push, waiting = reading
    if not sync.rejoin_needed(last_push=last_push, global_step=step, tokens_waiting=waiting):
        return None
    try:
        return int(side.run(g.training.rejoin, options=options))
    except tf.errors.DeadlineExceededError:
        raise TaskTimeout(f"worker {index}: rejoining at global_step {step}, waited "
                          f"{timeout:g} s for the update my predecessor's last gradient "
                          "joined") from None


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
        try:
            counters = sync.Counters.read(self._side, self._state,
                                          options=tf1.RunOptions(timeout_in_ms=5000))
        except tf.errors.OpError:  # the ps is being restarted: the next line will have them
            log.info("step=%d loss=%.4f accuracy=%.3f examples_per_sec=%.0f (counters "
                     "unreadable: the ps is away)", local, loss, accuracy, rate)
            return
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


def _stalled(side: SideSession, g: _Graph, config: TaskConfig) -> str:
    """What a worker waiting for an update can say: the contributions, and who is missing."""
    # Probe first: against a ps this worker cannot reach, a fetch TensorFlow has not run before
    # in this session blocks while it registers the graph, past any timeout_in_ms.
    down = [f"ps {p} ({why})" for p, address in enumerate(config.cluster.ps_hosts)
            if (why := membership.probe(address))]
    if down:
        return f"the ps is unreachable: {', '.join(down)}"
    try:
        step, last_push, accepted = side.run(
            [g.state.global_step, g.members.last_push, g.state.accepted],
            options=tf1.RunOptions(timeout_in_ms=5000))
    except tf.errors.OpError:
        return "the ps is reachable but its counters cannot be read"
    return (f"contributions so far {[int(a) for a in accepted]}; missing: "
            f"{membership.missing([int(s) for s in last_push], int(step), config.cluster)}")


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
