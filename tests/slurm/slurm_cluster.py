"""A real Slurm cluster of the test's own: munged, slurmctld and slurmd on a temporary directory.

Root only (slurmd runs every job's tasks as their user, so it runs as root). Nothing is written
to /etc: the munge key, slurm.conf, the spool and state directories and the logs are all in a
temporary directory of the cluster's own, removed by `stop`; every client command gets
SLURM_CONF. The daemons run in the foreground
as children of the test, and `stop` ends them by the pids it started.

Two shapes:
  - one node on this host's network, named as `hostname -s` says (`one_node`);
  - several nodes, each slurmd in a network namespace of its own (a host of its own on the
    testbed's veth network) and in UTS and mount namespaces of its own, so that its hostname
    is the node's name and that /etc/hosts there names every node (`in_namespaces`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import procs

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slurm-wlm", "munge")
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun", "nsenter", "unshare")
START_SECS = 60  # from starting the daemons to every node idle
COMMAND_SECS = 30  # one scontrol or scancel
STOP_SECS = 15  # a daemon's SIGTERM to its exit, then SIGKILL
# Every node offers 8 CPUs whatever the hardware (SlurmdParameters=config_overrides), so that
# the script's 4 tasks of 2 CPUs, or 6 tasks of 1, fit on this 2-core machine.
NODE_CPUS = 8


def unavailable() -> str | None:
    """Why no cluster can be started here (after installing Slurm where it is missing and this
    is root), or None if one can."""
    if os.geteuid() != 0:
        return f"needs root to run Slurm's daemons (euid is {os.geteuid()})"
    return procs.apt_installed(PACKAGES, TOOLS)


@dataclasses.dataclass(frozen=True)
class Node:
    """A Slurm node: its name, the address slurmctld reaches it at, and the argv prefix that
    runs a command on it (empty: on this host)."""

    name: str
    address: str
    enter: tuple[str, ...] = ()


@dataclasses.dataclass
class Job:
    """A batch job submitted with `sbatch --wait`, while it runs and once it has ended."""

    id: int
    output_path: Path
    popen: subprocess.Popen
    state: str | None = None  # JobState, from scontrol once the job has ended
    exit_code: str | None = None  # ExitCode, "2:0": the script's code and the signal

    @property
    def output(self) -> str:
        return self.output_path.read_text() if self.output_path.exists() else ""

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """Polls the job's output file until a line matches; AssertionError after `timeout`."""
        regex = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = regex.search(self.output)
            if match:
                return match
            if self.popen.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"job {self.id}: no line matching {pattern!r} within {timeout} s;"
                             f" output:\n{self.output}")


