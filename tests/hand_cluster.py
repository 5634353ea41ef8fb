"""A cluster started by hand, task by task (no launcher), for the fault tests of tests/cluster
(test_faults.py) and tests/soak (test_restarts.py)."""

from __future__ import annotations

import re
from pathlib import Path

from procs import Proc, Processes, read_json
from sync_mnist.core.cluster import free_ports

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
COMMON = ("--dataset", "synthetic", "--log-every", "10")


class Cluster:
    """ps 0 and N workers started by hand, each a `python -m sync_mnist` process."""

    def __init__(self, processes: Processes, tmp: Path, workers: int, *args: str):
        ports = free_ports(workers + 1)
        self.hosts = ("--ps-hosts", f"127.0.0.1:{ports[0]}", "--worker-hosts",
                      ",".join(f"127.0.0.1:{p}" for p in ports[1:]))
        self.processes, self.tmp, self.args = processes, tmp, args
        self.marker = str(tmp / "data")  # in every command line, to find leftovers
        self.tasks: dict[tuple[str, int], Proc] = {}
        self.starts = 0

    def start(self, role: str, index: int, *extra: str) -> Proc:
        self.starts += 1
        proc = self.processes.task(role, index, *self.hosts, *COMMON, "--data-dir", self.marker,
                                   *self.args, *extra,
                                   "--summary-json", str(self.record_path(role, index)))
        self.tasks[role, index] = proc
        return proc

    def start_all(self, workers: int) -> None:
        self.start("ps", 0)
        for index in range(workers):
            self.start("worker", index)

    def record_path(self, role: str, index: int) -> Path:
        return self.tmp / f"{role}{index}-{self.starts}.json"

    def record(self, role: str, index: int) -> dict:
        proc = self.tasks[role, index]
        path = next(a for a in reversed(proc.popen.args) if a.endswith(".json"))
        return read_json(path)

    def kill_all(self) -> None:
        for proc in self.tasks.values():
            proc.kill()

    def wait_all(self, timeout: float = BOUND) -> dict[tuple[str, int], int]:
        return {key: proc.wait(timeout) for key, proc in self.tasks.items()}


def wait_for_step(proc: Proc, step: int) -> None:
    proc.wait_for_line(rf"\] step={step} ", BOUND)


def checkpoint_steps(logdir: Path) -> list[int]:
    text = (logdir / "checkpoint").read_text()
    return sorted({int(m) for m in re.findall(r'model\.ckpt-(\d+)"', text)})
