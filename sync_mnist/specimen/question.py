"""A specimen: the question's original design, replayed with counters (`--setup question`).

Nothing else in the package depends on this module. It runs the same cluster, model, data and
SyncReplicasOptimizer as the fixed design, but the way the question wired them:

  * tf.compat.v1.train.Supervisor and prepare_or_wait_for_session, with Supervisor's default
    30 s readiness poll for the non-chief workers;
  * get_init_tokens_op() with its default of R preloaded tokens, and the chief queue runner
    started by hand;
  * each worker loops over its own epochs and stops without coordination;
  * the ps calls server.join(), which never returns.

The only additions are what makes the outcome visible and bounded: the same ps-side counters,
a --timeout on every step (so a worker blocked on the token queue is released and says so),
a bound on the readiness wait, every task's start-up comparison of its settings with the
chief's, and with --logdir the chief's summaries of the counters. The launcher stops the ps,
which never stops by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple

import tensorflow as tf

from sync_mnist import api
from sync_mnist.core.shard import Shard
from sync_mnist.models import registry
from sync_mnist.task import evaluation, ps, report
from sync_mnist.core import membership, sessions
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.config import START_SECS, TaskConfig
from sync_mnist.task.progress_log import Progress, contributions_so_far, write_summaries
from sync_mnist.task.graph import build_graph
from sync_mnist.task.inputs import data_name, input_data, load_shard, model_params

tf1 = tf.compat.v1
log = logging.getLogger(__name__)

STOP_GRACE_SECS = 1  # Supervisor.stop's wait for the queue runner; not part of the bug


def run_question_ps(config: TaskConfig, *, server=None) -> None:
    """The question's ps: serve forever, as server.join() does. Ends only when stopped."""
    if server is None:
        server = ps.start_server(config)
    log.info("serving %s with server.join(), as the question did: this never returns",
             config.cluster.address("ps", config.index))
    # server.join() blocks in C++, where Python's signal handlers cannot run; join in a thread
    # so that SIGTERM/Ctrl-C still stop the process.
    threading.Thread(target=server.join, daemon=True).start()
    _check_settings(config, server)
    while True:
        time.sleep(3600)


def _check_settings(config: TaskConfig, server) -> None:
    """Not in the question: the start-up check of the fixed setup's ps, so that a ps started
    with other settings than the chief's (say, in a fixed cluster) exits 2 instead of serving
    forever. Raises ConfigError on a difference; gives up checking, not serving, if no chief
    has published within the start-up allowance and --timeout."""
    mine = membership.settings(config)
    graph = tf.Graph()
    with graph.as_default():
        members = membership.build_membership(config.cluster.num_workers, mine)
    poll = tf1.RunOptions(timeout_in_ms=int(ps.POLL_SECS * 1000))
    wait = START_SECS + config.train.timeout
    deadline = time.monotonic() + wait
    with tf1.Session(server.target, graph=graph,
                     config=sessions.session_config(["/job:ps"])) as sess:
        while time.monotonic() < deadline:
            try:
                if sess.run(members.published_ready, options=poll):
                    published = sess.run(members.published, options=poll)
                    break
            except tf.errors.OpError:
                pass  # ps 0 is not up yet
            time.sleep(sessions.READY_POLL_SECS)
        else:
            log.warning("no chief published its settings within %g s; serving on unchecked",
                        wait)
            return
    membership.check_agreement(mine, published, me=config.name, restarted_chief=False)


def run_question_worker(config: TaskConfig, *, model: api.Model | None = None,
                        server=None) -> report.TaskResult:
    """One worker of the question's design; returns what the counters say happened."""
    started = time.monotonic()
    train, n, i = config.train, config.cluster.num_workers, config.index
    bounded = tf1.RunOptions(timeout_in_ms=int(train.timeout * 1000))
    if server is None:
        server = tf.distribute.Server(config.cluster.spec(), job_name="worker", task_index=i,
                                      start=True)
    # The question's stop rule: every worker runs its own epochs, whatever the others do.
    model = model or registry.resolve(train.model)
    params = model_params(config, model)
    shard, local_steps, description = load_shard(config, model)
    example = shard.batch(0)
    q = _supervised_graph(config, model, example, local_steps)
    result = report.TaskResult(role="worker", index=i, mode=train.mode, target_steps=local_steps,
                               replicas_to_aggregate=train.aggregate(n),
                               dataset=data_name(params),
                               dataset_description=description, model=train.model)
    tf_config = sessions.session_config(config.cluster.device_filters("worker", i))
    sess = _prepare_or_wait(config, server, q, tf_config, result, started, local_steps)
    side = tf1.Session(server.target, graph=q.graph, config=tf_config)
    # Not in the question: with --logdir the chief writes the counters as summaries, as in the
    # fixed setup, so that `sync-mnist plot` and TensorBoard can show the run (no checkpoints).
    writer = tf1.summary.FileWriter(str(train.logdir)) \
        if train.logdir and config.is_chief else None
    _train_own_epochs(config, sess, side, q.g, shard, local_steps, writer, bounded, result)
    counters = verdict_lib.Counters.read(side, q.g.state, options=bounded)
    verdict = verdict_lib.verify(counters, mode="sync", target_steps=local_steps,
                                 replicas_to_aggregate=train.aggregate(n))
    result.record_counters(counters)
    result.synchronous, result.verdict = verdict.synchronous, verdict.line
    if config.is_chief:
        evaluator = evaluation.Evaluator(
            model, params, num_ps=config.cluster.num_ps, worker=f"/job:worker/task:{i}",
            target=server.target, tf_config=tf_config, ps_hosts=config.cluster.ps_hosts)
        metrics, result.test_loss = evaluator(
            *input_data("eval_input_fn", model.eval_input_fn, params), bounded)
        result.test_accuracy, result.test_metrics = metrics.get("accuracy"), metrics
        evaluator.close()
    if writer:
        write_summaries(writer, counters, test_accuracy=result.test_accuracy)
        writer.close()
    side.close()
    q.supervisor.request_stop()
    log.info("verdict: %s", verdict.line)
    return result


