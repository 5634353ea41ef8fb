"""Fast unit tests: cluster parsing, ports and the validated configs. No TensorFlow sessions."""

from __future__ import annotations

import dataclasses
import json
import random
import socket
import time

import pytest

from sync_mnist.core import cluster
from sync_mnist.core.cluster import ClusterError, ClusterLayout
from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig


def _layout(num_ps: int = 1, num_workers: int = 3) -> ClusterLayout:
    # Nothing binds these addresses: the layout only parses them.
    return ClusterLayout(tuple(f"ps{i}.example:2000" for i in range(num_ps)),
                         tuple(f"w{i}.example:2000" for i in range(num_workers)))


# ---------------------------------------------------------------------------- parse_address

@pytest.mark.parametrize("address, expected", [
    ("localhost:2222", ("localhost", 2222)),
    ("10.0.0.7:1", ("10.0.0.7", 1)),
    ("h:65535", ("h", 65535)),
    ("[::1]:8470", ("::1", 8470)),  # brackets of an IPv6 literal are dropped
])
def test_parse_address_accepts_host_and_port(address, expected):
    assert cluster.parse_address(address) == expected


@pytest.mark.parametrize("address, message", [
    ("host", "malformed host:port 'host'"),
    ("host:", "malformed host:port 'host:'"),
    (":2222", "malformed host:port ':2222'"),
    ("host:abc", "malformed host:port 'host:abc'"),
    ("host:-1", "malformed host:port 'host:-1'"),
    ("host:0", "port 0 in 'host:0' is outside 1-65535"),
    ("host:70000", "port 70000 in 'host:70000' is outside 1-65535"),
])
def test_parse_address_rejects_malformed_naming_the_value(address, message):
    with pytest.raises(ClusterError) as raised:
        cluster.parse_address(address)
    assert str(raised.value) == message


def test_parse_address_rejects_a_non_ascii_digit_as_cluster_error():
    with pytest.raises(ClusterError, match=r"malformed host:port 'host:²'"):
        cluster.parse_address("host:²")


# ---------------------------------------------------------------------------- ClusterLayout

def test_default_hosts_put_ps_first_then_workers_on_consecutive_ports():
    assert cluster.default_hosts(1, 3) == (
        ("localhost:2222",), ("localhost:2223", "localhost:2224", "localhost:2225"))
    assert cluster.default_hosts(2, 2, base_port=5000, host="h") == (
        ("h:5000", "h:5001"), ("h:5002", "h:5003"))


def test_layout_parse_splits_and_strips_comma_separated_lists():
    layout = ClusterLayout.parse("p:1", " w:1 , w:2,w:3")
    assert layout.ps_hosts == ("p:1",)
    assert layout.worker_hosts == ("w:1", "w:2", "w:3")
    assert (layout.num_ps, layout.num_workers) == (1, 3)
    assert layout.address("worker", 2) == "w:3"
    assert layout.as_dict() == {"ps": ["p:1"], "worker": ["w:1", "w:2", "w:3"]}
    assert layout.device_filters("worker", 1) == ["/job:ps", "/job:worker/task:1"]


@pytest.mark.parametrize("ps, workers, message", [
    (("h:1",), ("h:2", "h:1"), "h:1 is given twice (ps 0 and worker 1)"),
    (("h:1",), ("h:2", "h:3", "h:2"), "h:2 is given twice (worker 0 and worker 2)"),
    (("h:1", "h:1"), ("h:2",), "h:1 is given twice (ps 0 and ps 1)"),
])
def test_layout_rejects_a_duplicate_address_naming_both_tasks(ps, workers, message):
    with pytest.raises(ClusterError) as raised:
        ClusterLayout(ps, workers)
    assert str(raised.value) == message


def test_layout_rejects_the_same_port_written_with_a_leading_zero():
    with pytest.raises(ClusterError, match="given twice"):
        ClusterLayout(("h:2222",), ("h:02222", "h:2223"))


