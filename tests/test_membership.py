"""Fast tests for what faults rely on: rejoining, stopping on the token, lost workers in the
verdict, the settings tasks compare, timeout messages, logdir checks, the restarts column."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
import tensorflow as tf

from sync_mnist import membership, model, preflight, report, session, sync
from sync_mnist import verdict as verdict_lib
from sync_mnist.cli import cluster_layout, task_parser
from sync_mnist.options import train_config
from sync_mnist.cluster import ClusterLayout, free_ports
from sync_mnist.config import EXIT_FAILED, EXIT_TIMEOUT, EXIT_USAGE, ConfigError, TaskConfig
from sync_mnist.report import TaskResult

tf1 = tf.compat.v1


# ---------------------------------------------------------------------------- rejoining

@pytest.mark.parametrize("last_push, global_step, waiting, expected", [
    (-1, 0, 0, False),  # a fresh start: push
    (22, 23, 0, False),  # killed before its push for update 24: push it now
    (23, 23, 0, True),  # its push for update 24 is in; the update waits for the others
    (23, 24, 1, True),  # update 24 came; its token is left in the queue
])
def test_rejoin_takes_a_token_first_only_if_the_predecessor_pushed(last_push, global_step,
                                                                   waiting, expected):
    assert sync.rejoin_needed(last_push=last_push, global_step=global_step,
                              tokens_waiting=waiting) is expected


def test_train_loop_follows_the_token_back_after_a_restore():
    # The ps was lost after update 13 and restored from the checkpoint of step 10, so the push
    # meant for update 14 joined update 11.
    tokens = iter([11, 12, 13, 11, 12, 13, 14, 15])
    steps = []

    def run_step(step):
        steps.append(step)
        return next(tokens)

    local = sync.train_loop(run_step, start_step=10, planned=5, target=15, stop_on_token=True)
    assert local == 8
    # Each push trains on the batch of the update it is for, so redone updates see the same data.
    assert steps == [10, 11, 12, 13, 11, 12, 13, 14]


def test_train_loop_in_async_mode_counts_local_steps():
    tokens = iter(range(100, 200, 3))
    steps = []
    local = sync.train_loop(lambda s: steps.append(s) or next(tokens), start_step=4, planned=3,
                            target=5, stop_on_token=False)
    assert (local, steps) == (3, [4, 5, 6])


# ---------------------------------------------------------------------------- lost workers

def _counters(accepted, pushed, global_step):
    return verdict_lib.Counters(global_step=global_step, pushed=pushed, accepted=accepted,
                         repeat_updates=0, solo_updates=0)


def test_verdict_names_a_lost_backup_with_its_pushes():
    verdict = verdict_lib.verify(_counters([30, 30, 0], [31, 30, 17], 30), mode="sync",
                          target_steps=30, replicas_to_aggregate=2, lost=[2])
    assert verdict.synchronous
    assert verdict.line.startswith("synchronous with 1 backup worker: each of 30 updates")
    assert verdict.line.endswith("; worker 2 lost after 17 pushes")


def test_verdict_with_r_equal_n_stands_on_the_counters_when_a_worker_was_lost_at_the_end():
    verdict = verdict_lib.verify(_counters([30, 30], [30, 30], 30), mode="sync", target_steps=30,
                          replicas_to_aggregate=2, lost=[1])
    assert verdict.synchronous
    assert verdict.line.endswith("contributions [30, 30]; worker 1 lost after 30 pushes")


# ---------------------------------------------------------------------------- settings

def _config(*argv: str) -> TaskConfig:
    args = task_parser().parse_args(["--train-steps", "50", *argv])
    return TaskConfig(role=args.role, index=args.index, cluster=cluster_layout(args),
                      train=train_config(args))


HOSTS3 = ("--ps-hosts", "h:1", "--worker-hosts", "a:1,b:1,c:1")


def test_settings_leave_hosts_out_and_compare_equal_across_tasks():
    chief = membership.settings(_config("--role", "worker", "--index", "0", *HOSTS3), "synthetic")
    # Worker 1 calls its own host localhost: the same cluster.
    worker = membership.settings(_config("--role", "worker", "--index", "1", "--ps-hosts", "h:1",
                                         "--worker-hosts", "a:1,localhost:1,c:1"), "synthetic")
    assert worker == chief
    membership.check_agreement(worker, json.dumps(chief), me="worker 1", restarted_chief=False)
    ps = membership.settings(_config("--role", "ps", "--index", "0", *HOSTS3))
    # A ps compares what shapes its variables and decides its life: the cluster and the setup.
    assert ps == {"workers": 3, "ps": 1, "setup": "fixed"}
    membership.check_agreement(ps, json.dumps(chief), me="ps 0", restarted_chief=False)
    question_ps = membership.settings(_config("--role", "ps", "--index", "0", *HOSTS3,
                                              "--setup", "question"))
    with pytest.raises(ConfigError, match=r"^ps 0 has --setup question but the chief has "
                                          r"fixed$"):
        membership.check_agreement(question_ps, json.dumps(chief), me="ps 0",
                                   restarted_chief=False)


@pytest.mark.parametrize("argv, restarted, expected", [
    (("--batch-size", "50"), False, "worker 1 has --batch-size 50 but the chief has 100"),
    (("--learning-rate", "0.5", "--seed", "3"), False,
     "worker 1 has --learning-rate 0.5 but the chief has 0.001; "
     "worker 1 has --seed 3 but the chief has 0"),
    (("--wire-dtype", "bfloat16"), False,
     "worker 1 has --wire-dtype bfloat16 but the chief has float32"),
    (("--replicas-to-aggregate", "2"), True,
     "worker 1 has --replicas-to-aggregate 2 but the running cluster (published by its chief) "
     "has none (the default)"),
])
def test_a_difference_is_one_line_naming_both_values(argv, restarted, expected):
    chief = membership.settings(_config("--role", "worker", "--index", "0", *HOSTS3), "synthetic")
    mine = membership.settings(_config("--role", "worker", "--index", "1", *HOSTS3, *argv),
                               "synthetic")
    with pytest.raises(ConfigError) as raised:
        membership.check_agreement(mine, json.dumps(chief), me="worker 1",
                                   restarted_chief=restarted)
    assert str(raised.value) == expected


# ---------------------------------------------------------------------------- timeout messages

def test_missing_names_the_workers_the_next_update_waits_for_and_why():
    ports = free_ports(3)
    layout = ClusterLayout(("127.0.0.1:1",), tuple(f"127.0.0.1:{p}" for p in ports))
    with socket.socket() as alive:  # worker 1's server is up; worker 2's port is closed
        alive.bind(("127.0.0.1", ports[1]))
        alive.listen()
        text = membership.missing([23, 22, 22], 23, layout)
    assert text == (f"worker 1 (no gradient for update 24), worker 2 (no gradient for update "
                    f"24; nothing listens at 127.0.0.1:{ports[2]})")
    assert membership.missing([23, 23, 23], 23, layout, probe_servers=False) == (
        "none: every worker pushed for update 24 but no update came; the chief (worker 0) "
        "runs the update loop and is missing")


# ---------------------------------------------------------------------------- logdir

def test_check_logdir_names_an_unwritable_directory(tmp_path):
    preflight.check_logdir(tmp_path / "new" / "logdir")  # created
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=rf"^--logdir {blocker}/x is not writable: "
                                          "Not a directory$"):
        preflight.check_logdir(blocker / "x")


def test_check_checkpoint_names_the_variable_that_differs(tmp_path):
    with tf.Graph().as_default():
        tf1.get_variable("global_step", initializer=tf.constant(5, tf.int64))
        tf1.get_variable("counts", initializer=tf.zeros([2], tf.int64))
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            saver.save(sess, str(tmp_path / "model.ckpt"), global_step=5)
    with tf.Graph().as_default():
        same = [tf1.get_variable("global_step", [], tf.int64),
                tf1.get_variable("counts", [2], tf.int64)]
        session.check_checkpoint(tmp_path, same)
        session.check_checkpoint(tmp_path / "empty", same)  # no checkpoint: nothing to check
    with tf.Graph().as_default():
        other = [tf1.get_variable("global_step", [], tf.int64),
                 tf1.get_variable("extra", [4], tf.float32),
                 tf1.get_variable("counts", [3], tf.int64)]
        with pytest.raises(ConfigError) as raised:
            session.check_checkpoint(tmp_path, other)
        assert str(raised.value) == (f"--logdir {tmp_path} holds a checkpoint of a different "
                                     "model: counts has shape [2] there, [3] here")
        with pytest.raises(ConfigError, match="it has no variable extra \\(shape \\[4\\] here\\)"):
            session.check_checkpoint(tmp_path, other[:2])


def _save_step_5(logdir):
    with tf.Graph().as_default():
        tf1.get_variable("global_step", initializer=tf.constant(5, tf.int64))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            tf1.train.Saver().save(sess, str(logdir / "model.ckpt"), global_step=5)


@pytest.mark.parametrize("content", ["model_checkpoint_path: {{{", "", "\xff\xfe"],
                         ids=["unparsable", "empty", "not text"])
def test_check_checkpoint_refuses_a_checkpoint_file_tensorflow_would_ignore(tmp_path, content):
    # Before: TensorFlow logged "Checkpoint ignored" (hidden) and the chief silently started
    # over (unparsable), or a ValueError "Invalid checkpoint state" came through (empty).
    _save_step_5(tmp_path)
    (tmp_path / "checkpoint").write_bytes(content.encode("latin-1"))
    with tf.Graph().as_default():
        step = [tf1.get_variable("global_step", [], tf.int64)]
        with pytest.raises(ConfigError) as raised:
            session.check_checkpoint(tmp_path, step)
    assert str(raised.value) == (f"--logdir {tmp_path} has a checkpoint file that cannot be "
                                 f"read as one ({tmp_path / 'checkpoint'}): fix or remove it, "
                                 "or give a new --logdir")


def test_check_checkpoint_refuses_a_moved_logdir_whose_checkpoint_file_names_the_old_one(
        tmp_path):
    # A TF1 Saver writes absolute paths into the checkpoint file; after a move they point
    # nowhere, and before, TensorFlow then ignored the checkpoint: a silent fresh start.
    _save_step_5(tmp_path / "before")
    (tmp_path / "before").rename(tmp_path / "after")
    with tf.Graph().as_default():
        step = [tf1.get_variable("global_step", [], tf.int64)]
        with pytest.raises(ConfigError) as raised:
            session.check_checkpoint(tmp_path / "after", step)
    assert str(raised.value) == (
        f"--logdir {tmp_path / 'after'}: its checkpoint file ({tmp_path / 'after/checkpoint'}) "
        f"names {tmp_path / 'before/model.ckpt-5'}, which does not exist (was the directory "
        "moved?): fix or remove that file, or give a new --logdir")


@pytest.mark.cluster  # in-process servers
def test_a_chief_refuses_a_checkpoint_already_past_its_planned_updates(tmp_path):
    # Before: the chief resumed at global_step 10, trained nothing, and the verdict said
    # "global_step 10 != 4 planned": exit 3 (not synchronous) for what is bad input.
    from procs import local_cluster
    from sync_mnist import data, worker
    from sync_mnist.config import TrainConfig

    servers, spec = local_cluster(1)
    layout = ClusterLayout(tuple(spec.as_dict()["ps"]), tuple(spec.as_dict()["worker"]))

    def chief(train_steps: int) -> worker.WorkerRun:
        run = worker.WorkerRun(TaskConfig(role="worker", index=0, cluster=layout, train=TrainConfig(
            train_steps=train_steps, dataset="synthetic", logdir=tmp_path, timeout=30.0)))
        run.load_data(data.make_synthetic(0))
        return run

    # The chief's own model, at global_step 10, saved as a checkpoint in its --logdir.
    run = chief(10)
    run.make_graph()
    with run.graph.as_default(), tf1.Session(servers[0].target) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.assign(tf1.train.get_global_step(), 10))
        tf1.train.Saver().save(sess, str(tmp_path / "model.ckpt"), global_step=10)
    chief(10).make_graph()  # 10 planned: nothing past the plan
    with pytest.raises(ConfigError) as raised:
        chief(4).make_graph()
    assert str(raised.value) == (f"--logdir {tmp_path} holds a checkpoint at global_step 10, "
                                 "past the 4 updates planned (--train-steps or --epochs): give "
                                 "a new --logdir, or plan at least 10")


def _save_model(path, slices: int, hidden=(256, 256)):
    with tf.Graph().as_default():
        model.build_logits(tf1.placeholder(tf.float32, [None, 784]), hidden, slices=slices)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            tf1.train.Saver().save(sess, str(path / "model.ckpt"))


@pytest.mark.parametrize("saved_slices, slices", [(1, 3), (3, 1), (2, 3)])
def test_check_checkpoint_takes_a_sliced_variable_whole(tmp_path, saved_slices, slices):
    # A checkpoint holds a partitioned variable whole: written with one number of ps, it
    # passes with another (test_partition.py restores it).
    _save_model(tmp_path, saved_slices)
    with tf.Graph().as_default():
        model.build_logits(tf1.placeholder(tf.float32, [None, 784]), slices=slices)
        session.check_checkpoint(tmp_path, tf1.global_variables())
    with tf.Graph().as_default():  # another model is still named, whole
        model.build_logits(tf1.placeholder(tf.float32, [None, 784]), (128, 256), slices=slices)
        with pytest.raises(ConfigError) as raised:
            session.check_checkpoint(tmp_path, tf1.global_variables())
    assert str(raised.value) == (f"--logdir {tmp_path} holds a checkpoint of a different model: "
                                 "layer0/weights has shape [784, 256] there, [784, 128] here")


# ---------------------------------------------------------------------------- the table

def test_table_gains_a_restarts_column_only_when_a_task_was_restarted():
    results = [TaskResult(role="worker", index=0, mode="sync", local_steps=30),
               TaskResult(role="worker", index=1, mode="sync", local_steps=12, restarts=1),
               TaskResult(role="ps", index=0, mode="sync")]
    lines = report.format_table(results).splitlines()
    assert lines[0].split()[:4] == ["task", "exit", "restarts", "ready"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["worker", "0", "0", "0"], ["worker", "1", "0", "1"], ["ps", "0", "0", "0"]]
    results[1].restarts = 0
    assert "restarts" not in report.format_table(results)


# ---------------------------------------------------------------------------- launcher supervision

class _FakeTask:
    """Stands in for launch._Task: each start exits with the next code of `codes`."""

    def __init__(self, role, index, *codes):
        self.role, self.index, self.tag = role, index, f"{role} {index}"
        self.codes, self.starts, self.lost, self.spent = list(codes), 1, False, False
        self.spawned, self.progressed = time.monotonic(), None

    def poll(self):
        return self.codes[self.starts - 1]

    def restart(self):
        self.starts += 1

    def result(self):
        return TaskResult(role=self.role, index=self.index, mode="sync")

    def last_sign_of_life(self):
        return time.monotonic()


def _wait(tasks, max_restarts=0, spare_workers=0):
    from sync_mnist.launcher import launch

    # The launcher's restart policy and wait loop, private to it, driven here with fake tasks.
    policy = launch._Policy(tasks, max_restarts=max_restarts, spare_workers=spare_workers,
                            timeout=10.0)
    return launch._wait(tasks, policy, ps_serve_forever=False)


def test_launcher_restarts_dead_tasks_within_its_budget_and_never_bad_input():
    # The chief still runs: a ps that dies once a worker has ended 0 is not restarted.
    ps, chief, worker = (_FakeTask("ps", 0, -9, 0), _FakeTask("worker", 0, None),
                         _FakeTask("worker", 1, EXIT_TIMEOUT, EXIT_FAILED, 0))
    # Three deaths, two restarts allowed: the third stops the cluster.
    assert _wait([ps, chief, worker], max_restarts=2) is worker
    assert (ps.starts, worker.starts) == (2, 2)
    # Exit 2 (bad input) and 3 (not synchronous) are final: a restart would not mend them.
    bad = _FakeTask("worker", 1, EXIT_USAGE, 0)
    assert _wait([bad], max_restarts=5) is bad
    assert bad.starts == 1


def test_launcher_goes_on_without_a_dead_backup_worker_but_not_without_the_chief():
    chief, backup = _FakeTask("worker", 0, 0), _FakeTask("worker", 2, -9)
    assert _wait([chief, backup], spare_workers=1) is None
    assert backup.lost
    dead_chief = _FakeTask("worker", 0, -9)
    assert _wait([dead_chief], spare_workers=1) is dead_chief
    # With R = N there is no spare: a dead worker stops the cluster.
    again = _FakeTask("worker", 2, -9)
    assert _wait([again], spare_workers=0) is again


# ---------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("save_steps, save_secs, every", [(10, None, (None, 10)),
                                                         (10, 2.5, (2.5, None))])
def test_chief_saves_every_save_secs_when_given_else_every_save_steps(tmp_path, save_steps,
                                                                      save_secs, every):
    server = tf.distribute.Server.create_local_server()
    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()
        transient = tf1.get_variable("transient", initializer=tf.constant(-1))
        sess = session.monitored_session(server.target, is_chief=True, hooks=[], config=None,
                                         timeout=10, checkpoint_dir=str(tmp_path),
                                         save_steps=save_steps, save_secs=save_secs,
                                         transient=[transient])
        with sess:
            (saver_hook,) = [h.hook for h in sess._hooks  # pylint: disable=protected-access
                             if isinstance(h.hook, tf1.train.CheckpointSaverHook)]
            timer = saver_hook._timer  # pylint: disable=protected-access
            assert (timer._every_secs, timer._every_steps) == every
    # The checkpoint leaves the transient variable out.
    names = [name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(tmp_path))]
    assert names == ["global_step"]


# ---------------------------------------------------------------------------- finish barrier

def test_the_chief_finishes_without_a_backup_silent_for_the_timeout(monkeypatch):
    """A frozen backup worker (SIGSTOP: its server still accepts connections) is declared lost
    when it has not pushed for --timeout, which is also the chief's own bound at the barrier:
    the barrier must open on the mark, not time out."""
    n = 3
    m = membership.Membership(*(object() for _ in range(7)))
    finished = [membership.RUNNING, membership.FINISHED, membership.RUNNING]
    last_push = [40, 40, 38]

    def run(fetches, feed=None):
        if fetches is m.mark:
            w, value = feed[m.mark_worker][0], feed[m.mark_value][0]
            finished[w] = max(finished[w], value)
            return None
        assert fetches == [m.finished, m.last_push]
        return [list(finished), list(last_push)]

    monkeypatch.setattr(membership, "probe", lambda address: None)  # stopped, yet listening
    monkeypatch.setattr(membership, "POLL_SECS", 0.05)
    layout = ClusterLayout(("127.0.0.1:1",), tuple(f"127.0.0.1:{p}" for p in (2, 3, 4)))
    lost = membership.finish_barrier(run, m, index=0, cluster=layout, timeout=0.5,
                                     log=logging.getLogger("test"))
    assert lost == [2]
    assert finished == [membership.FINISHED, membership.FINISHED, membership.LOST]
