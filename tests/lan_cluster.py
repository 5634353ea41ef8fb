"""A cluster on the testbed (lab/testbed.py), for network-fault tests.

Each task runs `ip netns exec <its namespace> python -m sync_mnist ...` with the real command
line, in a process group the `processes` fixture kills. The faults (a silent partition, packet
loss) are made at the testbed's switch; `lan` removes the namespaces, and with them every rule,
when the test ends, and checks that nothing of them is left.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from procs import read_json
from sync_mnist.core.cluster import free_ports
from lab import testbed

RETRYABLE = (200, 201)  # README's "Exit codes": a bounded wait expired, a peer was lost


def lan_fixture(num_ps: int, num_workers: int, slow: dict | None = None, faults: bool = True):
    """A testbed of num_ps + num_workers tasks (skips, saying why, where none can be built;
    `faults`: where nftables is missing too)."""
    try:
        testbed.check(cpu=bool(slow), faults=faults)
    except testbed.Unavailable as e:
        pytest.skip(f"cannot build a testbed here: {e}")
    bed = testbed.Testbed(num_ps=num_ps, num_workers=num_workers, slow=slow)
    try:
        try:
            bed.build()
        except testbed.Unavailable as e:
            pytest.skip(f"cannot build namespaces, veth pairs and a bridge here: {e}")
        yield bed
    finally:
        bed.close()
    left = [name for name in testbed.leftovers() if name.startswith(bed.prefix)]
    assert not left, f"namespaces or cgroups left behind: {left}"


@dataclasses.dataclass
class LanCluster:
    bed: testbed.Testbed
    procs: dict  # (role, index) -> procs.Proc
    tmp_path: Path
    processes: object = None  # the fixture that started them
    argv: dict = dataclasses.field(default_factory=dict)  # (role, index) -> its command

    def restart(self, role: str, index: int) -> None:
        """Starts task (role, index) again with its command, as a launcher or a pod would."""
        self.procs[role, index] = self.processes.start(self.argv[role, index], f"{role} {index}")

    def record(self, role: str, index: int) -> dict:
        return read_json(self.tmp_path / f"{role}{index}.json")

    def ended_by(self, deadline: float) -> dict:
        """{task: (exit code, monotonic time of its end)} for the tasks ended by `deadline`."""
        ended = {}
        while len(ended) < len(self.procs) and time.monotonic() < deadline:
            for task, proc in self.procs.items():
                if task not in ended and proc.popen.poll() is not None:
                    ended[task] = proc.popen.returncode, time.monotonic()
            time.sleep(0.1)
        return ended

    def describe(self, ended: dict, since: float) -> str:
        return ", ".join(
            f"{r} {i}: " + (f"exit {ended[r, i][0]} at {ended[r, i][1] - since:.1f} s"
                            if (r, i) in ended else "running")
            for r, i in self.procs)

    def throttle(self, role: str, index: int) -> None:
        """Moves the task into its CPU cgroup (testbed `slow`): `ip netns exec` and `env`
        exec in place, so the pid the test started is the task's Python, threads and all."""
        self.bed.confine(role, index, self.procs[role, index].popen.pid)

    def stack(self, role: str, index: int) -> str:
        """The project's frames of a hung task, innermost first (faulthandler, on SIGABRT)."""
        proc = self.procs[role, index]
        proc.popen.send_signal(signal.SIGABRT)
        try:
            proc.wait(10)
        except AssertionError:
            return "(no stack: SIGABRT did not end it)"
        frames = [m.group(1, 2, 3) for m in re.finditer(
            r'File "[^"]*/((?:sync_mnist/\w+|tensorflow/python/client/session|threading)\.py)", '
            r"line (\d+) in (\w+)", proc.output)]
        return " < ".join(f"{path}:{line} {name}" for path, line, name in frames[:8]) or (
            proc.output[-800:])

    def tails(self, lines: int = 4) -> str:
        return "\n".join(f"--- {r} {i}\n" + "\n".join(p.lines[-lines:])
                         for (r, i), p in self.procs.items())


def start(bed: testbed.Testbed, processes, tmp_path: Path, *extra: str,
          env: dict | None = None) -> LanCluster:
    """Starts every task of the testbed, ps first, the chief last; returns the handles."""
    tasks = bed.tasks
    ports = free_ports(len(tasks))  # any port is free in a new namespace; still, none fixed
    hosts = {task: f"{bed.address[task]}:{port}" for task, port in zip(tasks, ports)}
    num_ps, num_workers = bed.shape
    cluster = ("--ps-hosts", ",".join(hosts["ps", i] for i in range(num_ps)),
               "--worker-hosts", ",".join(hosts["worker", i] for i in range(num_workers)))
    prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
    procs, argv = {}, {}
    for role, index in sorted(tasks, key=lambda t: t == ("worker", 0)):
        argv[role, index] = [
            "ip", "netns", "exec", bed.namespace[role, index], *prefix, sys.executable, "-X",
            "faulthandler", "-m", "sync_mnist", "--role", role, "--index", str(index),
            *cluster, "--dataset", "synthetic", "--log-every", "10",
            "--data-dir", str(tmp_path / "data"),  # a marker in every task's command line
            "--summary-json", str(tmp_path / f"{role}{index}.json"), *extra]
        procs[role, index] = processes.start(argv[role, index], f"{role} {index}")
    return LanCluster(bed, procs, tmp_path, processes, argv)
