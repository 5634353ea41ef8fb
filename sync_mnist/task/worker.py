"""One worker's life, as the phases of `WorkerRun`: load its shard, start its server, build
its graph, join the cluster, train in lockstep, finish and verify, report done.

protocol.py's docstring tells the whole protocol that these phases are one side of. Lines
that exist only because training is distributed and synchronous carry a `# Sync:` tag.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from sync_mnist.core import cluster as cluster_lib
from sync_mnist import api, models
from sync_mnist.core import (audit, bounded, checkpoints, early_stop, membership, optimizers,
                             placement, protocol, sessions, sync)
from sync_mnist.models import data, registry
from sync_mnist.task import evaluation, export, progress_log, preemption, report
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.config import START_SECS, TaskConfig, TaskTimeout, first_line
from sync_mnist.core.sessions import SideSession

tf1 = tf.compat.v1
log = logging.getLogger(__name__)
SILENT_READ_SECS = 5.0  # silent_ps: how long a ps may take to answer a read of a variable

class StepCutShort(RuntimeError):
    """A training step ended in OutOfRangeError or StopIteration: a failure, never an end."""


@contextlib.contextmanager
def no_silent_end(me: str):
    """Turns OutOfRangeError and StopIteration into StepCutShort.

    MonitoredSession.__exit__ takes these two for "training is over" and swallows them, so a
    step that met one would skip the finish phase without a word. Use it inside the session's
    `with`, around everything that runs steps.
    """
    try:
        yield
    except (tf.errors.OutOfRangeError, StopIteration) as e:
        raise StepCutShort(f"{me}: a step ended in {type(e).__name__} (a queue on the ps was "
                           f"closed under it): {first_line(e)}") from e


class _Graph(NamedTuple):
    features: object  # placeholders: one, or a dict of them, as the shard holds the features
    labels: tf.Tensor
    spec: api.ModelSpec  # the model function's TRAIN spec: its loss and train_metrics
    model_settings: dict  # Sync: the model's params and variables, compared with the chief's
    state: sync.SharedState
    training: sync.SyncTraining
    members: membership.Membership  # Sync: published settings, last pushes, the finish barrier
    report_done: tf.Operation  # Sync: one entry in every ps's done-queue
    stop_vars: early_stop.StopVars  # on ps 0: the update the cluster stops on, if any
    stop: early_stop.StopOps  # Sync: the stop's read after each token, and its requests

    @property
    def transient(self) -> list[tf.Variable]:
        """Variables on the ps that checkpoints leave out."""
        return self.members.transient + self.stop_vars.transient

    def feed(self, features, labels) -> dict:
        """The feed_dict of one batch."""
        return {**placement.feed(self.features, features), self.labels: labels}


def model_params(config: TaskConfig, model: api.Model) -> dict:
    """The params a model's functions are given: its defaults, and the data options."""
    train = config.train
    return {**model.params, "dataset": train.dataset,
            "data_dir": None if train.data_dir is None else str(train.data_dir),
            "seed": train.seed}


