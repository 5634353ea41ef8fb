"""Processes for tests that go through the real command line.

Every process gets its own process group; `Processes.kill_all` (called from a fixture's
finally) kills each group, so a failing test leaves nothing behind. Nor in the temporary
directory: the processes get one of their own (TMPDIR), removed with them, since a task a test
kills cannot remove its own files there (autograph's converted functions).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
KILL_BOUND = 30.0  # seconds for a SIGKILLed process to be gone (kill_groups_mentioning)


class Proc:
    """A child process whose combined output is collected line by line as it arrives."""

    def __init__(self, argv: list[str], name: str, env: dict | None = None):
        self.name = name
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, text=True,
                                      env={**ENV, **(env or {})}, cwd=ROOT,
                                      start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """Blocks until a line matches `pattern` (a regex); fails the test after `timeout` s."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{self.name}: no line matching {pattern!r} within "
                                         f"{timeout} s; output:\n{self.output}")
                self._changed.wait(min(left, 0.5))

    def wait(self, timeout: float) -> int:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s; output:\n"
                                 f"{self.output}") from None
        self._reader.join(timeout=5)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()


class Processes:
    def __init__(self):
        self.procs: list[Proc] = []
        self.tmpdir = tempfile.mkdtemp(prefix="sync-mnist-test-")

    def start(self, argv: list[str], name: str, env: dict | None = None) -> Proc:
        proc = Proc(argv, name, {"TMPDIR": self.tmpdir, **(env or {})})
        self.procs.append(proc)
        return proc

    def task(self, role: str, index: int, *args: str) -> Proc:
        return self.start([sys.executable, "-m", "sync_mnist", "--role", role,
                           "--index", str(index), *args], f"{role} {index}")

    def launcher(self, *args: str, env: dict | None = None) -> Proc:
        """The launcher of `args`; `env`: variables to set or change in its environment."""
        return self.start([str(ROOT / "bin" / "sync-mnist-cluster"), *args], "launcher", env)

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill()
        shutil.rmtree(self.tmpdir)


def run_task_process(args: list[str], timeout: float = 60.0, script: str | None = None,
                     log_level: str = "3"):
    """Runs `python -m sync_mnist ARGS` (no TF_CONFIG), or `python -c SCRIPT ARGS`, to its end;
    returns (exit code, stdout, stderr, seconds). Its process group is killed however it ends.
    `log_level`: TensorFlow's C++ logs it keeps (TF_CPP_MIN_LOG_LEVEL; "0": all)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=log_level)
    env.pop("TF_CONFIG", None)
    started = time.monotonic()
    entry = ["-m", "sync_mnist"] if script is None else ["-c", script]
    proc = subprocess.Popen([sys.executable, *entry, *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - started
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def operator_tf_config(spec: dict[str, list[str]], task_type: str, index: int) -> str:
    """TF_CONFIG as the operator writes it (pkg/controller.v1/tensorflow/tensorflow.go)."""
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index},
                       "environment": "cloud"}, separators=(",", ":"))


YOUR_MODEL = ROOT / "examples" / "your_model" / "my_model.py"


def your_model_file(tmp_path: Path) -> str:
    """The documented model of one's own (examples/your_model/my_model.py), copied out of the
    repository as a user keeps it; its --model spec."""
    path = tmp_path / "elsewhere" / "my_model.py"
    path.parent.mkdir()
    shutil.copy(YOUR_MODEL, path)
    return f"{path}:MODEL"


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def kill_groups_mentioning(text: str) -> None:
    """SIGKILLs the process group of every live process whose argv contains `text`: a test's
    own marker (its tmp_path), so only what it started. The launcher starts each task in a
    session of its own, so killing the launcher's group alone does not reach them."""
    killed = set()
    for line in processes_mentioning(text):
        pid = int(line.split(":", 1)[0])
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
        killed.add(pid)
    # SIGKILL is delivered at once, but a large process takes a moment to go (its memory torn
    # down), during which its argv still reads: wait until each is gone, within a bound
    # (.ci/run saw a TensorFlow task still listed just after its kill).
    deadline = time.monotonic() + KILL_BOUND
    while time.monotonic() < deadline and killed & {
            int(line.split(":", 1)[0]) for line in processes_mentioning(text)}:
        time.sleep(0.05)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose argv contains `text` (to prove none is left)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in argv:
            found.append(f"{entry.name}: {argv}")
    return found


TCP_LISTEN = "0A"  # socket state in /proc/<pid>/net/tcp{,6}