@pytest.mark.parametrize("ps, workers, message", [
    ((), ("h:2",), "the cluster needs at least one ps task"),
    (("h:1",), (), "the cluster needs at least one worker task"),
    (("h:1",), ("h:2", "h"), "malformed host:port 'h'"),
])
def test_layout_rejects_empty_roles_and_bad_addresses(ps, workers, message):
    with pytest.raises(ClusterError) as raised:
        ClusterLayout(ps, workers)
    assert str(raised.value) == message


@pytest.mark.parametrize("ps, workers, message", [
    ("p:1", "w:1,,w:2", "--worker-hosts 'w:1,,w:2' has an empty entry"),
    ("p:1,", "w:1", "--ps-hosts 'p:1,' has an empty entry"),
])
def test_layout_parse_rejects_an_empty_entry_naming_the_flag(ps, workers, message):
    with pytest.raises(ClusterError) as raised:
        ClusterLayout.parse(ps, workers)
    assert str(raised.value) == message


@pytest.mark.parametrize("role, index, message", [
    ("boss", 0, "role 'boss' is not one of: ps, worker"),
    ("worker", 5, "worker index 5 is outside the cluster (3 worker tasks: 0-2)"),
    ("worker", 3, "worker index 3 is outside the cluster (3 worker tasks: 0-2)"),
    ("worker", -1, "worker index -1 is outside the cluster (3 worker tasks: 0-2)"),
    ("ps", 1, "ps index 1 is outside the cluster (1 ps task: 0-0)"),
])
def test_check_task_names_the_role_index_and_valid_range(role, index, message):
    with pytest.raises(ClusterError) as raised:
        _layout().check_task(role, index)
    assert str(raised.value) == message


def test_check_task_accepts_every_task_of_the_cluster():
    layout = _layout(num_ps=2, num_workers=3)
    for role, count in (("ps", 2), ("worker", 3)):
        for index in range(count):
            layout.check_task(role, index)  # raises if the boundary is off by one


# ---------------------------------------------------------------------------- TF_CONFIG

def _tf_config(cluster_spec, task=None) -> str:
    value = {"cluster": cluster_spec}
    if task is not None:
        value["task"] = task
    return json.dumps(value)


def test_from_tf_config_reads_ps_and_worker_tasks():
    spec = {"ps": ["p:1"], "worker": ["w:1", "w:2"]}
    layout, role, index = cluster.from_tf_config(_tf_config(spec, {"type": "worker", "index": 1}))
    assert layout == ClusterLayout(("p:1",), ("w:1", "w:2"))
    assert (role, index) == ("worker", 1)
    _, role, index = cluster.from_tf_config(_tf_config(spec, {"type": "ps", "index": 0}))
    assert (role, index) == ("ps", 0)