def build_graph(config: TaskConfig, model: api.Model, example: tuple, num_tokens: int = 0,
                dataset: str | None = None, target: int | None = None) -> _Graph:
    """This worker's graph: variables on the ps tasks, computation on this worker.

    `example` is a batch (features, labels) of the shard, for the placeholders' dtypes and
    shapes. num_tokens is 0 for the fixed setup; question.py passes -1, the stock default.
    `dataset` (the resolved name) and the model's params and variables are published by the
    chief and compared by the others. `target` (the run's length: updates in sync mode,
    local steps per worker in async mode) sets how long the learning rate takes to decay with
    --lr-decay cosine.
    """
    n, i = config.cluster.num_workers, config.index
    train, params = config.train, model_params(config, model)
    features, labels = placement.placeholders(*example)
    recorded = placement.record(model.model_fn, features, labels, api.ModeKeys.TRAIN, params)
    model_settings = membership.model_settings(params, placement.fingerprint(recorded))
    shared = protocol.build_shared(config, dataset, model_settings)  # Sync: first, as all tasks
    # Sync: between-graph replication. Variables go onto the ps tasks (the model's, cut into
    # one slice per ps: placement.py); every other op stays on this worker.
    setter = tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{i}",
                                             cluster=config.cluster.spec())
    # global_step counts updates in sync mode, and every worker's local steps in async mode.
    decay_steps = None if train.lr_decay == "none" or not target else (
        target * n if train.mode == "async" else target)
    with tf1.device(setter):
        built = placement.build(model.model_fn, features, labels, api.ModeKeys.TRAIN, params,
                                num_ps=config.cluster.num_ps, wire_dtype=train.wire_dtype,
                                recorded=recorded)
        spec = built.spec
        if not tf1.trainable_variables():
            raise api.ContractError("the model function made no trainable variables: nothing "
                                    "to train")
        # Sync: the proof holds for any model: its step writes nothing, and its UPDATE_OPS
        # (moving statistics) are averaged over the workers once per update (audit.py).
        audit.check_step([spec.loss, *spec.train_metrics.values()], built.ops)
        state_deltas = audit.state_deltas(built.update_ops, built.ops, built.state)
        optimizer = spec.optimizer or optimizers.make_optimizer(
            train.optimizer, train.learning_rate, decay_steps=decay_steps,
            global_step=shared.state.global_step)
        # Sync: each update may latch the stop, asked for by --target-accuracy or a preempted
        # task (early_stop.py).
        latch = (lambda new_step: early_stop.latch(shared.stop, new_step, target)) \
            if train.mode == "sync" and target else None
        training = sync.build_train_op(
            spec.loss, shared.state, optimizer,
            worker_index=i, num_workers=n, replicas_to_aggregate=config.train.aggregate(n),
            is_chief=config.is_chief, mode=config.train.mode, num_tokens=num_tokens,
            last_push=shared.members.last_push, proof=config.train.proof, after_update=latch,
            wire_dtype=train.wire_dtype, state_deltas=state_deltas)
        stop = early_stop.build_stop_ops(shared.stop, training.token_on_ps,
                                         shared.state.global_step, train.mode)
    report_done = tf.group(*[q.enqueue(i) for q in shared.done_queues])
    return _Graph(features, labels, spec, model_settings, shared.state, training, shared.members,
                  report_done, shared.stop, stop)


def input_data(what: str, input_fn, params: dict) -> tuple:
    """input_fn(params), checked: (features, labels), numpy arrays of one length (features an
    array or a dict of them). Raises api.ContractError naming what is wrong."""
    try:
        value = input_fn(dict(params))
    except Exception as e:
        raise api.ContractError(f"{what} raised {type(e).__name__}: "
                                f"{' '.join(str(e).split()) or '-'}",
                                registry.user_traceback(e)) from None
    if not (isinstance(value, tuple) and len(value) == 2):
        raise api.ContractError(f"{what} returned {type(value).__name__}, not a pair "
                                "(features, labels) of numpy arrays")
    features, labels = value
    columns = features if isinstance(features, dict) else {"": features}
    for name, column in [*columns.items(), ("labels", labels)]:
        where = "labels" if name == "labels" else f"features[{name!r}]" if name else "features"
        if not isinstance(column, np.ndarray) or column.ndim < 1:
            raise api.ContractError(f"{what} returned {where} as {type(column).__name__}"
                                    f"{f' of shape {column.shape}' if hasattr(column, 'shape') else ''}"
                                    ", not a numpy array with a first axis of examples")
        if len(column) != len(labels):
            raise api.ContractError(f"{what} returned {len(column)} rows of {where} but "
                                    f"{len(labels)} labels")
    if len(labels) == 0:
        raise api.ContractError(f"{what} returned no examples")
    return features, labels


def load_shard(config: TaskConfig, model: api.Model) -> tuple[data.Shard, int, str]:
    """This worker's shard of the model's training data, the steps to train (--train-steps,
    or --epochs passes over the shard), and a line that describes the data.

    Only the shard is kept: the whole training set is dropped once it is cut.
    """
    train = config.train
    features, labels = input_data("train_input_fn", model.train_input_fn,
                                  model_params(config, model))
    # Sync: a disjoint shard per worker, equal in length, so every worker runs as many batches.
    shard = data.Shard(features, labels, index=config.index,
                       num_workers=config.cluster.num_workers, batch_size=train.batch_size,
                       seed=train.seed)
    source = train.dataset if train.model in models.READ_DATASET else train.model
    description = f"{source}: {len(labels):,} training examples"
    log.info("dataset %s; this worker's shard: %s examples", description, f"{shard.size:,}")
    return shard, train.train_steps or train.epochs * shard.batches_per_epoch, description