def listening_ports(proc_dir: str = "/proc/self") -> set[int]:
    """Local ports of every TCP LISTEN socket in proc_dir's network namespace, IPv4 and IPv6."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(proc_dir, "net", table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == TCP_LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def local_cluster(num_workers: int, num_ps: int = 1):
    """In-process servers on free ports: num_ps ps and num_workers workers; (workers,
    ClusterSpec).

    (tf.compat.v1.test.create_local_cluster needs portpicker, which TensorFlow does not install.)
    """
    import tensorflow as tf

    from sync_mnist.core.cluster import free_ports

    ports = free_ports(num_workers + num_ps)
    cluster = tf.train.ClusterSpec({"ps": [f"localhost:{p}" for p in ports[:num_ps]],
                                    "worker": [f"localhost:{p}" for p in ports[num_ps:]]})
    for p in range(num_ps):
        tf.distribute.Server(cluster, job_name="ps", task_index=p, start=True)
    workers = [tf.distribute.Server(cluster, job_name="worker", task_index=i, start=True)
               for i in range(num_workers)]
    return workers, cluster


# ----------------------------------------------------- probing a cluster from outside

# The launcher's "cluster: ps localhost:P, workers localhost:A,...; dataset ..." line.
CLUSTER_LINE = r"cluster: ps (?P<ps>[^\s;]+), workers (?P<workers>[^\s;]+);"


def ns_inode(pid: int | str) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def interfaces(pid: int) -> list[str]:
    """Network interfaces of pid's network namespace."""
    rows = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return sorted(row.split(":", 1)[0].strip() for row in rows)


def refused_from_here(port: int) -> dict[str, str]:
    """Tries loopback (IPv4 and IPv6) from this process's namespace; {address: how it failed}.

    Only loopback is probed, as the test's own traffic may go nowhere else; the namespace
    having no interface but `lo` is what keeps other hosts out, and that is asserted apart.
    """
    failures = {}
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            try:
                s.connect((host, port))
            except OSError as e:
                failures[host] = type(e).__name__
    return failures


def reachable_from_here(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return True
    except OSError:
        return False


def task_pids(launcher_pid: int) -> dict[str, int]:
    """{'ps 0': pid, 'worker 0': pid, ...} for the launcher's live task processes."""
    tasks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher_pid and b"--role" in argv:
            role = argv[argv.index(b"--role") + 1].decode()
            index = argv[argv.index(b"--index") + 1].decode()
            tasks[f"{role} {index}"] = int(entry.name)
    return tasks


def cluster_ports(proc) -> list[int]:
    match = proc.wait_for_line(CLUSTER_LINE, 30)
    hosts = match["ps"].split(",") + match["workers"].split(",")
    return [int(h.rsplit(":", 1)[1]) for h in hosts]


def free_run(count: int, within: tuple[int, int] | None = None) -> int:
    """A first port such that it and the next count - 1 are free on this host right now, drawn
    from `within` (low, high), by default where free_ports draws; reserved as free_ports
    leaves its ports."""
    import random

    from sync_mnist.core import cluster

    low, high = within or (cluster.FIRST_FREE_PORT, cluster.ephemeral_low())
    for _ in range(200):
        base = random.randrange(low, high - count)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("", port))
            for s in sockets:
                cluster.reserve(s, "")
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"found no {count} consecutive free ports in {low}-{high}")


INSTALL_SECS = 900  # apt-get update and install, bounded


def which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def apt_installed(packages: tuple[str, ...], tools: tuple[str, ...]) -> str | None:
    """Installs `packages` with apt-get (root) if any of `tools` is missing; then why some are
    still missing, or None when all are there."""
    missing = [tool for tool in tools if not which(tool)]
    if not missing:
        return None
    if not shutil.which("apt-get"):
        return f"{', '.join(missing)} missing and no apt-get to install {' '.join(packages)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, env=env,
                                 timeout=INSTALL_SECS, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(argv)}` did not finish within {INSTALL_SECS} s"
        if out.returncode:
            last = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:]
            return f"`{' '.join(argv)}` failed ({out.returncode}): {' '.join(last)}"
    missing = [tool for tool in tools if not which(tool)]
    return f"still missing after installing {' '.join(packages)}: {', '.join(missing)}" \
        if missing else None


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    """A tmpfs of `size` (mount's size=, e.g. "256k") mounted at `path` for the block: a disk
    that fills up. Root only; unmounted however the block ends."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "sync-mnist-test", str(path)],
                   check=True, capture_output=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True, capture_output=True,
                       timeout=30)
