"""Cluster layout: which ps and worker tasks exist and where they listen.

The layout comes from --ps-hosts/--worker-hosts, from a TF_CONFIG value (as Kubernetes' TFJob
sets it), from an srun step's environment (srun's block distribution over its nodes), or from
the defaults below, which match `make run-cluster`'s localhost layout so that
`sync-mnist --role worker --index 1` works in a second terminal with no other flag.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import json
import random
import re
import socket
import time
from typing import Mapping

DEFAULT_HOST = "localhost"
DEFAULT_BASE_PORT = 2222
DEFAULT_NUM_PS = 1
DEFAULT_NUM_WORKERS = 3
ROLES = ("ps", "worker")


class ClusterError(ValueError):
    """The cluster description is unusable; the message names the offending value."""


class Unreachable(ClusterError):
    """A peer did not accept connections within the bound: it may be late, dead or misnamed."""


def default_hosts(num_ps: int, num_workers: int, base_port: int = DEFAULT_BASE_PORT,
                  host: str = DEFAULT_HOST) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Consecutive ports from base_port: the ps tasks first, then the workers."""
    ports = range(base_port, base_port + num_ps + num_workers)
    addresses = tuple(f"{host}:{port}" for port in ports)
    return addresses[:num_ps], addresses[num_ps:]


@dataclasses.dataclass(frozen=True)
class ClusterLayout:
    ps_hosts: tuple[str, ...]
    worker_hosts: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.ps_hosts:
            raise ClusterError("the cluster needs at least one ps task")
        if not self.worker_hosts:
            raise ClusterError("the cluster needs at least one worker task")
        seen: dict[tuple[str, int], str] = {}
        for role, hosts in (("ps", self.ps_hosts), ("worker", self.worker_hosts)):
            for index, address in enumerate(hosts):
                key = parse_address(address)  # so that h:2222 and h:02222 are one address
                if key in seen:
                    raise ClusterError(
                        f"{address} is given twice ({seen[key]} and {role} {index})")
                seen[key] = f"{role} {index}"

    @classmethod
    def parse(cls, ps_hosts: str, worker_hosts: str) -> ClusterLayout:
        """From comma-separated host:port lists, as given on the command line."""
        return cls(_split("--ps-hosts", ps_hosts), _split("--worker-hosts", worker_hosts))

    @property
    def num_ps(self) -> int:
        return len(self.ps_hosts)

    @property
    def num_workers(self) -> int:
        return len(self.worker_hosts)

    def hosts(self, role: str) -> tuple[str, ...]:
        return self.ps_hosts if role == "ps" else self.worker_hosts

    def check_task(self, role: str, index: int) -> None:
        if role not in ROLES:
            raise ClusterError(f"role {role!r} is not one of: {', '.join(ROLES)}")
        count = len(self.hosts(role))
        if not 0 <= index < count:
            raise ClusterError(
                f"{role} index {index} is outside the cluster ({count} {role} task"
                f"{'s' if count != 1 else ''}: 0-{count - 1})")

    def address(self, role: str, index: int) -> str:
        return self.hosts(role)[index]

    def as_dict(self) -> dict[str, list[str]]:
        return {"ps": list(self.ps_hosts), "worker": list(self.worker_hosts)}

    def spec(self):
        """The tf.train.ClusterSpec for this layout."""
        import tensorflow as tf  # imported late: cli.py quiets TensorFlow's logs before this runs

        return tf.train.ClusterSpec(self.as_dict())

    def server(self, role: str, index: int):
        """This task's gRPC server, started (cli.py has checked its port: preflight.py)."""
        import tensorflow as tf

        return tf.distribute.Server(self.spec(), job_name=role, task_index=index,
                                    config=server_config(), start=True)

    def device_filters(self, role: str, index: int) -> list[str]:
        # Distributed: a task only needs the ps tasks and itself. Without filters, every session
        # waits for every worker to be up, and a dead worker stalls the living ones at start-up.
        return ["/job:ps", f"/job:{role}/task:{index}"]