def run_worker(config: TaskConfig, *, model: api.Model | None = None, server=None,
               failed: report.TaskResult | None = None) -> report.TaskResult:
    """Trains this worker's shard to the end and returns its result record.

    Args:
      config: the task and training configuration.
      model: the model and its data; the one --model names when None (tests pass their own).
      server: an already started tf.distribute.Server for this task (tests); started if None.
      failed: the record the caller keeps if the run raises; it learns whether the ps had
        taken this worker's done report (the chief's SavedModel fails after it), which a
        restart cannot undo. Nothing else: a failed run claims no verdict.
    """
    run = WorkerRun(config, model)
    try:
        run.load_data()
        run.start_server(server)
        run.make_graph()
        with run.join() as sess:
            run.train(sess)
            run.finish()
        if run.verdict is None:  # never report done for a run that did not finish
            raise RuntimeError(f"{config.name}: the training session ended before the finish "
                               "phase")
        run.say_done()
    finally:
        if failed is not None:
            failed.done_reported = run.result.done_reported
    return run.result


def silent_ps(side, graph: tf.Graph, cluster: cluster_lib.ClusterLayout) -> list[str]:
    """The ps that do not answer now, each with why: nothing listens, or it accepts
    connections but a read of one of its variables did not come back in SILENT_READ_SECS
    (frozen, stuck). What a timeout at a read of every ps can name."""
    one_each = {}
    for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES):
        device = tf.DeviceSpec.from_string(v.device)
        if device.job == "ps" and device.task is not None:
            one_each.setdefault(device.task, v)
    silent = []
    for p, address in enumerate(cluster.ps_hosts):
        why = membership.probe(address)
        if why is None and p in one_each:
            # Bounded twice: a fetch new to this session registers its graph first, which
            # no RunOptions bound (bounded.bounded_call).
            read = tf1.RunOptions(timeout_in_ms=int(SILENT_READ_SECS * 1000))
            try:
                bounded.bounded_call(lambda v=one_each[p]: side.run(v, options=read),
                                     SILENT_READ_SECS + 1, f"a read of ps {p}")
            except (tf.errors.DeadlineExceededError, TaskTimeout) as e:
                if isinstance(e, TaskTimeout):
                    e.handled()
                why = (f"it accepts connections but did not answer a read in "
                       f"{SILENT_READ_SECS:g} s")
            except tf.errors.OpError as e:
                why = f"a read of it failed: {type(e).__name__}"
        if why:
            silent.append(f"ps {p} ({why})")
    return silent


def _missing(side, graph: tf.Graph, cluster: cluster_lib.ClusterLayout) -> str:
    """The "; missing: ps K (why), ..." a timeout ends with, for each ps that does not answer
    now (silent_ps); "" if every ps answers."""
    silent = silent_ps(side, graph, cluster)
    return f"; missing: {', '.join(silent)}" if silent else ""


