"""Where a task learns its place: TF_CONFIG alone (a TFJob pod), or an srun step (Slurm).

Fast tests: `cli.main` runs in-process with `cli.run_task` replaced by a recorder, so each
case asserts the typed config a task would have run with. The Slurm environment is set as
TensorFlow's own SlurmClusterResolver test sets it, plus what srun gives every task
(SLURMD_NODENAME, SLURM_LOCALID), and each rank must resolve to its own task.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import types

import pytest

from sync_mnist.task import cli
from sync_mnist.core import cluster, config
from sync_mnist.core.cluster import ClusterError

RAN = 99  # what the recorder returns: validation passed and the task would have run


@pytest.fixture
def ran(monkeypatch):
    """The TaskConfigs that cli.main would have run; the environment starts clean."""
    for name in ("TF_CONFIG", "SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                 "SLURM_STEP_NUM_TASKS", "SLURMD_NODENAME", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    configs = []

    def run_task(task_config, verbose):
        configs.append(task_config)
        return RAN

    monkeypatch.setattr(cli, "run_task", run_task)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sigterm = signal.getsignal(signal.SIGTERM)
    yield configs
    signal.signal(signal.SIGTERM, sigterm)
    root.handlers[:], root.level = handlers, level


TRAIN = ["--dataset", "synthetic", "--train-steps", "5"]

# A TFJob with a Chief replica, PS 1 and Worker 2, as the operator writes TF_CONFIG.
CHIEF_LAYOUT = {"chief": ["j-chief-0.ns.svc:2222"], "ps": ["j-ps-0.ns.svc:2222"],
                "worker": ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"]}


def _tf_config(task_type: str, index: int, spec: dict = CHIEF_LAYOUT) -> str:
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index},
                       "environment": "cloud"})


# ---------------------------------------------------------------------------- TF_CONFIG

@pytest.mark.parametrize("task_type, index, role, expected_index", [
    ("chief", 0, "worker", 0), ("worker", 0, "worker", 1), ("worker", 1, "worker", 2),
    ("ps", 0, "ps", 0)])
def test_tf_config_alone_places_every_pod_of_a_chief_layout(task_type, index, role,
                                                            expected_index, ran, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", _tf_config(task_type, index))
    assert cli.main(TRAIN) == RAN  # the same command in every pod
    (task,) = ran
    assert (task.role, task.index) == (role, expected_index)
    assert task.is_chief == (task_type == "chief")
    assert task.cluster.as_dict() == {
        "ps": CHIEF_LAYOUT["ps"], "worker": CHIEF_LAYOUT["chief"] + CHIEF_LAYOUT["worker"]}


def test_role_and_index_beside_tf_config_are_accepted_when_they_agree(ran, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", _tf_config("worker", 1))
    assert cli.main(["--role", "worker", "--index", "2", *TRAIN]) == RAN
    assert cli.main(["--index", "2", *TRAIN]) == RAN
    assert [(t.role, t.index) for t in ran] == [("worker", 2), ("worker", 2)]


def test_host_flags_still_win_over_tf_config(ran, monkeypatch):
    # As before: with --ps-hosts/--worker-hosts, TF_CONFIG is not read, and the task is named.
    monkeypatch.setenv("TF_CONFIG", "not even json")
    assert cli.main(["--role", "worker", "--index", "1", "--ps-hosts", "p:1",
                     "--worker-hosts", "w:1,w:2", *TRAIN]) == RAN
    assert (ran[0].role, ran[0].index, ran[0].cluster.worker_hosts) == ("worker", 1,
                                                                         ("w:1", "w:2"))


def test_role_and_index_without_environment_keep_the_localhost_defaults(ran, monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "3")  # e.g. a shell in `srun --pty bash`
    assert cli.main(["--role", "worker", "--index", "1", *TRAIN]) == RAN
    assert ran[0].cluster.as_dict() == {
        "ps": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224", "localhost:2225"]}


# ---------------------------------------------------------------------------- Slurm

def _srun_env(monkeypatch, nodelist: str, tasks_per_node: str, rank: int, node: str | None,
              local: int | None) -> None:
    """The variables srun gives a task (SLURM_STEP_NUM_TASKS is not needed but is real)."""
    counts = cluster_counts(tasks_per_node)
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(sum(counts)))
    monkeypatch.setenv("SLURM_STEP_NODELIST", nodelist)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", tasks_per_node)
    for name, value in (("SLURMD_NODENAME", node), ("SLURM_LOCALID", local)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))


def cluster_counts(tasks_per_node: str) -> list[int]:
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

    return slurm_cluster_resolver.expand_tasks_per_node(tasks_per_node)


# TensorFlow's testMultiTaskPerNodeRetrieval layout: 5 tasks, 2 + 2 + 1 over three nodes, with
# srun's block distribution: (rank, node, local id) -> the task it must be.
MULTI = [(0, "t02n13", 0, ("ps", 0)), (1, "t02n13", 1, ("worker", 0)),
         (2, "t02n41", 0, ("worker", 1)), (3, "t02n41", 1, ("worker", 2)),
         (4, "t02n43", 0, ("worker", 3))]


@pytest.mark.parametrize("rank, node, local, task", MULTI)
def test_each_rank_of_an_srun_step_resolves_to_its_own_task(rank, node, local, task, ran,
                                                            monkeypatch):
    _srun_env(monkeypatch, "t02n13,t02n41,t02n43", "2(x2),1", rank, node, local)
    assert cli.main(TRAIN) == RAN  # no --role, --index, hosts or TF_CONFIG
    (config_,) = ran
    assert (config_.role, config_.index) == task
    assert config_.cluster.as_dict() == {
        "ps": ["t02n13:2222"],
        "worker": ["t02n13:2223", "t02n41:2222", "t02n41:2223", "t02n43:2222"]}
    # The address it will serve on is on its own node, at base port + its local id.
    assert config_.cluster.address(*task) == f"{node}:{2222 + local}"


def test_several_tasks_on_one_node_get_consecutive_ports_from_base_port(ran, monkeypatch):
    places = []
    for rank in range(6):
        _srun_env(monkeypatch, "cn07", "6", rank, "cn07", rank)
        assert cli.main(["--ps", "2", "--base-port", "31000", *TRAIN]) == RAN
        places.append((ran[-1].role, ran[-1].index))
    assert places == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2),
                      ("worker", 3)]
    assert ran[0].cluster.as_dict() == {"ps": ["cn07:31000", "cn07:31001"],
                                        "worker": [f"cn07:{p}" for p in range(31002, 31006)]}
    assert all(c.cluster == ran[0].cluster for c in ran)  # every rank sees the same cluster


def test_nodes_are_filled_in_slurms_order_not_as_their_names_sort(ran, monkeypatch):
    # Slurm orders n9 before n10, and puts ranks 0-1 on n9; as text, n10 sorts first (which
    # TensorFlow's SlurmClusterResolver does, giving rank 0 n10's address).
    for rank, node, local in ((0, "n9", 0), (1, "n9", 1), (2, "n10", 0), (3, "n10", 1)):
        _srun_env(monkeypatch, "n[9-10]", "2(x2)", rank, node, local)
        assert cli.main(TRAIN) == RAN
    assert [(c.role, c.index) for c in ran] == [("ps", 0), ("worker", 0), ("worker", 1),
                                                ("worker", 2)]
    assert ran[0].cluster.as_dict() == {"ps": ["n9:2222"],
                                        "worker": ["n9:2223", "n10:2222", "n10:2223"]}
    assert all(c.cluster == ran[0].cluster for c in ran)


SLURM_ERRORS = {
    "too few tasks": (dict(nodelist="n1", tasks="1", rank=0, node="n1", local=0), [],
                      "error: the srun step has 1 task; --ps 1 leaves no worker (start at "
                      "least 2 tasks)"),
    "too few for --ps": (dict(nodelist="n1", tasks="3", rank=0, node="n1", local=0),
                         ["--ps", "3"],
                         "error: the srun step has 3 tasks; --ps 3 leaves no worker (start at "
                         "least 4 tasks)"),
    "zero ps": (dict(nodelist="n1", tasks="3", rank=0, node="n1", local=0), ["--ps", "0"],
                "error: --ps 0: a cluster needs at least one ps task"),
    "ports beyond 65535": (dict(nodelist="n1", tasks="3", rank=0, node="n1", local=0),
                           ["--base-port", "65534"],
                           "error: --base-port 65534: 3 tasks on a node need ports 65534-65536, "
                           "outside 1-65535"),
    "nodes and counts disagree": (dict(nodelist="n[1-3]", tasks="2(x2)", rank=0, node="n1",
                                       local=0), [],
                                  "error: SLURM_STEP_NODELIST names 3 nodes but "
                                  "SLURM_STEP_TASKS_PER_NODE counts tasks for 2"),
    # Before: TensorFlow's resolver raised RuntimeError ("Requested 4 tasks but only 2 were
    # assigned"), a traceback.
    "a node listed twice": (dict(nodelist="n1,n1", tasks="2(x2)", rank=0, node="n1", local=0),
                            [], "error: SLURM_STEP_NODELIST 'n1,n1' names node n1 more than "
                                "once"),
    "a range of a billion nodes": (dict(nodelist="n[1-999999999]", tasks="1", rank=0, node="n1",
                                        local=0), [],
                                   "error: SLURM_STEP_NODELIST 'n[1-999999999]' names more "
                                   "than 65536 nodes or tasks"),
    # Ranks dealt round-robin (srun --distribution=cyclic): rank 1 runs on n2, but in blocks
    # it would have n1's second port.
    "cyclic distribution": (dict(nodelist="n[1-2]", tasks="2(x2)", rank=1, node="n2", local=0),
                            [], "error: Slurm rank 1 runs on n2 (local task 0), but a block "
                            "distribution makes it worker 0 at n1:2223: the ranks must fill the "
                            "nodes in order (srun --distribution=block)"),
}


@pytest.mark.parametrize("env, argv, expected", SLURM_ERRORS.values(), ids=SLURM_ERRORS.keys())
def test_unusable_srun_steps_are_one_line_errors(env, argv, expected, ran, monkeypatch, capsys):
    _srun_env(monkeypatch, env["nodelist"], env["tasks"], env["rank"], env["node"], env["local"])
    assert cli.main([*argv, *TRAIN]) == config.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [expected]
    assert ran == []


def test_a_malformed_nodelist_is_named(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "0")
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2", "SLURM_STEP_TASKS_PER_NODE": "2"}
    with pytest.raises(ClusterError, match=r'^Invalid hostlist format "n\[1-2"'):
        cluster.from_slurm(env)


def test_slurm_variables_missing_are_named(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "0")
    with pytest.raises(ClusterError) as raised:
        cluster.from_slurm({"SLURM_PROCID": "0"})
    assert str(raised.value) == ("SLURM_STEP_NODELIST is not set: not inside an srun step? "
                                 "(SLURM_PROCID is '0')")


# ---------------------------------------------------------------------------- exit codes

def test_exit_codes_follow_the_tfjob_exitcode_policy():
    # Under restartPolicy ExitCode, 1-127 are permanent and 128-255 are retried.
    def retried(code):
        return 128 <= code <= 255

    permanent = (config.EXIT_FAILED, config.EXIT_USAGE, config.EXIT_NOT_SYNCHRONOUS)
    retryable = (config.EXIT_TIMEOUT, config.EXIT_PEER_LOST, config.EXIT_INTERRUPTED)
    assert not any(retried(c) for c in permanent)
    assert all(retried(c) for c in retryable)
    # Ours sit above 128 + any signal number (SIGRTMAX is 64), so no code reads as a signal.
    assert min(config.EXIT_TIMEOUT, config.EXIT_PEER_LOST) > 128 + 64
    assert len({config.EXIT_OK, *permanent, *retryable}) == 7


def test_a_lost_peer_is_retryable_and_other_tensorflow_errors_are_not():
    import tensorflow as tf

    # cli's own classifier, tested alone: the whole path is in tests/cluster/test_task_process.py.
    assert cli._peer_lost(tf.errors.UnavailableError(None, None, "Socket closed"))
    assert cli._peer_lost(tf.errors.AbortedError(None, None, "Session handle not found"))
    assert cli._peer_lost(tf.errors.CancelledError(None, None, "Graph execution error"))
    assert not cli._peer_lost(tf.errors.InvalidArgumentError(None, None, "shape"))
    assert not cli._peer_lost(ValueError("a bug"))


def _landing_at_once(calls):
    """A stand-in that records its calls and, on the first, has the stop land at once, in the
    frame of whoever called it (as a signal would while that frame runs)."""
    def land(*args):
        calls.append(args)
        if len(calls) == 1:
            cli._raise_interrupt(signal.SIGTERM, sys._getframe(1))
    return land


def test_a_stop_delivered_again_while_the_unraisable_hook_runs_is_sent_again_not_raised(
        monkeypatch):
    # Seen once under load (test_task_process's destructor test): the stop the hook sent
    # again arrived while the hook still ran; raised there, it was lost like the first one.
    sent = []
    monkeypatch.setattr(cli, "_deliver_again", _landing_at_once(sent))
    cli._interrupt_again(types.SimpleNamespace(exc_value=KeyboardInterrupt()))
    assert len(sent) == 2  # sent again, not raised and lost


def _raised_from(cause: BaseException, error: Exception) -> Exception:
    try:
        raise error from cause
    except Exception as e:
        return e


def test_a_stop_that_c_code_passed_on_as_another_error_is_delivered_again(monkeypatch):
    # .ci/run: a SIGTERM landed in an import TensorFlow's C++ made while the graph was built;
    # CPython raised a SystemError caused by the KeyboardInterrupt, the C++ sent it to
    # sys.unraisablehook, and the task, its stop lost, ran on past the test's 240 s.
    sent = []
    monkeypatch.setattr(cli, "_deliver_again", lambda: sent.append(1))
    landed = _raised_from(KeyboardInterrupt(), SystemError(
        "<built-in function __import__> returned a result with an exception set"))
    cli._interrupt_again(types.SimpleNamespace(exc_type=SystemError, exc_value=landed))
    assert sent == [1]
    wrapped = RuntimeError("MISMATCH of original and normalized active exception types: "
                           "ORIGINAL KeyboardInterrupt")  # pybind11's wrapping
    cli._interrupt_again(types.SimpleNamespace(exc_type=RuntimeError, exc_value=wrapped))
    assert sent == [1, 1]
    assert cli._interrupt_inside(_raised_from(KeyboardInterrupt(), ImportError("init failed")))
    other = []
    monkeypatch.setattr(sys, "__unraisablehook__", lambda u: other.append(u.exc_type))
    cli._interrupt_again(types.SimpleNamespace(exc_type=SystemError, exc_value=_raised_from(
        ValueError("a bug"), SystemError("returned a result with an exception set"))))
    assert sent == [1, 1] and other == [SystemError]  # any other error is printed as ever


def test_a_stop_that_lands_while_it_is_being_sent_again_is_sent_again_not_raised(monkeypatch):
    started = []
    monkeypatch.setattr(cli._thread, "start_new_thread", _landing_at_once(started))
    cli._deliver_again()
    assert len(started) == 2
    with pytest.raises(KeyboardInterrupt):  # anywhere else it stops the task as always
        cli._raise_interrupt(signal.SIGTERM, sys._getframe())