def server_config():
    """The ConfigProto a task's server starts with (its thread pools come from it): no spinning.

    TensorFlow's Eigen pools spin for work before they sleep, which pays on an idle machine.
    Here every ps and worker shares the cores, and a ps's threads spent about half its CPU
    spinning between the RPCs of a step (perf, 4 ps and 4 workers on 2 cores), CPU its
    neighbours needed. The benchmark's baselines start with the same (bench_tasks.py).
    """
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.experimental.disable_thread_spinning = True
    return config


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port); anything else is a ClusterError naming the value."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
        raise ClusterError(f"malformed host:port {address!r}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ClusterError(f"port {port} in {address!r} is outside 1-65535")
    return host.strip("[]"), port


def _split(flag: str, value: str) -> tuple[str, ...]:
    hosts = tuple(part.strip() for part in value.split(","))
    if any(not h for h in hosts):
        raise ClusterError(f"{flag} {value!r} has an empty entry")
    return hosts


# TF_CONFIG jobs that name the chief: TFJob's Chief replica ("chief"), or its older name, Master.
CHIEF_JOBS = ("chief", "master")


def from_tf_config(text: str) -> tuple[ClusterLayout, str, int]:
    """Parse a TF_CONFIG value into the layout and this task's role and index.

    The shape is {"cluster": {"ps": [...], "worker": [...]}, "task": {"type": T, "index": I}},
    as TensorFlow and the Kubeflow TFJob operator write it. The operator adds
    "environment": "cloud" (ignored here, as TensorFlow 2 ignores it) and, for a TFJob with a
    Chief (or Master) replica, a job of its own for it: that task is worker 0, the chief, and the
    "worker" job's tasks follow it, so the chief and the workers share one index space.

    Raises:
      ClusterError: naming the offending value. That includes what sync-mnist cannot run: an
        evaluator task or job (training here evaluates on the chief), and a worker map instead
        of a list ("sparseCluster", TFJob's enableDynamicWorker): SyncReplicasOptimizer
        averages a fixed number of workers' gradients, so the workers cannot come and go.
    """
    config = _tf_config_json(text)
    cluster, role, index = _tf_config_cluster_and_task(config)
    chief_jobs = [job for job in CHIEF_JOBS if cluster.get(job)]
    chief = [host for job in chief_jobs for host in cluster[job]]
    if len(chief) > 1:
        raise ClusterError(f"TF_CONFIG has {len(chief)} chief tasks ({', '.join(chief)}); "
                           "a cluster has at most one")
    layout = ClusterLayout(tuple(cluster.get("ps", [])),
                           tuple(chief) + tuple(cluster.get("worker", [])))
    role, index = _tf_config_task(cluster, chief_jobs, chief, role, index)
    layout.check_task(role, index)
    return layout, role, index


def _tf_config_json(text: str):
    """TF_CONFIG's value, parsed; a ClusterError if it is not JSON Python can read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos})") from None
    except ValueError as e:  # more than 4300 figures: Python's limit for int()
        raise ClusterError(f"TF_CONFIG cannot be read: {e}") from None
    except RecursionError:
        raise ClusterError("TF_CONFIG is nested too deeply to be read") from None


def _tf_config_cluster_and_task(config) -> tuple[dict, str, object]:
    """TF_CONFIG's "cluster" and this task's type and index, as given; a ClusterError for a
    TF_CONFIG without them, or with what sync-mnist cannot run (from_tf_config says what)."""
    if isinstance(config, dict) and "sparseCluster" in config:
        raise ClusterError("TF_CONFIG has a \"sparseCluster\" (a TFJob with enableDynamicWorker): "
                           "synchronous training needs a fixed list of workers; set "
                           "enableDynamicWorker to false")
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ClusterError("TF_CONFIG has no \"cluster\" object")
    cluster = config["cluster"]
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterError("TF_CONFIG has no \"task\" with \"type\" and \"index\" for this process")
    role, index = str(task["type"]), task["index"]
    if role == "evaluator" or "evaluator" in cluster:
        raise ClusterError("TF_CONFIG has an evaluator (a TFJob Evaluator replica): sync-mnist has "
                           "no evaluator task; the chief evaluates on the test set at the end; "
                           "remove that replica")
    for job, hosts in cluster.items():
        if job not in ("ps", "worker", *CHIEF_JOBS):
            raise ClusterError(f"TF_CONFIG has a job {job!r}: sync-mnist runs only ps, worker and "
                               "chief tasks")
        if isinstance(hosts, dict):
            raise ClusterError(f"TF_CONFIG's {job!r} job is a map, not a list (a TFJob with "
                               "enableDynamicWorker): synchronous training needs a fixed list of "
                               "workers; set enableDynamicWorker to false")
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise ClusterError(f"TF_CONFIG's {job!r} job is not a list of host:port strings: "
                               f"{hosts!r}")
    return cluster, role, index


def _tf_config_task(cluster: dict, chief_jobs: list[str], chief: list[str], role: str,
                    index) -> tuple[str, int]:
    """This task's role and index in the layout: a chief (or master) task is worker 0, and
    with one, the "worker" job's tasks follow it."""
    if not isinstance(index, int) or isinstance(index, bool):
        raise ClusterError(f"TF_CONFIG task index {index!r} is not an integer")
    if role in CHIEF_JOBS:
        if role not in chief_jobs:
            raise ClusterError(f"TF_CONFIG says this task is {role} {index}, but its cluster has "
                               f"no {role!r} job")
        if index != 0:
            raise ClusterError(f"TF_CONFIG says this task is {role} {index}; "
                               "the only chief task is 0")
        role = "worker"
    elif role == "worker" and chief:
        count = len(cluster.get("worker", []))
        if not 0 <= index < count:
            raise ClusterError(f"TF_CONFIG says this task is worker {index}, outside its "
                               f"\"worker\" job ({count} task{'s' if count != 1 else ''}"
                               f"{f': 0-{count - 1}' if count else ''})")
        index += len(chief)  # worker 0 is the chief: TF_CONFIG's workers follow it
    return role, index


def from_slurm(environ: Mapping[str, str], num_ps: int = DEFAULT_NUM_PS,
               base_port: int = DEFAULT_BASE_PORT) -> tuple[ClusterLayout, str, int]:
    """The layout of an srun step and this task's role and index in it.

    srun's block distribution, as Slurm lays it out: the ranks fill the step's nodes in the
    order SLURM_STEP_NODELIST gives them (Slurm's order: n9 before n10), the tasks on a node
    listen on consecutive ports from base_port, the first num_ps ranks are ps tasks and the
    rest workers. (TensorFlow's SlurmClusterResolver sorts the node names as text, n10 before
    n9, and so gives such a step's tasks each other's addresses; only its hostlist parsing,
    which keeps the order, is used.)

    Args:
      environ: the process environment, with srun's SLURM_PROCID, SLURM_STEP_NODELIST and
        SLURM_STEP_TASKS_PER_NODE. SLURMD_NODENAME and SLURM_LOCALID, where set, are checked
        against the address this rank is given.
      num_ps: ps tasks; the rest of the step's tasks are workers.
      base_port: the port of the first task on each node.

    Raises:
      ClusterError: a variable is missing or malformed, the step is too small, a node is
        listed twice, or this rank would be given an address that is not its own.
    """
    rank = _whole_number(_slurm_var(environ, "SLURM_PROCID"))
    if rank is None:
        raise ClusterError(f"SLURM_PROCID {environ['SLURM_PROCID']!r} is not a task rank")
    nodelist = _slurm_var(environ, "SLURM_STEP_NODELIST")
    tasks_per_node = _slurm_var(environ, "SLURM_STEP_TASKS_PER_NODE")
    nodes, counts = _slurm_nodes(nodelist, tasks_per_node)
    _check_slurm_step(counts, tasks_per_node, rank, num_ps, base_port)
    addresses = [f"{node}:{base_port + local}"
                 for node, count in zip(nodes, counts) for local in range(count)]
    layout = ClusterLayout(tuple(addresses[:num_ps]), tuple(addresses[num_ps:]))
    role, index = ("ps", rank) if rank < num_ps else ("worker", rank - num_ps)
    _check_block_distribution(environ, layout, role, index, rank, base_port)
    return layout, role, index


def _slurm_var(environ: Mapping[str, str], name: str) -> str:
    """srun's variable `name`; a ClusterError if it is not set (not inside an srun step)."""
    if not environ.get(name):
        raise ClusterError(f"{name} is not set: not inside an srun step? (SLURM_PROCID is "
                           f"{environ.get('SLURM_PROCID')!r})")
    return environ[name]


def _slurm_nodes(nodelist: str, tasks_per_node: str) -> tuple[list[str], list[int]]:
    """The step's nodes, in Slurm's order, and the count of tasks on each; a ClusterError if
    either list is malformed or too long, names a node twice, or the two do not match."""
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as slurm

    for name, value in (("SLURM_STEP_NODELIST", nodelist),
                        ("SLURM_STEP_TASKS_PER_NODE", tasks_per_node)):
        if _expansion_bound(value) > MAX_SLURM_TASKS:
            raise ClusterError(f"{name} {value!r} names more than {MAX_SLURM_TASKS} nodes or "
                               "tasks")
    try:
        nodes = slurm.expand_hostlist(nodelist)
        counts = slurm.expand_tasks_per_node(tasks_per_node)
    except ValueError as e:
        raise ClusterError(str(e)) from None
    twice = [node for node, n in collections.Counter(nodes).items() if n > 1]
    if twice:
        # Its tasks would be given the same addresses as the first listing's.
        raise ClusterError(f"SLURM_STEP_NODELIST {nodelist!r} names node {twice[0]} more than "
                           "once")
    if len(nodes) != len(counts):
        raise ClusterError(f"SLURM_STEP_NODELIST names {len(nodes)} nodes but "
                           f"SLURM_STEP_TASKS_PER_NODE counts tasks for {len(counts)}")
    return nodes, counts


def _check_slurm_step(counts: list[int], tasks_per_node: str, rank: int, num_ps: int,
                      base_port: int) -> None:
    """A ClusterError unless the step's tasks fit: a worker beside the ps, ports for every
    task on a node, and this rank among them."""
    total = sum(counts)
    if total > MAX_SLURM_TASKS:
        raise ClusterError(f"SLURM_STEP_TASKS_PER_NODE {tasks_per_node!r} counts {total} tasks, "
                           f"more than {MAX_SLURM_TASKS}")
    if total < num_ps + 1:
        raise ClusterError(f"the srun step has {total} task{'s' if total != 1 else ''}; --ps "
                           f"{num_ps} leaves no worker (start at least {num_ps + 1} tasks)")
    if not 1 <= base_port <= 65536 - max(counts):
        raise ClusterError(f"--base-port {base_port}: {max(counts)} tasks on a node need ports "
                           f"{base_port}-{base_port + max(counts) - 1}, outside 1-65535")
    if rank >= total:
        raise ClusterError(f"SLURM_PROCID {rank} is outside the step's {total} tasks")


def _check_block_distribution(environ: Mapping[str, str], layout: ClusterLayout, role: str,
                              index: int, rank: int, base_port: int) -> None:
    """A ClusterError if SLURMD_NODENAME and SLURM_LOCALID, where set, place this rank
    elsewhere than the address the layout gives it."""
    node, local = environ.get("SLURMD_NODENAME"), _whole_number(environ.get("SLURM_LOCALID", ""))
    if node and local is not None:
        mine, given = f"{node}:{base_port + local}", layout.address(role, index)
        if mine != given:
            raise ClusterError(
                f"Slurm rank {rank} runs on {node} (local task {local}), but a block "
                f"distribution makes it {role} {index} at {given}: the ranks must fill the "
                "nodes in order (srun --distribution=block)")


# A real step has far fewer nodes and tasks; a range such as n[1-999999999] would have
# TensorFlow build a list of a billion names first.
MAX_SLURM_TASKS = 1 << 16


def _expansion_bound(text: str) -> int:
    """At least as many items as a hostlist ('n[1-4],m2') or a tasks-per-node list ('2(x3),1')
    expands to, counted without expanding it."""
    total = text.count(",") + 1
    for low, high in re.findall(r"(\d+)-(\d+)", text):
        total += max(0, int(high) - int(low)) if len(high) < 10 else MAX_SLURM_TASKS + 1
    for repeat in re.findall(r"\(x(\d+)\)", text):
        total += int(repeat) if len(repeat) < 10 else MAX_SLURM_TASKS + 1
    return total


def _whole_number(text: str) -> int | None:
    """'12' -> 12; None for anything else (a sign, a space, a non-ASCII numeral such as '²')."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None


def check_port_free(address: str, label: str) -> None:
    """Fail early and clearly if this task's own port is taken (TF only logs a gRPC error)."""
    _, port = parse_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As gRPC does: a port whose last connection is in TIME_WAIT can be served on again.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ClusterError(f"port {port} ({label}, {address}) is already in use") from None
            raise ClusterError(f"cannot bind port {port} ({label}, {address}): {e.strerror}") from None


def wait_reachable(address: str, label: str, timeout: float) -> float:
    """Poll a TCP connect to address until it succeeds; return the seconds it took.

    Raises Unreachable naming the address if nothing accepts within `timeout` seconds, so an
    unreachable ps is a one-line error instead of an endless "CreateSession still waiting".
    """
    host, port = parse_address(address)
    start = time.monotonic()
    last_error = "no attempt"
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout)):
                return time.monotonic() - start
        except OSError as e:
            last_error = e.strerror or str(e)
        if time.monotonic() - start >= timeout:
            raise Unreachable(
                f"{label} at {address} is unreachable: {last_error} for {timeout:g} s")
        time.sleep(0.2)