class WorkerRun:
    """One worker's run, phase by phase; each phase leaves what the next one needs on self."""

    def __init__(self, config: TaskConfig, model: api.Model | None = None):
        self.config, self.train_config = config, config.train
        self.model = model or registry.resolve(config.train.model)
        self.params = model_params(config, self.model)
        self.started = time.monotonic()
        self.bounded = tf1.RunOptions(timeout_in_ms=int(config.train.timeout * 1000))
        # Only the chief writes checkpoints and summaries (preflight.py has checked where).
        self.logdir = config.train.logdir if config.train.logdir and config.is_chief else None
        self.export_dir = config.train.export_dir if config.is_chief else None
        self.result = report.TaskResult(role="worker", index=config.index,
                                        mode=config.train.mode,
                                        replicas_to_aggregate=self._aggregate,
                                        model=config.train.model)
        self.verdict: verdict_lib.Verdict | None = None  # set by finish()

    @property
    def _aggregate(self) -> int:
        return self.train_config.aggregate(self.config.cluster.num_workers)

    def load_data(self) -> None:
        """Before the server: loading briefly holds the whole training set, and that peak should
        not add to the memory the server and the session take. While it trains, even the chief
        holds only its shard: it reads the evaluation data when it first evaluates (`finish`,
        or the first --eval-every evaluation)."""
        self.shard, self.target, description = load_shard(self.config, self.model)
        self.example = self.shard.batch(0)
        self.eval_data = self.evaluator = None
        self.result.target_steps = self.target
        # --dataset is the built-in models' data; a model of the user's brings its own.
        self.result.dataset = (self.train_config.dataset
                               if self.train_config.model in models.READ_DATASET else None)
        self.result.dataset_description = description

    def start_server(self, server) -> None:
        config, i = self.config, self.config.index
        if server is None:
            server = config.cluster.server("worker", i)
        self.server = server
        self.tf_config = sessions.session_config(config.cluster.device_filters("worker", i))

    def make_graph(self) -> None:
        if self.config.is_chief and not self.train_config.logdir:
            log.info("no --logdir: nothing is saved, so a preemption (SIGTERM) or a lost ps "
                     "loses the training done so far")
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf1.set_random_seed(self.train_config.seed)
            self.g = build_graph(self.config, self.model, self.example,
                                 dataset=self.train_config.dataset, target=self.target)
            if self.train_config.eval_every:
                evaluation.check_accuracy_metric(self.model, self.params, self.example)
            self.restore = None
            if self.logdir:
                # A checkpoint of another model (say, of a cluster with another number of
                # workers) would fail mid-restore with a long error: name the variable instead.
                # In sync mode global_step counts updates, so a checkpoint past the plan
                # has nothing left to train (in async mode, each worker's local steps count).
                # A damaged newest checkpoint is passed over: the chief restores the one chosen.
                transient = self.g.transient
                self.restore = checkpoints.check_checkpoint(self.logdir, [
                    v for v in tf1.global_variables() if all(v is not t for t in transient)],
                    planned=self.target if self.train_config.mode == "sync" else None)
            # The writer CheckpointSaverHook also uses (one cache per logdir): one events file.
            self.writer = progress_log.EventsWriter(str(self.logdir)) if self.logdir else None

    @contextlib.contextmanager
    def join(self):
        """Waits for the ps and (bounded) for the chief, makes the training session, and rejoins
        a running cluster if this worker replaces one that died. Yields the training session."""
        config, train = self.config, self.train_config
        # Sync: a ps, like the chief, may start after this worker (a pod still being scheduled,
        # a loaded host): both get the start-up allowance on top of --timeout.
        startup_wait = START_SECS + train.timeout
        for p, address in enumerate(config.cluster.ps_hosts):
            cluster_lib.wait_reachable(address, f"ps {p}", startup_wait)
        chief_wait = startup_wait
        mine = membership.settings(config, train.dataset, self.g.model_settings)
        waiting_since = time.monotonic()
        if not config.is_chief:
            log.info("%s to initialise the model (polling every %g s, for at most %g s)",
                     report.WAITING_FOR_CHIEF, sessions.READY_POLL_SECS, chief_wait)
            # Sync: compare settings with the chief's as soon as it has published them, before
            # anything that a different cluster size or model would break.
            with self.graph.as_default():
                _check_published(SideSession(self.server.target, self.graph, self.tf_config),
                                 self.g.members, mine, config.name, chief_wait,
                                 f"worker 0 at {config.cluster.address('worker', 0)}")
        status = sessions.SessionStatus()
        monitored = self._monitored_session(status, chief_wait)
        self.side = SideSession(self.server.target, self.graph, self.tf_config,
                                config.cluster.ps_hosts)
        with self.graph.as_default(), monitored as sess:
            self.result.ready_at = time.time()
            self.result.startup_s = time.monotonic() - self.started
            if not config.is_chief:
                self.result.chief_wait_s = time.monotonic() - waiting_since
            self._take_position(status, mine)
            self.status = status
            with no_silent_end(config.name):
                yield sess
        self.result.sessions = status.sessions
        self.result.failed_saves, self.result.save_error = status.failed_saves, status.save_error
        self.side.close()
        if self.evaluator is not None:
            self.evaluator.close()
        if self.writer:
            self.writer.close()

    def _monitored_session(self, status: sessions.SessionStatus, chief_wait: float):
        config, train = self.config, self.train_config
        with self.graph.as_default():
            try:
                return sessions.monitored_session(
                    self.server.target, is_chief=config.is_chief, hooks=self.g.training.hooks,
                    config=self.tf_config, timeout=chief_wait,
                    checkpoint_dir=str(self.logdir) if self.logdir else None,
                    save_steps=train.save_steps, save_secs=train.save_secs,
                    transient=self.g.transient, ps_hosts=config.cluster.ps_hosts,
                    recovery_timeout=train.timeout, status=status, restore=self.restore,
                    events=self.writer)
            except tf.errors.DeadlineExceededError:
                raise TaskTimeout(
                    f"worker {config.index}: waited {chief_wait:g} s for the chief (worker 0 at "
                    f"{config.cluster.address('worker', 0)}) to initialise the model") from None

    def _take_position(self, status: sessions.SessionStatus, mine: dict) -> None:
        """Where this worker starts: global_step, or its predecessor's token after a rejoin."""
        config, train, side, g = self.config, self.train_config, self.side, self.g
        if status.model == "continued":
            # A chief restarted into a running cluster: the settings are its predecessor's.
            membership.check_agreement(mine, side.run(g.members.published, options=self.bounded),
                                       me=config.name, restarted_chief=True)
        start_step = int(side.run(g.state.global_step, options=self.bounded))
        how = {"restored": f"restored from the checkpoint in {self.logdir}",
               "continued": "the model was already on the ps",
               "initialised": "initialised"}.get(status.model)
        n, r = config.cluster.num_workers, self._aggregate
        if train.mode == "sync" and r == n:
            # Sync: restarted into a running cluster, take the token the predecessor left (or
            # wait for the update its last gradient joined) instead of pushing twice.
            token = _rejoin(side, g, config.index, self.bounded, train.timeout)
            if token is not None:
                log.info("rejoined at global_step %d: my predecessor's last gradient was "
                         "already pushed; took its token %d without pushing again",
                         start_step, token)
                self.result.rejoined = True
                start_step = token
        self.result.start_step = self.start_step = start_step
        self.planned = self.target if train.mode == "async" else self.target - start_step
        log.info("ready after %.2f s; %s (global_step %d%s)", self.result.startup_s,
                 f"training until global_step {self.target}" if r < n else
                 f"{self.planned} local steps planned", start_step, f"; {how}" if how else "")

    def train(self, sess) -> None:
        """Lockstep: one gradient per local step, until the token reaches the target."""
        config, train, g, i = self.config, self.train_config, self.g, self.config.index
        progress = progress_log.Progress(config, self.side, g.state, self.writer, self.target)
        steps_run = 0
        lockstep = train.mode == "sync" and self._aggregate == config.cluster.num_workers
        # Sync: the stop step, read after the token
        fetches = [g.training.train_op, g.spec.loss, dict(g.spec.train_metrics), g.stop.read]
        stop_step = last_token = early_stop.NONE
        evaluations = self._evaluations() if config.is_chief and train.eval_every else None
        asked_to_stop = False
        preemption.arm()

        def run_step(step: int) -> int:
            nonlocal steps_run, stop_step, last_token, asked_to_stop
            x, y = self.shard.batch(step)
            sessions = self.status.sessions
            try:
                token, loss, train_metrics, stop_step = sess.run(fetches, g.feed(x, y),
                                                                 options=self.bounded)
            except tf.errors.DeadlineExceededError:
                raise TaskTimeout(
                    f"worker {i}: waited {train.timeout:g} s for an update after local step "
                    f"{step}; {progress_log.stalled(self.side, g.state, g.members, config)}"
                ) from None
            if lockstep and token != step + 1:
                if self.status.sessions == sessions:
                    # Sync: a token can only come from the update this push joined; another
                    # one means the lockstep broke (tokens are owned: sync.build_train_op).
                    raise TaskTimeout(
                        f"worker {i}: pushed for update {step + 1} but was handed token "
                        f"{token}, in the same session: the lockstep is broken; "
                        f"{progress_log.stalled(self.side, g.state, g.members, config)}")
                # Sync: the ps was lost and the chief restored it from the last checkpoint.
                log.warning("global_step went back from %d to %d: the ps was restored from "
                            "a checkpoint; training on from there", step + 1, token)
            steps_run += 1
            progress.step(steps_run, loss, train_metrics)
            last_token, stop_step = int(token), int(stop_step)
            if preemption.requested() and not asked_to_stop:
                # Sync: the next update is the cluster's last (early_stop.py)
                self.side.run(g.stop.preempt, options=self.bounded)
                asked_to_stop = True
            if evaluations:
                evaluations.after_update(last_token)
            return last_token

        train_started = time.monotonic()

        def stopped(token: int) -> bool:
            return early_stop.should_stop(token, stop_step, train.mode)

        local = sync.train_loop(run_step, start_step=self.start_step, planned=self.planned,
                                target=self.target, stop_on_token=train.mode == "sync",
                                stopped=stopped)
        self._record_training(local, last_token, train_started,
                              stopped_early=stopped(last_token))
        if config.is_chief:
            self._save_final(sess)

    def _save_final(self, sess) -> None:
        """sessions.save_final; its timeout (a bounded_call's, which names no ps) also says which
        ps is silent, so that the launcher restarts that ps, not only this task (found by make
        chaos: ps 0 of 2 frozen as the chief saved; the workers named ps 0 and the chief did not,
        and the launcher had no restart left for the chief)."""
        try:
            sessions.save_final(sess, self.status)
        except TaskTimeout as e:
            e.handled()  # raised again below, arming its own last resort
            missing = _missing(self.side, self.graph, self.config.cluster)
            raise TaskTimeout(f"{e}{missing}") from None

    def _record_training(self, local: int, last_token: int, train_started: float, *,
                         stopped_early: bool) -> None:
        """Says whether the target accuracy stopped training early, and records the steps."""
        train = self.train_config
        if stopped_early and not sync.ran_the_plan(local=local, token=last_token,
                                                   planned=self.planned, target=self.target,
                                                   stop_on_token=train.mode == "sync"):
            log.info("stopped after %d local steps, at global_step %d: %s (planned: %s)",
                     local, last_token, "a task was preempted" if train.target_accuracy is None
                     else "the chief's evaluation reached the target accuracy, or a task was "
                     "preempted",
                     f"{self.planned} local steps" if train.mode == "async"
                     else f"{self.target} updates")
        result = self.result
        result.finished_at = time.time()
        result.local_steps, result.last_token = local, last_token or None
        result.train_s = time.monotonic() - train_started
        result.examples_per_sec = train.batch_size * local / max(result.train_s, 1e-9)

    def evaluate(self) -> tuple[float | None, float]:
        """The chief's evaluation: (its "accuracy" metric, if it has one, and its mean loss)
        on the model's evaluation data, read and the evaluation graph built at the first call."""
        if self.evaluator is None:
            config = self.config
            self.eval_data = input_data("eval_input_fn", self.model.eval_input_fn, self.params)
            self.evaluator = evaluation.Evaluator(
                self.model, self.params, self.example, num_ps=config.cluster.num_ps,
                worker=f"/job:worker/task:{config.index}", target=self.server.target,
                tf_config=self.tf_config, ps_hosts=config.cluster.ps_hosts)
        self.test_metrics, loss = self.evaluator(*self.eval_data, self.bounded)
        self.result.test_metrics = self.test_metrics
        return self.test_metrics.get(evaluation.ACCURACY), loss

    def _evaluations(self) -> early_stop.ChiefEvaluations:
        """The chief's evaluations during training (--eval-every), and the stop at the target."""
        g, train = self.g, self.train_config

        def request_stop(step: int) -> None:
            self.side.run(g.stop.request, {g.stop.step: step}, options=self.bounded)

        self.evaluations = early_stop.ChiefEvaluations(
            every=train.eval_every, target=train.target_accuracy,
            evaluate=self.evaluate,
            read_step=lambda: int(self.side.run(g.state.global_step, options=self.bounded)),
            request_stop=request_stop, writer=self.writer)
        return self.evaluations

    def finish(self) -> None:
        """The finish barrier, the counters and the verdict; the chief also evaluates."""
        config, train, g, side, result = (self.config, self.train_config, self.g, self.side,
                                          self.result)
        # Sync: wait until every worker has pushed its last gradient (or is lost), so that
        # every task reads the same, final counters and so reaches the same verdict.
        with self._awaiting("at the finish (the barrier and the final counters)"):
            lost = membership.finish_barrier(
                lambda fetches, feed=None: side.run(fetches, feed, options=self.bounded),
                g.members, index=config.index, cluster=config.cluster, timeout=train.timeout,
                log=log)
            counters = verdict_lib.Counters.read(side, g.state, options=self.bounded)
            stop_step, reason = (int(v) for v in side.run(
                [g.stop_vars.stop_step, g.stop_vars.reason], options=self.bounded))
        end = self.target
        # Sync: the run was planned to end where the target or a preemption stopped it
        result.stop_step = stop_step or None
        if train.target_accuracy is not None:
            result.target_accuracy = train.target_accuracy
        if reason == early_stop.PREEMPTED:
            result.preempted_at = stop_step
        if train.mode == "sync":  # (async mode counts local steps, and verifies no target)
            end = early_stop.end_step(self.target, stop_step)
        self.verdict = verdict_lib.verify(
            counters, mode=train.mode, target_steps=end,
            replicas_to_aggregate=self._aggregate, lost=lost) if train.proof else verdict_lib.Verdict(
            None, None, "not verified: --bench-no-proof left the counters out")
        result.record_counters(counters)
        result.lost = lost
        result.synchronous, result.verdict = self.verdict.synchronous, self.verdict.line
        if result.preempted_at is not None:
            log.warning("preempted: the cluster stopped on update %d of %d; %s", stop_step,
                        self.target, f"the chief saves it to {train.logdir}; rerun with the "
                        "same --logdir to resume there" if train.logdir else
                        "no --logdir: nothing is saved, a rerun starts over")
            return  # no time for an evaluation or a model: the rerun makes them
        if config.is_chief:
            if train.eval_every:
                self.evaluations.record(result)
            self.shard = None  # trained: make room for the evaluation data
            with self._awaiting("to evaluate the model"):
                result.test_accuracy, result.test_loss = self.evaluate()
            log.info("test_accuracy=%s test_loss=%.4f on %d evaluation examples (%s)",
                     "-" if result.test_accuracy is None else f"{result.test_accuracy:.4f}",
                     result.test_loss, len(self.eval_data[1]),
                     " ".join(f"{k}={v:.4f}" for k, v in self.test_metrics.items()))
            if self.writer:
                progress_log.write_summaries(self.writer, counters,
                                        test_accuracy=result.test_accuracy)
            if self.export_dir:  # the weights evaluated just now, read while the ps serves
                with self._awaiting("to read the trained weights for the export"):
                    self.weights = export.read_weights(
                        lambda fetches: side.run(fetches, options=self.bounded), self.graph,
                        export.variable_names(self.model, self.params, self.example))

    @contextlib.contextmanager
    def _awaiting(self, what: str):
        """A bounded read of the ps that expired, as a timeout that says what it waited for,
        and which ps did not answer: the launcher restarts the task a timeout names."""
        try:
            yield
        except tf.errors.DeadlineExceededError:
            cluster = self.config.cluster
            hosts = ", ".join(f"ps {p} at {a}" for p, a in enumerate(cluster.ps_hosts))
            raise TaskTimeout(
                f"{self.config.name}: waited {self.train_config.timeout:g} s for "
                f"{'the ps' if cluster.num_ps == 1 else 'the ps tasks'} ({hosts}) {what}; "
                f"no answer{_missing(self.side, self.graph, cluster)}") from None

    def _write_model(self) -> Exception | None:
        """Writes the SavedModel; the error if it could not. A disk with no room is tried again
        for half of --timeout (checkpoints.retry_for_room: a disk freed meanwhile keeps the run's
        product), well inside the ps's bound on the done reports (--timeout +
        --restart-grace without progress); not once a preemption has been asked for."""
        try:
            _, tries = checkpoints.retry_for_room(
                lambda: export.write_saved_model(self.model, self.params, self.example,
                                                 self.weights, self.export_dir),
                export.ExportError, self.train_config.timeout / 2, stop=preemption.signalled)
        except Exception as e:
            return e
        log.info("saved the trained model to %s%s", self.export_dir,
                 f" (try {tries})" if tries > 1 else "")
        return None

    def say_done(self) -> None:
        # The chief writes its model first: once it has reported done the ps may exit, and a
        # chief restarted after that could never read the weights again.
        write_error = None
        if self.export_dir and self.result.preempted_at is None:
            write_error = self._write_model()  # raised below, once the ps are not held up by it
        # Sync: only now may the ps tasks exit: the chief has read everything it needs from them.
        config = self.config
        try:
            report_done(self.server.target, self.graph, self.g.report_done, self.tf_config,
                        timeout=self.train_config.timeout, me=config.name,
                        ps_hosts=config.cluster.ps_hosts)
            self.result.done_reported = True
        except TaskTimeout as e:
            e.handled()
            # Sync: the run is complete and its verdict read from the ps's final counters; a ps
            # that stopped answering now cannot change either, and it ends by its own bound
            # (--timeout + --restart-grace). Failing here would report a verified run as failed.
            log.warning("%s; the run was already complete (verdict: %s), so this does not "
                        "change my result; the ps will end by its own bound", e,
                        self.verdict.line)
            self.result.done_reported = False
        if write_error is not None:
            raise write_error
        log.info("verdict: %s", self.verdict.line)


