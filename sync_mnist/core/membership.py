"""Who is in the cluster: what the chief published, who pushed last, who finished or was lost.

Three small variables on ps 0 beside the counters. None of them is checkpointed: their meaning
ends with the ps that holds them, so a resumed run or a restarted ps starts them afresh.

  * `published`: the settings every task must share, as the chief was given them (JSON). Each
    task compares its own at start-up, so a worker started with another --batch-size or
    another cluster size stops at once with both values named, instead of spoiling the run.
  * `last_push[w]`: the local step of worker w's last push. It tells a restarted worker
    whether its predecessor's gradient is already waiting, and a stalled task who is missing.
  * `plans[w]`: what worker w reads of its input (coverage.Plan, JSON), written when it takes
    its place: the data verdict judges them together at the finish.
  * `finished[w]`: RUNNING, LOST or FINISHED. Each worker marks itself FINISHED after its last
    step; the chief marks LOST a worker whose server is gone or that has not pushed for
    --timeout. The finish barrier opens when no worker is RUNNING, and a ps exits once every
    worker has reported done or is LOST.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Callable, NamedTuple

import tensorflow as tf

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core.config import ConfigError, TaskConfig, TaskTimeout, WarmStart

tf1 = tf.compat.v1

# finished[w]. Marks only ever go up (scatter_max), so a worker that finishes after all is
# never marked lost over its own FINISHED, and a late FINISHED overrides LOST.
RUNNING, LOST, FINISHED = 0, 1, 2

PROBE_SECS = 1.0  # a TCP connect to a worker's server: how long before it counts as unanswered
LOST_PROBES = 2  # consecutive failed probes, POLL_SECS apart, before a worker is declared lost
POLL_SECS = 0.5
NO_ANSWER = "does not answer"  # a probe's connection attempt timed out
_UNREACHABLE = " is unreachable "  # a probe's connection attempt failed on the way (no route)


class Membership(NamedTuple):
    published: tf.Variable  # string: the chief's settings, JSON
    published_ready: tf.Tensor  # bool: the chief has written `published`
    last_push: tf.Variable  # int64 [workers]
    finished: tf.Variable  # int64 [workers]: RUNNING, LOST or FINISHED
    mark_worker: tf.Placeholder  # int32 [1]: the worker to mark
    mark_value: tf.Placeholder  # int64 [1]: LOST or FINISHED
    mark: tf.Tensor  # finished[mark_worker] = max(itself, mark_value)
    plans: tf.Variable  # string [workers]: each worker's reading plan, JSON ("" until written)
    plan: tf.Placeholder  # string [1]: this worker's
    write_plan: tf.Tensor  # plans[mark_worker] = plan

    @property
    def transient(self) -> list[tf.Variable]:
        """The variables a checkpoint must not hold."""
        return [self.published, self.last_push, self.finished, self.plans]


def build_membership(num_workers: int, settings: dict) -> Membership:
    """Creates the variables on ps 0. Every task calls this; only the chief's initial value of
    `published` is ever used, because only the chief initialises variables."""
    # Sync: on ps 0, where every task's graph finds them by name.
    with tf1.device("/job:ps/task:0"), tf1.variable_scope("sync_membership"):
        published = tf1.get_variable(
            "published", initializer=tf.constant(json.dumps(settings, sort_keys=True)),
            trainable=False)
        last_push = tf1.get_variable("last_push", initializer=tf.fill([num_workers],
                                                                      tf.constant(-1, tf.int64)),
                                     trainable=False)
        finished = tf1.get_variable("finished", [num_workers], tf.int64,
                                    tf1.zeros_initializer(), trainable=False)
        worker = tf1.placeholder(tf.int32, [1], name="mark_worker")
        value = tf1.placeholder(tf.int64, [1], name="mark_value")
        mark = tf1.scatter_max(finished, worker, value)
        ready = tf1.is_variable_initialized(published)
        ready.mark_used()  # only the non-chief workers run it; no warning in the chief's graph
        plans = tf1.get_variable("plans", initializer=tf.fill([num_workers], ""),
                                 trainable=False)
        plan = tf1.placeholder(tf.string, [1], name="plan")
        write_plan = tf1.scatter_update(plans, worker, plan)
    return Membership(published, ready, last_push, finished, worker, value, mark, plans, plan,
                      write_plan)


def settings(config: TaskConfig, model: dict | None = None) -> dict:
    """What every task of one cluster must agree on, as published and compared.

    Host names are left out: one machine may rightly be `localhost` to itself and an address to
    the others. A ps compares the cluster size, which shapes the variables it holds, and the
    setup, which decides its life (a done-queue, or the question's server.join()); the
    training settings do not touch it, and it knows no model. `model` is a worker's
    model_settings: the model's params (its data options among them) and its variables.
    """
    train, n = config.train, config.cluster.num_workers
    values = {"workers": n, "ps": config.cluster.num_ps, "setup": train.setup}
    if config.role == "worker":
        values.update(batch_size=train.batch_size, mode=train.mode,
                      replicas_to_aggregate=train.replicas_to_aggregate,
                      train_steps=train.train_steps, epochs=train.epochs,
                      optimizer=train.optimizer, learning_rate=train.learning_rate,
                      lr_decay=train.lr_decay, wire_dtype=train.wire_dtype,
                      # Sync: the counted ids' variable and what fills it are the same graph
                      count_examples=train.count_examples,
                      count_examples_ids=train.count_examples_ids,
                      seed=train.seed,
                      # Sync: a worker without the target would never read the stop.
                      eval_every=train.eval_every, target_accuracy=train.target_accuracy,
                      # Only the chief reads it, but a task without it is deployed otherwise.
                      **warm_start_settings(train.warm_start),
                      # Sync: every worker trains the same model: its SPEC (a file's contents,
                      # wherever it is), its params and its variables.
                      model=model_identity(train.model), **(model or model_settings(None, None)))
    # As published: what JSON cannot hold (a tuple, a path) compares as the chief's reads back.
    return json.loads(json.dumps(values, sort_keys=True, default=repr))


def model_identity(spec: str | None) -> str | None:
    """`--model SPEC` as the tasks compare it: a file's NAME and a digest of its contents, not
    its path (one model file may sit at another path on each host); a module's or a built-in
    name as it is."""
    where, sep, name = (spec or "").rpartition(":")
    if not (sep and where.endswith(".py")):
        return spec
    try:
        digest = hashlib.sha256(Path(where).read_bytes()).hexdigest()[:16]
    except OSError:  # the task loaded it a moment ago; it says so when the model loads
        return spec
    return f"{name} from a file of sha256 {digest}"


def warm_start_settings(warm: WarmStart | None) -> dict:
    """--warm-start-from, --warm-start-vars and --warm-start-map as published."""
    if warm is None:
        return {"warm_start_from": None}
    return {"warm_start_from": warm.source, "warm_start_vars": list(warm.variables),
            "warm_start_map": [f"{name}={prev}" for name, prev in warm.prev_names]}


def model_settings(params: dict | None, fingerprint: list[str] | None,
                   input_cut: str | None = None) -> dict:
    """The model's part of the settings: its params, its variables as 'name shape dtype'
    (placement.fingerprint), and how its input is cut (coverage.Plan.cut).

    Sync: every worker's input must be cut alike: a worker that cuts by file beside one that
    cuts by record, or one whose input cuts itself beside one the package cuts, would read
    some examples twice and others never."""
    return {"model_params": params, "model_variables": fingerprint,
            # (a task that reads no input of the package's, the question's, compares none)
            **({"input_cut": input_cut} if input_cut is not None else {})}


def _describe(key: str, value) -> str:
    if key == "model_params":
        return f"model params {_value(value)}"
    if key == "input_cut":
        return f"its input cut {_value(value)}"
    if key == "workers":
        return f"{value} worker{'s' if value != 1 else ''} in --worker-hosts"
    if key == "ps":
        return f"{value} ps task{'s' if value != 1 else ''} in --ps-hosts"
    return f"--{key.replace('_', '-')} {_value(value)}"


def _value(value) -> str:
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, list):  # a repeated option's values
        return " ".join(map(str, value)) or "none"
    return "none (the default)" if value is None else str(value)


def check_agreement(mine: dict, published: bytes | str, *, me: str, restarted_chief: bool) -> None:
    """Raises ConfigError naming every setting in which this task differs from the chief.

    Example: "worker 1 has --batch-size 50 but the chief has 100".
    """
    theirs = json.loads(published)
    who = "the running cluster (published by its chief)" if restarted_chief else "the chief"
    problems = [_variables_differ(me, value, theirs[key], who) if key == "model_variables" else
                f"{me} has {_describe(key, value)} but {who} has {_value(theirs[key])}"
                for key, value in mine.items() if key in theirs and theirs[key] != value]
    if problems:
        raise ConfigError("; ".join(problems))


def _variables_differ(me: str, mine: list[str] | None, theirs: list[str] | None,
                      who: str) -> str:
    """'worker 1 has another model than the chief: its variable ... ' naming the first
    variable (name, shape, dtype) that one has and the other has not."""
    mine, theirs = mine or [], theirs or []
    only_mine = sorted(set(mine) - set(theirs))
    only_theirs = sorted(set(theirs) - set(mine))
    return (f"{me} has another model than {who} (--model file or version): "
            + "; ".join([f"{me} has variable {only_mine[0]}"] * bool(only_mine)
                        + [f"{who} has variable {only_theirs[0]}"] * bool(only_theirs)))


def probe(address: str) -> str | None:
    """None if something accepts a TCP connection at `address`, else why not, in a few words."""
    try:
        host, port = cluster_lib.parse_address(address)
        with socket.create_connection((host, port), timeout=PROBE_SECS):
            return None
    except ConnectionRefusedError:
        return f"nothing listens at {address}"
    except socket.timeout:
        return f"{address} {NO_ANSWER}"
    except (OSError, ValueError) as e:
        return f"{address}{_UNREACHABLE}({getattr(e, 'strerror', None) or e})"


def silent_workers(cluster: cluster_lib.ClusterLayout) -> dict[int, str]:
    """The workers whose server does not answer now, {index: probe's why}; probed at once, so
    that many silent hosts cost one PROBE_SECS, not one each."""
    hosts = cluster.worker_hosts
    with concurrent.futures.ThreadPoolExecutor(min(len(hosts), 32)) as pool:
        whys = list(pool.map(probe, hosts))
    return {w: why for w, why in enumerate(whys) if why}


CUT_OFF = ("nor does this worker reach any other task of the cluster: its own network is the "
           "likely fault, so it names no ps as missing")


def cut_off(cluster: cluster_lib.ClusterLayout, worker: int, down: dict[int, str]) -> bool:
    """Whether worker `worker`, which found the ps in `down` ({index: probe's why}) silent and
    every other ps answering, reaches no other task of the cluster either: then its own network
    is the likely fault (a partition of this worker), not the ps's, and a timeout of its names
    no ps (the launcher restarts the task a timeout names). A refusal is an answer: something
    reached that host. With no other task to try, it cannot tell, and the ps are blamed."""
    if len(down) < cluster.num_ps or not all(_unanswered(why) for why in down.values()):
        return False
    others = [address for w, address in enumerate(cluster.worker_hosts) if w != worker]
    return bool(others) and not any(_reached(address) for address in others)


def _reached(address: str) -> bool:
    why = probe(address)
    return why is None or not _unanswered(why)


def _unanswered(why: str) -> bool:
    """Whether probe's `why` is a connection nothing answered, not even with a refusal."""
    return why.endswith(NO_ANSWER) or _UNREACHABLE in why


def missing(last_push: list[int], global_step: int, cluster: cluster_lib.ClusterLayout,
            *, probe_servers: bool = True) -> str:
    """Which workers the next update waits for, and why, for a timeout message.

    With R = N the update after `global_step` needs a push from every worker for local step
    `global_step`. If every worker has pushed and still no update came, the chief's update
    loop is what is missing.
    """
    behind = _behind(last_push, global_step)
    if not behind:
        return ("none: every worker pushed for update {0} but no update came; the chief "
                "(worker 0) runs the update loop and is missing".format(global_step + 1))
    parts = []
    for w in behind:
        why = f"no gradient for update {global_step + 1}"
        down = probe(cluster.address("worker", w)) if probe_servers else None
        parts.append(f"worker {w} ({why}; {down})" if down else f"worker {w} ({why})")
    return ", ".join(parts)


def missing_peers(last_push: list[int], global_step: int) -> list[str]:
    """The tasks `missing` names, as "worker N": those behind, or the chief when every worker
    has pushed (its update loop is what is missing). For TaskTimeout's `missing`."""
    behind = _behind(last_push, global_step)
    return [f"worker {w}" for w in behind] if behind else ["worker 0"]


def _behind(last_push: list[int], global_step: int) -> list[int]:
    """The workers that have not pushed for the update after `global_step`."""
    return [w for w, step in enumerate(last_push) if step != global_step]


def finish_barrier(run: Callable, m: Membership, *, index: int,
                   cluster: cluster_lib.ClusterLayout, timeout: float, log) -> list[int]:
    """Marks this worker FINISHED and waits until no worker is RUNNING; returns the lost ones.

    The chief decides who is lost: a worker whose server refuses connections or whose host
    is unreachable (LOST_PROBES probes in a row), or one that has not pushed for `timeout`
    seconds. A probe that only timed out proves nothing: 500 ms each way on a link takes a
    connection past PROBE_SECS while the worker is about to finish; silence is the no-push
    bound's to judge. The
    others only wait, so every task reads the same list. The chief's wait is bounded by
    `timeout`; the others allow `timeout` more for the chief, and otherwise say whom they
    were still waiting for.
    """
    n = cluster.num_workers
    # Sync: after its last push; no gradient of this worker is in flight any more.
    run(m.mark, {m.mark_worker: [index], m.mark_value: [FINISHED]})
    is_chief = index == 0
    started = time.monotonic()
    bound = timeout if is_chief else 2 * timeout
    failed_probes = [0] * n
    last_seen: dict[int, tuple[int, float]] = {}
    while True:
        finished, last_push = (list(map(int, x)) for x in run([m.finished, m.last_push]))
        running = [w for w in range(n) if finished[w] == RUNNING]
        if not running:  # Sync: the barrier opens: the counters are final for every reader
            return [w for w in range(n) if finished[w] == LOST]
        now = time.monotonic()
        marked = False
        if is_chief:  # Sync: only the chief declares a worker lost, so all read the same list
            for w in running:
                if last_seen.get(w, (None,))[0] != last_push[w]:
                    last_seen[w] = (last_push[w], now)
                down = probe(cluster.address("worker", w))
                if down and down.endswith(NO_ANSWER):
                    down = None  # a slow link, maybe: the no-push bound covers silence
                failed_probes[w] = failed_probes[w] + 1 if down else 0
                reason = down if failed_probes[w] >= LOST_PROBES else (
                    f"no push for {timeout:g} s" if now - last_seen[w][1] > timeout else None)
                if reason:
                    log.warning("worker %d is lost (%s); finishing without it", w, reason)
                    run(m.mark, {m.mark_worker: [w], m.mark_value: [LOST]})
                    marked = True
        # A worker silent for `timeout` is marked lost just as the chief's own bound expires:
        # read again, and the barrier opens on the mark.
        if now - started > bound and not marked:
            names = ", ".join(f"worker {w}" + (" (the chief)" if w == 0 else "")
                              for w in running)
            done = [w for w in range(n) if finished[w] == FINISHED]
            raise TaskTimeout(f"worker {index}: waited {bound:g} s at the finish for {names}; "
                              f"finished: {done}")
        time.sleep(POLL_SECS)
