"""Cluster layout: which ps and worker tasks exist and where they listen.

The layout comes from --ps-hosts/--worker-hosts, from a TF_CONFIG value (as Kubernetes' TFJob
sets it), or from the defaults below, which match `make run-cluster`'s localhost layout so that
`sync-mnist --role worker --index 1` works in a second terminal with no other flag.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import socket
import time

DEFAULT_HOST = "localhost"
DEFAULT_BASE_PORT = 2222
DEFAULT_NUM_PS = 1
DEFAULT_NUM_WORKERS = 3
ROLES = ("ps", "worker")


class ClusterError(ValueError):
    """The cluster description is unusable; the message names the offending value."""


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

    def device_filters(self, role: str, index: int) -> list[str]:
        # Distributed: a task only needs the ps tasks and itself. Without filters, every session
        # waits for every worker to be up, and a dead worker stalls the living ones at start-up.
        return ["/job:ps", f"/job:{role}/task:{index}"]


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


def from_tf_config(text: str) -> tuple[ClusterLayout, str, int]:
    """Parse a TF_CONFIG value: {"cluster": {"ps": [...], "worker": [...]}, "task": {...}}.

    A "chief" job, as some launchers write it, is treated as worker 0 so that the chief and the
    workers share one index space.
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ClusterError("TF_CONFIG has no \"cluster\" object")
    cluster = config["cluster"]
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterError("TF_CONFIG has no \"task\" with \"type\" and \"index\" for this process")
    chief = list(cluster.get("chief", []))
    workers = chief + list(cluster.get("worker", []))
    layout = ClusterLayout(tuple(cluster.get("ps", [])), tuple(workers))
    role, index = str(task["type"]), task["index"]
    if not isinstance(index, int):
        raise ClusterError(f"TF_CONFIG task index {index!r} is not an integer")
    if role == "chief":
        role = "worker"
    elif role == "worker":
        index += len(chief)
    layout.check_task(role, index)
    return layout, role, index


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

    Raises ClusterError naming the address if nothing accepts within `timeout` seconds, so an
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
            raise ClusterError(
                f"{label} at {address} is unreachable: {last_error} for {timeout:g} s")
        time.sleep(0.2)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports that are free right now, chosen by the kernel; all held open until all are chosen."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