FIRST_FREE_PORT = 20_000  # free_ports draws from here up to the kernel's ephemeral range


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports that are free right now, drawn at random below the kernel's ephemeral range (where
    it picks the source port of every outgoing connection, and the port of a bind to 0), or by
    the kernel where that range leaves no room below it.

    Each port is left reserved: its last connection stays in TIME_WAIT for a minute, so that no
    other free_ports, and no bind to 0, takes it, while a server that sets SO_REUSEADDR (gRPC's
    do) binds it. Without it, a port could be taken between the choice and the task's bind: a
    worker started 12 s after the launcher chose its port failed with "Could not start gRPC
    server" (make test-convergence, other tests choosing ports beside it)."""
    low = ephemeral_low()
    below = range(FIRST_FREE_PORT, low) if low - FIRST_FREE_PORT > 100 * count else range(0)
    sockets: list[socket.socket] = []
    try:
        for port in random.sample(below, min(len(below), 20 * count)):
            if len(sockets) == count:
                break
            _bind(sockets, host, port)
        while len(sockets) < count:
            _bind(sockets, host, 0)
        for s in sockets:
            reserve(s, host)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def reserve(server: socket.socket, host: str) -> None:
    """Leaves the bound socket's port reserved for a minute, as free_ports says: connects to it
    and closes the server's side first, which leaves the port in TIME_WAIT (the technique of
    the ephemeral-port-reserve package)."""
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.listen(1)
    port = server.getsockname()[1]
    with socket.create_connection((host or "127.0.0.1", port), timeout=5):
        accepted, _ = server.accept()
        accepted.close()


def _bind(sockets: list, host: str, port: int) -> None:
    """Appends a socket bound to `port` (0: the kernel's choice) unless it is in use."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        if port == 0:
            raise
        return
    sockets.append(s)


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