def test_from_tf_config_makes_the_chief_worker_0_and_shifts_the_workers():
    spec = {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1", "w:2"]}
    layout, role, index = cluster.from_tf_config(_tf_config(spec, {"type": "chief", "index": 0}))
    assert layout.worker_hosts == ("c:1", "w:1", "w:2")
    assert (role, index) == ("worker", 0)
    # TF_CONFIG's worker 0 is the second worker of the shared index space.
    _, role, index = cluster.from_tf_config(_tf_config(spec, {"type": "worker", "index": 0}))
    assert (role, index) == ("worker", 1)
    _, role, index = cluster.from_tf_config(_tf_config(spec, {"type": "worker", "index": 1}))
    assert (role, index) == ("worker", 2)


def test_from_tf_config_reads_the_operators_shapes():
    # A TFJob with PS 1 + Worker 3 and no Chief replica, exactly as the operator writes it.
    text = ('{"cluster":{"ps":["j-ps-0.ns.svc:2222"],"worker":["j-worker-0.ns.svc:2222",'
            '"j-worker-1.ns.svc:2222","j-worker-2.ns.svc:2222"]},'
            '"task":{"type":"worker","index":2},"environment":"cloud"}')
    layout, role, index = cluster.from_tf_config(text)
    assert layout.as_dict() == {"ps": ["j-ps-0.ns.svc:2222"],
                                "worker": [f"j-worker-{i}.ns.svc:2222" for i in range(3)]}
    assert (role, index) == ("worker", 2)


@pytest.mark.parametrize("chief_job", cluster.CHIEF_JOBS)
def test_from_tf_config_places_every_task_of_the_chief_layout(chief_job):
    # TFJob's Chief (or older Master) replica: one index space, the chief first.
    spec = {chief_job: ["j-chief-0:2222"], "ps": ["j-ps-0:2222"],
            "worker": ["j-worker-0:2222", "j-worker-1:2222"]}
    expected = {(chief_job, 0): ("worker", 0), ("worker", 0): ("worker", 1),
                ("worker", 1): ("worker", 2), ("ps", 0): ("ps", 0)}
    for (task_type, task_index), place in expected.items():
        text = json.dumps({"cluster": spec, "task": {"type": task_type, "index": task_index},
                           "environment": "cloud"})
        layout, role, index = cluster.from_tf_config(text)
        assert (role, index) == place
        assert layout.worker_hosts == ("j-chief-0:2222", "j-worker-0:2222", "j-worker-1:2222")
        # Each task's own address is the one TF_CONFIG gave it.
        assert layout.address(role, index) == spec[task_type][task_index]


EVALUATOR = ("TF_CONFIG has an evaluator (a TFJob Evaluator replica): sync-mnist has no "
             "evaluator task; the chief evaluates on the test set at the end; remove that replica")


@pytest.mark.parametrize("text, message", [
    ("not json", "TF_CONFIG is not valid JSON (Expecting value at character 0)"),
    ('{"cluster": ', "TF_CONFIG is not valid JSON (Expecting value at character 12)"),
    ("[]", 'TF_CONFIG has no "cluster" object'),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"]}),
     'TF_CONFIG has no "task" with "type" and "index" for this process'),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"]}, {"type": "worker"}),
     'TF_CONFIG has no "task" with "type" and "index" for this process'),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1", "w:2"]}, {"type": "worker", "index": 2}),
     "worker index 2 is outside the cluster (2 worker tasks: 0-1)"),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"]}, {"type": "boss", "index": 0}),
     "role 'boss' is not one of: ps, worker"),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"]}, {"type": "evaluator", "index": 0}),
     EVALUATOR),
    # The TFJob operator lists an Evaluator replica in every task's cluster.
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
                {"type": "worker", "index": 0}), EVALUATOR),
    # enableDynamicWorker: a "sparseCluster" whose workers are a map, or a worker map.
    (json.dumps({"sparseCluster": {"ps": ["p:1"], "worker": {"1": "w:1"}},
                 "task": {"type": "worker", "index": 1}}),
     'TF_CONFIG has a "sparseCluster" (a TFJob with enableDynamicWorker): synchronous training '
     "needs a fixed list of workers; set enableDynamicWorker to false"),
    (_tf_config({"ps": ["p:1"], "worker": {"0": "w:1", "1": "w:2"}},
                {"type": "worker", "index": 0}),
     "TF_CONFIG's 'worker' job is a map, not a list (a TFJob with enableDynamicWorker): "
     "synchronous training needs a fixed list of workers; set enableDynamicWorker to false"),
    (_tf_config({"ps": "p:1", "worker": ["w:1"]}, {"type": "worker", "index": 0}),
     "TF_CONFIG's 'ps' job is not a list of host:port strings: 'p:1'"),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"], "learner": ["l:1"]},
                {"type": "worker", "index": 0}),
     "TF_CONFIG has a job 'learner': sync-mnist runs only ps, worker and chief tasks"),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"]}, {"type": "worker", "index": True}),
     "TF_CONFIG task index True is not an integer"),
    # The Chief layout: TF_CONFIG's own worker indices are checked against the worker job.
    (_tf_config({"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1", "w:2"]},
                {"type": "worker", "index": 2}),
     'TF_CONFIG says this task is worker 2, outside its "worker" job (2 tasks: 0-1)'),
    (_tf_config({"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1"]},
                {"type": "chief", "index": 1}),
     "TF_CONFIG says this task is chief 1; the only chief task is 0"),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"]}, {"type": "chief", "index": 0}),
     "TF_CONFIG says this task is chief 0, but its cluster has no 'chief' job"),
    (_tf_config({"chief": ["c:1", "c:2"], "ps": ["p:1"], "worker": ["w:1"]},
                {"type": "chief", "index": 0}),
     "TF_CONFIG has 2 chief tasks (c:1, c:2); a cluster has at most one"),
    (_tf_config({"chief": ["c:1"], "master": ["m:1"], "ps": ["p:1"], "worker": ["w:1"]},
                {"type": "chief", "index": 0}),
     "TF_CONFIG has 2 chief tasks (c:1, m:1); a cluster has at most one"),
    (_tf_config({"ps": ["p:1"], "worker": ["w:1"]}, {"type": "worker", "index": "0"}),
     "TF_CONFIG task index '0' is not an integer"),
    (_tf_config({"worker": ["w:1"]}, {"type": "worker", "index": 0}),
     "the cluster needs at least one ps task"),
])
def test_from_tf_config_rejects_unusable_values(text, message):
    with pytest.raises(ClusterError) as raised:
        cluster.from_tf_config(text)
    assert str(raised.value) == message