class SlurmCluster:
    """munged, slurmctld and one slurmd per node, started by `start`, ended by `stop`.

    Args:
      nodes: the nodes, in slurm.conf's order.
      controller: the node-like place slurmctld (and every client command) runs in.
      first_job_id: the first job's id (the shipped script derives its ports from it).
    """

    def __init__(self, nodes: list[Node], controller: Node, *, first_job_id: int):
        # Not under pytest's temporary directories: munged needs every directory on the way to
        # its socket open to all (0755).
        self.root = Path(tempfile.mkdtemp(prefix="sync-mnist-slurm-"))
        self.root.chmod(0o755)
        self.nodes, self.controller = nodes, controller
        self.first_job_id = first_job_id
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge-socket" / "munge.socket"
        self.jobcomp = self.root / "jobcomp.txt"  # a line per ended job, with its state
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: dict[str, subprocess.Popen] = {}
        self._jobs: list[Job] = []

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Writes the key and slurm.conf, starts the daemons, waits until every node is idle.

        Raises:
          RuntimeError: a daemon exited or the nodes did not come up; with the logs' tails.
        """
        logs = self.root / "log"
        for d in ("munge", "munge-socket", "log", "ctld", *(f"d-{n.name}" for n in self.nodes)):
            (self.root / d).mkdir()
        # munged refuses a key others can read, and a socket directory not everyone can enter.
        (self.root / "munge").chmod(0o700)
        (self.root / "munge-socket").chmod(0o755)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._write_conf()
        self._start("munged", [procs.which("munged"), "--foreground", f"--key-file={key}",
                               f"--socket={self.socket}", f"--log-file={logs / 'munged.log'}",
                               f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                               f"--seed-file={self.root / 'munge' / 'munged.seed'}"], ())
        self._wait(lambda: self.socket.exists(), "munged's socket")
        self._start("slurmctld", [procs.which("slurmctld"), "-D", "-f", str(self.conf)],
                    self.controller.enter)
        for node in self.nodes:
            self._start(f"slurmd {node.name}",
                        [procs.which("slurmd"), "-D", "-f", str(self.conf), "-N", node.name],
                        node.enter)
        self._wait(self._all_idle, f"every node ({', '.join(n.name for n in self.nodes)}) idle")

    def _write_conf(self) -> None:
        ctld_port, slurmd_port = _free_ports(2)
        lines = [
            "ClusterName=syncmnisttest",
            f"SlurmctldHost={self.controller.name}({self.controller.address})",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={self.root / 'ctld'}",
            f"SlurmdSpoolDir={self.root / 'd-%n'}",
            f"SlurmctldPidFile={self.root / 'ctld' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'd-%n' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "MpiDefault=none",
            "SlurmdParameters=config_overrides", "ReturnToService=2",
            # An ended job's record goes after MinJobAge s; at 4 `sbatch --wait` polls every 2 s
            # rather than backing off to 32 s. Its state stays in the job completion log.
            "MinJobAge=4", "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.jobcomp}",
            f"FirstJobId={self.first_job_id}",
            *(f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.address} "
              f"CPUs={NODE_CPUS} State=UNKNOWN" for n in self.nodes),
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, name: str, argv: list[str], enter: tuple[str, ...]) -> None:
        log = open(self.root / "log" / f"{name.replace(' ', '-')}.out", "w")
        self._daemons[name] = subprocess.Popen([*enter, *argv], stdout=log,
                                               stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=self.env)
        log.close()

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_SECS
        while not ready():
            dead = {name: p.returncode for name, p in self._daemons.items()
                    if p.poll() is not None}
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"Slurm did not start: {what} not reached within "
                                   f"{START_SECS} s; exited: {dead or 'none'}\n{self.logs()}")
            time.sleep(0.2)

    def _all_idle(self) -> bool:
        out = self.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], check=False)
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(n.name) == "idle" for n in self.nodes)

    def run(self, argv: list[str], *, check: bool = True, on: Node | None = None) -> str:
        """A client command (on the controller's host by default); its stdout."""
        where = (on or self.controller).enter
        out = subprocess.run([*where, *argv], capture_output=True, text=True, env=self.env,
                             timeout=COMMAND_SECS, stdin=subprocess.DEVNULL)
        if check and out.returncode:
            raise RuntimeError(f"`{' '.join(argv)}` failed ({out.returncode}): "
                               f"{out.stderr.strip()}")
        return out.stdout

    def submit(self, sbatch_options: list[str], script_args: list[str]) -> Job:
        """`sbatch --wait` of the shipped script, from the checkout (its submit directory)."""
        output = self.root / f"job-{len(self._jobs)}.out"
        argv = [*self.controller.enter, "sbatch", "--wait", "--parsable",
                f"--output={output}", *sbatch_options,
                str(ROOT / "deploy" / "slurm" / "sync-mnist.sbatch"), *script_args]
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL)
        line = popen.stdout.readline()  # --parsable: the job id, as soon as it is queued
        if not line.strip().split(";")[0].isdigit():
            popen.wait(COMMAND_SECS)
            raise RuntimeError(f"sbatch did not queue the job: {line!r} {popen.stderr.read()}")
        job = Job(int(line.split(";")[0]), output, popen)
        self._jobs.append(job)
        return job

    def wait(self, job: Job, timeout: float) -> Job:
        """Waits for sbatch to return (bounded), then reads the job's state from the job
        completion log."""
        try:
            job.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"job {job.id} still running after {timeout} s; output:\n"
                                 f"{job.output}") from None
        ended = self.jobcomp.read_text().splitlines() if self.jobcomp.exists() else []
        # The last line: a requeued job has a line for each time it was put back (PENDING).
        for line in reversed(ended):
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("JobId") == str(job.id):
                job.state, job.exit_code = fields["JobState"], fields["ExitCode"]
                return job
        raise AssertionError(f"job {job.id} ended (sbatch exit {job.popen.returncode}) but is "
                             f"not in the job completion log: {ended}\n{self.logs()}")

    def state(self, job: Job) -> str:
        """The job's state as squeue says it (RUNNING, COMPLETING, PENDING...); "" once it has
        left the queue."""
        return self.run(["squeue", "--noheader", "--jobs", str(job.id), "--format=%T"],
                        check=False).strip()

    def wait_for_state(self, job: Job, state: str, timeout: float) -> None:
        """Polls squeue until the job is in `state`; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.state(job)
            if seen == state:
                return
            time.sleep(0.2)
        raise AssertionError(f"job {job.id} not {state} within {timeout} s (last: {seen!r}); "
                             f"output:\n{job.output}")

    def logs(self) -> str:
        """The tail of every daemon's log, for a failure message."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            tail = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancels jobs still running, then ends the daemons by pid: SIGTERM, then SIGKILL."""
        running = [j for j in self._jobs if j.popen.poll() is None]
        if running and "slurmctld" in self._daemons:
            self.run(["scancel", *(str(j.id) for j in running)], check=False)
        for job in running:
            try:
                job.popen.wait(STOP_SECS)
            except subprocess.TimeoutExpired:
                job.popen.kill()
                job.popen.wait()
        for name in reversed(list(self._daemons)):  # the slurmds first, munged last
            daemon = self._daemons[name]
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(STOP_SECS)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
        self._daemons.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _free_ports(count: int) -> list[int]:
    from sync_mnist.core.cluster import free_ports

    return free_ports(count, host="")


def one_node(first_job_id: int) -> SlurmCluster:
    """One node on this host's network, named as `hostname -s` says; slurmctld beside it."""
    name = socket.gethostname().split(".")[0]
    node = Node(name, name)
    return SlurmCluster([node], node, first_job_id=first_job_id)


def namespaced_entry(net_ns: str, hostname: str | None = None, hosts_file: Path | None = None
                     ) -> tuple[str, ...]:
    """The argv prefix that runs a command in network namespace `net_ns`, and, with
    `hostname`, in new UTS and mount namespaces whose hostname is that and whose /etc/hosts
    is `hosts_file` (a bind mount seen only there).

    nsenter and unshare exec rather than fork (no pid namespace is entered), so the pid of the
    process started with this prefix is the command's own.
    """
    enter = ("nsenter", f"--net=/run/netns/{net_ns}")
    if hostname is None:
        return enter
    setup = f"hostname {hostname} && mount --bind {hosts_file} /etc/hosts && exec \"$@\""
    return (*enter, "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", setup, "sh")