class _Supervised(NamedTuple):
    graph: tf.Graph
    g: object  # graph.WorkerGraph
    supervisor: tf1.train.Supervisor
    chief_queue_runner: tf1.train.QueueRunner
    init_tokens: tf.Operation


def _supervised_graph(config: TaskConfig, model: api.Model, example: tuple,
                      local_steps: int) -> _Supervised:
    """The fixed setup's graph with the stock R tokens, under the question's Supervisor."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(config.train.seed)
        g = build_graph(config, model, example, num_tokens=-1, target=local_steps)
        optimizer = g.training.optimizer
        chief_queue_runner = optimizer.get_chief_queue_runner()
        init_tokens = optimizer.get_init_tokens_op()  # the default: R tokens, anyone's to take
        supervisor = tf1.train.Supervisor(
            is_chief=config.is_chief, logdir=None, init_op=tf1.global_variables_initializer(),
            local_init_op=(optimizer.chief_init_op if config.is_chief
                           else optimizer.local_step_init_op),
            ready_for_local_init_op=optimizer.ready_for_local_init_op,
            global_step=g.state.global_step, summary_op=None, saver=None,
            stop_grace_secs=STOP_GRACE_SECS)  # recovery_wait_secs: the default, 30 s
    return _Supervised(graph, g, supervisor, chief_queue_runner, init_tokens)


def _prepare_or_wait(config: TaskConfig, server, q: _Supervised, tf_config,
                     result: report.TaskResult, started: float, local_steps: int):
    """Supervisor's session; the chief then preloads the tokens and starts its queue runner."""
    if not config.is_chief:
        log.info("%s (Supervisor's default poll: every 30 s)", report.WAITING_FOR_CHIEF)
    # Bounded so nothing hangs: one 30 s poll plus --timeout (unbounded in the question).
    waiting_since = time.monotonic()
    sess = q.supervisor.prepare_or_wait_for_session(server.target, config=tf_config,
                                                    max_wait_secs=30 + config.train.timeout)
    result.ready_at = time.time()
    if not config.is_chief:
        result.chief_wait_s = time.monotonic() - waiting_since
    result.startup_s = time.monotonic() - started
    log.info("ready after %.2f s (global_step %d); %d local steps, stopping on my own count",
             result.startup_s, sess.run(q.g.state.global_step), local_steps)
    # Not in the question: the same start-up check as the fixed setup, so that a task started
    # with other settings than the chief's says so instead of joining.
    membership.check_agreement(membership.settings(config, q.g.model_settings),
                               sess.run(q.g.members.published), me=config.name,
                               restarted_chief=False)
    if config.is_chief:
        sess.run(q.init_tokens)
        q.supervisor.start_queue_runners(sess, [q.chief_queue_runner])
    return sess


def _train_own_epochs(config: TaskConfig, sess, side, g, shard: Shard, local_steps: int,
                      writer, bounded, result: report.TaskResult) -> None:
    """The question's loop: local_steps steps, whatever the others do (bounded per step)."""
    train, i = config.train, config.index
    progress = Progress(config, side, g.state, writer, local_steps)
    train_started = time.monotonic()
    local = 0
    try:
        while local < local_steps:
            x, y = shard.batch(local)
            _, loss, train_metrics = sess.run(
                [g.training.train_op, g.spec.loss, dict(g.spec.train_metrics)], g.feed(x, y),
                options=bounded)
            local += 1
            progress.step(local, loss, train_metrics)
    except tf.errors.DeadlineExceededError:
        result.blocked = True
        result.error = (f"worker {i}: blocked for {train.timeout:g} s on the token queue after "
                        f"local step {local}; contributions so far "
                        f"{contributions_so_far(side, g.state)}")
        log.error("%s", result.error)
    result.finished_at = time.time()
    result.local_steps = local
    result.train_s = time.monotonic() - train_started
    result.examples_per_sec = train.batch_size * local / max(result.train_s, 1e-9)