# ---------------------------------------------------------------------------- ports

def test_free_ports_are_distinct_and_bindable_by_a_server_as_grpc_makes_it():
    ports = cluster.free_ports(5)
    assert len(ports) == 5
    assert len(set(ports)) == 5
    for port in ports:
        assert 1 <= port <= 65535
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))  # OSError if free_ports still held it
            s.listen()


def test_a_port_free_ports_chose_is_reserved_from_a_second_choice(monkeypatch):
    """A worker started 12 s after its port was chosen found it taken: each port chosen stays
    reserved (in TIME_WAIT) for a minute, so the next free_ports, drawing it first, passes it."""
    first = cluster.free_ports(3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", first[0]))
    drawn = random.sample
    monkeypatch.setattr(cluster.random, "sample", lambda pool, k: first + drawn(pool, k))
    second = cluster.free_ports(3)
    assert not set(first) & set(second), (first, second)


def test_check_port_free_passes_on_a_free_port():
    (port,) = cluster.free_ports(1)
    cluster.check_port_free(f"127.0.0.1:{port}", "worker 1")


def test_check_port_free_names_a_port_someone_listens_on():
    (port,) = cluster.free_ports(1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        held.bind(("127.0.0.1", port))
        held.listen()
        with pytest.raises(ClusterError) as raised:
            cluster.check_port_free(f"127.0.0.1:{port}", "worker 1")
    assert str(raised.value) == f"port {port} (worker 1, 127.0.0.1:{port}) is already in use"


def test_check_port_free_accepts_a_port_left_in_time_wait():
    (port,) = cluster.free_ports(1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server side closes first: it is the side left in TIME_WAIT
    # Nothing listens on the port any more; a server socket as gRPC makes it binds it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as like_grpc:
        like_grpc.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        like_grpc.bind(("", port))
        like_grpc.listen()
    cluster.check_port_free(f"127.0.0.1:{port}", "ps 0")


def test_wait_reachable_returns_once_something_listens():
    (port,) = cluster.free_ports(1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        held.bind(("127.0.0.1", port))
        held.listen()
        waited = cluster.wait_reachable(f"127.0.0.1:{port}", "ps 0", timeout=5.0)
    assert 0.0 <= waited < 5.0


def test_wait_reachable_names_an_unreachable_address_after_its_timeout():
    (port,) = cluster.free_ports(1)  # closed again: nobody listens on it
    started = time.monotonic()
    with pytest.raises(ClusterError) as raised:
        cluster.wait_reachable(f"127.0.0.1:{port}", "ps 0", timeout=0.3)
    elapsed = time.monotonic() - started
    assert str(raised.value).startswith(f"ps 0 at 127.0.0.1:{port} is unreachable: ")
    assert str(raised.value).endswith(" for 0.3 s")
    assert 0.3 <= elapsed < 3.0  # it waited its timeout, and not much more


# ---------------------------------------------------------------------------- TrainConfig

def test_train_config_defaults_match_the_question():
    config = TrainConfig(train_steps=10)
    assert (config.batch_size, config.learning_rate, config.optimizer) == (100, 0.001, "adam")
    assert (config.mode, config.epochs, config.replicas_to_aggregate) == ("sync", None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train_steps = 11  # validated once, so it must not change afterwards


@pytest.mark.parametrize("kwargs", [{}, {"train_steps": 5, "epochs": 2}])
def test_train_config_needs_exactly_one_length(kwargs):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**kwargs)
    assert str(raised.value) == "give exactly one of --train-steps and --epochs"


TIMEOUT_WHY = "(TensorFlow counts whole milliseconds and reads 0 as no deadline)"


@pytest.mark.parametrize("kwargs, message", [
    ({"train_steps": 0}, "--train-steps must be a positive integer, got 0"),
    ({"train_steps": -5}, "--train-steps must be a positive integer, got -5"),
    ({"epochs": 0}, "--epochs must be a positive integer, got 0"),
    ({"train_steps": 1, "batch_size": 0}, "--batch-size must be a positive integer, got 0"),
    ({"train_steps": 1, "batch_size": -100}, "--batch-size must be a positive integer, got -100"),
    ({"train_steps": 1, "log_every": 0}, "--log-every must be a positive integer, got 0"),
    ({"train_steps": 1, "save_steps": 0}, "--save-steps must be a positive integer, got 0"),
    ({"train_steps": 1, "learning_rate": 0.0},
     "--learning-rate must be positive and finite, got 0.0"),
    ({"train_steps": 1, "learning_rate": -0.1},
     "--learning-rate must be positive and finite, got -0.1"),
    ({"train_steps": 1, "learning_rate": float("nan")},
     "--learning-rate must be positive and finite, got nan"),
    ({"train_steps": 1, "learning_rate": float("inf")},
     "--learning-rate must be positive and finite, got inf"),
    ({"train_steps": 1, "timeout": 0.0}, f"--timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got 0.0"),
    ({"train_steps": 1, "timeout": -3.0},
     f"--timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got -3.0"),
    # 0.4 ms would be timeout_in_ms=0: no deadline at all. inf and nan: no bound either.
    ({"train_steps": 1, "timeout": 0.0004},
     f"--timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got 0.0004"),
    ({"train_steps": 1, "timeout": float("inf")},
     f"--timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got inf"),
    ({"train_steps": 1, "timeout": float("nan")},
     f"--timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got nan"),
    ({"train_steps": 1, "mode": "lockstep"}, "--mode 'lockstep' is not one of: sync, async"),
    ({"train_steps": 1, "optimizer": "rmsprop"},
     "--optimizer 'rmsprop' is not one of: adam, sgd, momentum"),
])
def test_train_config_rejects_values_naming_flag_and_value(kwargs, message):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**kwargs)
    assert str(raised.value) == message


def test_aggregate_defaults_to_every_worker_and_accepts_fewer():
    assert TrainConfig(train_steps=1).aggregate(3) == 3
    assert TrainConfig(train_steps=1, replicas_to_aggregate=3).aggregate(4) == 3
    assert TrainConfig(train_steps=1, replicas_to_aggregate=1).aggregate(1) == 1


@pytest.mark.parametrize("replicas, message", [
    (0, "--replicas-to-aggregate 0 is outside 1-3 (3 workers)"),
    (4, "--replicas-to-aggregate 4 is outside 1-3 (3 workers)"),
    (-1, "--replicas-to-aggregate -1 is outside 1-3 (3 workers)"),
])
def test_aggregate_rejects_out_of_range_naming_the_value(replicas, message):
    config = TrainConfig(train_steps=1, replicas_to_aggregate=replicas)
    with pytest.raises(ConfigError) as raised:
        config.aggregate(3)
    assert str(raised.value) == message


# ---------------------------------------------------------------------------- TaskConfig

def test_task_config_rejects_an_index_outside_the_cluster():
    with pytest.raises(ClusterError) as raised:
        TaskConfig(role="worker", index=3, cluster=_layout(), train=TrainConfig(train_steps=1))
    assert str(raised.value) == "worker index 3 is outside the cluster (3 worker tasks: 0-2)"


def test_task_config_rejects_more_replicas_than_workers():
    with pytest.raises(ConfigError) as raised:
        TaskConfig(role="ps", index=0, cluster=_layout(num_workers=2),
                   train=TrainConfig(train_steps=1, replicas_to_aggregate=3))
    assert str(raised.value) == "--replicas-to-aggregate 3 is outside 1-2 (2 workers)"


def test_task_config_chief_is_worker_0_only():
    train = TrainConfig(train_steps=1)
    tasks = {(role, i): TaskConfig(role=role, index=i, cluster=_layout(num_ps=1), train=train)
             for role, i in (("worker", 0), ("worker", 1), ("ps", 0))}
    assert [key for key, task in tasks.items() if task.is_chief] == [("worker", 0)]
    assert tasks["worker", 1].name == "worker 1"
    assert tasks["ps", 0].name == "ps 0"


def test_first_line_of_a_graph_mode_error_is_its_own_message():
    """A session's error in graph mode begins "Graph execution error:" and the stack that built
    the op: the line the task logs was that preamble, which names nothing (.ci/run's worker
    "failed: NotFoundError: Graph execution error:")."""
    import tensorflow as tf

    from sync_mnist.core.config import first_line

    message = ("Graph execution error:\n\nDetected at node 'CheckNumerics' defined at (most "
               "recent call last):\n    File \"/tmp/t.py\", line 5, in <module>\nNode: "
               "'CheckNumerics'\nbad value : Tensor had NaN values\n\t [[{{node CheckNumerics}}]]")
    assert first_line(tf.errors.InvalidArgumentError(None, None, message)) == \
        "bad value : Tensor had NaN values"
    # Without the node's line, the first line stays; other errors are as they were.
    assert first_line(tf.errors.InvalidArgumentError(None, None, "Graph execution error:")) == \
        "Graph execution error:"
    assert first_line(ValueError("one\ntwo")) == "one"
    # An error another task raised says where first, then what: both (it said only
    # "From /job:worker/replica:0/task:2:").
    remote = "From /job:worker/replica:0/task:2:\nYou must feed a value for placeholder x\n"
    assert first_line(tf.errors.InvalidArgumentError(None, None, remote)) == \
        "From /job:worker/replica:0/task:2: You must feed a value for placeholder x"
    assert first_line(tf.errors.InvalidArgumentError(None, None, message.replace(
        "bad value", f"{remote}bad value"))) == \
        "From /job:worker/replica:0/task:2: You must feed a value for placeholder x"
    # A restarted ps, as another's session hears of it: its status first, under a rule.
    restarted = ("Graph execution error:\n\n=====================\nABORTED: From "
                 "/job:ps/replica:0/task:1:\nRecvTensor expects a different device "
                 "incarnation: 20 vs. 19. Your worker job (\"/job:ps/replica:0/task:0\") was "
                 "probably restarted.\n\t [[{{node v/Read/ReadVariableOp_S1}}]]\n=========")
    assert first_line(tf.errors.AbortedError(None, None, restarted)) == (
        "ABORTED: From /job:ps/replica:0/task:1: RecvTensor expects a different device "
        "incarnation: 20 vs. 19. Your worker job (\"/job:ps/replica:0/task:0\") was probably "
        "restarted.")


def test_free_ports_are_drawn_below_the_kernels_ephemeral_range():
    """Where no outgoing connection's source port can take one before its task binds it."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = cluster.free_ports(6)
    assert len(set(ports)) == 6, ports
    assert all(cluster.FIRST_FREE_PORT <= p < low for p in ports), ports
    for port in ports:  # free: each binds, as a gRPC server does
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