def report_done(target: str, graph: tf.Graph, op: tf.Operation, tf_config: tf1.ConfigProto, *,
                timeout: float, me: str, ps_hosts: tuple[str, ...]) -> None:
    """Runs `op`, this worker's entry in every ps's done-queue, within `timeout` seconds."""
    def report():
        done = tf1.Session(target, graph=graph, config=tf_config)
        try:
            done.run(op, options=tf1.RunOptions(timeout_in_ms=int(timeout * 1000)))
        except (tf.errors.UnavailableError, tf.errors.AbortedError):
            # Sync: a ps exits as soon as it holds the last entry, which may be this one, before
            # the call has returned here; a ps that is gone has nothing left to wait for.
            log.info("the ps had exited by the end of my done report")
        finally:
            bounded.close_bounded(done.close, done)

    # Sync: a ps that accepts connections but does not answer would hold the session's creation
    # and first run past any RunOptions.
    bounded.bounded_call(report, timeout, f"{me}: waited {timeout:g} s to report done to the "
                                          f"ps ({', '.join(ps_hosts)})")


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
            time.sleep(sessions.READY_POLL_SECS)
        published = side.run(members.published, options=poll)
    except tf.errors.OpError:
        return  # the session creation that follows waits for the ps and reports it
    finally:
        side.close()
    membership.check_agreement(mine, published, me=me, restarted_chief=False)


def _rejoin(side: SideSession, g: _Graph, index: int, options,
            timeout: float) -> int | None:
    """With R = N: takes a token without pushing if this worker's predecessor left one.

    Returns the token taken, or None when this worker should simply push. One reading decides:
    an update puts the tokens into their owners' queues before it makes the new global step
    visible, and the queue is read after global_step, so whoever reads the new step also finds
    the predecessor's token (sync.build_train_op).
    """
    step, last_push, waiting = side.run(g.training.rejoin_reading, options=options)
    step, last_push, waiting = int(step), int(last_push[index]), int(waiting)
    if not sync.rejoin_needed(last_push=last_push, global_step=step, tokens_waiting=waiting):
        return None
    try:
        return int(side.run(g.training.rejoin, options=options))
    except tf.errors.DeadlineExceededError:
        raise TaskTimeout(f"worker {index}: rejoining at global_step {step}, waited "
                          f"{timeout:g} s for the update my predecessor's last gradient "
                          "joined") from None
