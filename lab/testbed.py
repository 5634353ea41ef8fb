"""A cluster spread over network namespaces on one machine, with chosen tasks slowed: experiments.

Bench and test tooling (straggler.py, scaling.py), never part of a user's training run. Root
only: it creates network namespaces, veth pairs, qdiscs and cgroups, and removes them all again.

Layout: a namespace `<prefix>-sw` holds a bridge, the switch; each task has a namespace of its
own (`<prefix>-ps0`, `<prefix>-w1`, ...) whose `eth0` (10.77.0.K/24) is one end of a veth pair,
the other end a port of the bridge. Nothing appears in the host's namespace, and all traffic
stays inside these namespaces. A task's process joins its namespace with setns(2) between fork
and exec (launch.py's `network` seam), so every TensorFlow process is the plain
`python -m sync_mnist` a user runs. tests/soak/test_multihost.py starts a cluster on it through
`ip netns exec` and cuts a task's link (`cut`).

Network faults, made at the switch with nftables (a `bridge` table in the switch's namespace,
removed with it), so that the task and its peers see nothing but missing packets:
  partition  every frame to and from the task's port dropped (`partition`, undone by `heal`):
             its carrier stays up and nothing answers, the silent case a pulled cable at a
             far switch makes (`cut`, a link down, is the loud one).
  loss       each frame to and from the task dropped with a probability (`lose`).
  delay      every packet the task sends and receives held for a time (`delay`): netem is
             missing here, so iptables' NFQUEUE in the task's namespace hands each packet to
             a process (delay.py) that releases it that much later.

Slowing a task:
  link  tbf on both ends of its veth: tbf shapes only what leaves an interface, so `eth0`'s
        caps what the task sends (gradients), the switch port's what it receives (weights).
        netem is not available on this machine, so no added delay, only a rate.
  cpu   a cgroup v1 `cpu` group with cfs_quota_us = share x cfs_period_us; the process joins
        it between fork and exec, so every thread TensorFlow starts later is in it too.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lab import ROOT
from sync_mnist.launcher import netns

log = logging.getLogger(__name__)

SUBNET = "10.77.0"  # inside the testbed's own namespaces only, so it clashes with nothing
PORT = 2222  # every task has an address of its own, so all can use the same port
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # the cgroup v1 cpu controller's mount
CFS_PERIOD_US = 100_000
TBF_LATENCY = "100ms"  # the longest a packet may queue in tbf before it is dropped
# tbf's bucket: two full GSO packets (64 KiB each, as veth hands them over), so that a
# transfer of a model's megabyte runs at the rate from its 129th kilobyte on (scaling.py counts
# the bucket in). Not one: the kernel counts a GSO packet as its payload plus every segment's
# headers (qdisc_pkt_len_init), about 68 KiB, and tbf cuts a packet larger than its bucket into
# its ~45 segments in software (tbf_segment), each then crossing veth alone. That cost 34 ns of
# CPU a byte here, 14 times an uncapped link's, which no real host's NIC pays: with 64 KiB the
# testbed measured its own shaping, not the cluster.
TBF_BURST_BYTES = 131072
IP_TIMEOUT_SECS = 30.0  # one `ip` or `tc` command
NFT_TABLE = "syncmnist"  # the switch's bridge table for faults; it dies with the namespace
NAME = re.compile(r"sync-mnist-tb-(\d+)-[0-9a-f]{6}")  # this module's names: creator's pid
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}  # tc's units: SI, in bits


class Unavailable(RuntimeError):
    """The testbed cannot be built here; the message says what is missing."""


Task = tuple[str, int]  # ("ps", 0), ("worker", 2)


def rate_bits(rate: str) -> float:
    """tc's rate text ("20mbit", "500kbit") in bits per second.

    Raises:
      ValueError: not a rate in bit, kbit, mbit or gbit; the message names it.
    """
    match = _RATE.match(rate.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"link rate {rate!r} is not a positive rate such as 20mbit, 500kbit "
                         "or 1gbit")
    return float(match.group(1)) * _RATE_SCALE[match.group(2)]


def check(*, cpu: bool, faults: bool = False) -> None:
    """Raises Unavailable unless this machine can build a testbed (with CPU caps if `cpu`,
    and network faults, which need nftables, if `faults`)."""
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"network namespaces are Linux-only (this is {sys.platform})")
    if os.geteuid() != 0:
        raise Unavailable(f"needs root (euid is {os.geteuid()}): it creates network "
                          "namespaces, veth pairs, tc qdiscs and cgroups")
    for tool in ("ip", "tc") + (("nft",) if faults else ()):
        if shutil.which(tool) is None:
            raise Unavailable(f"`{tool}` ({'nftables' if tool == 'nft' else 'iproute2'}) "
                              "is not installed")
    if cpu and not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        raise Unavailable(f"no cgroup v1 cpu controller at {CPU_CGROUP} "
                          "(cpu.cfs_quota_us is missing)")


@dataclasses.dataclass(frozen=True)
class Slowdown:
    """What slows one task: a link rate cap (tc's text, e.g. "20mbit") and/or a CPU share."""

    link_rate: str | None = None
    cpu_share: float | None = None  # of one core: 0.25 is a quarter of a core

    def __post_init__(self):
        if self.link_rate is not None:
            rate_bits(self.link_rate)
        if self.cpu_share is not None and not 0.01 <= self.cpu_share <= 64:
            raise ValueError(f"CPU share {self.cpu_share} is outside 0.01-64 cores")

    def describe(self) -> str:
        parts = ([f"link capped at {self.link_rate}"] if self.link_rate else []) + (
            [f"CPU capped at {self.cpu_share:g} core"] if self.cpu_share else [])
        return " and ".join(parts) or "not slowed"


class _Entry:
    """What a task's child does between fork and exec: join its namespace (and cgroup)."""

    def __init__(self, net_fd: int, cgroup_fd: int | None):
        self._net_fd, self._cgroup_fd = net_fd, cgroup_fd

    def enter(self) -> None:
        # Only calls resolved before the fork: see netns.py.
        netns.enter_network(self._net_fd)
        if self._cgroup_fd is not None:
            os.write(self._cgroup_fd, b"0")  # cgroup.procs: "0" is the writing process


class Testbed:
    """Namespaces for num_ps + num_workers tasks and a switch; `close` removes everything.

    Use as a context manager, or call `build` and then `close` in a finally.

    Args:
      num_ps, num_workers: the cluster's tasks.
      slow: per task, how it is slowed (tasks not named run at full speed).
    """

    def __init__(self, num_ps: int, num_workers: int, slow: dict[Task, Slowdown] | None = None):
        self.tasks: list[Task] = [("ps", i) for i in range(num_ps)] + [
            ("worker", i) for i in range(num_workers)]
        self.slow = {t: s for t, s in (slow or {}).items() if s.link_rate or s.cpu_share}
        unknown = [t for t in self.slow if t not in self.tasks]
        if unknown:
            raise ValueError(f"cannot slow {unknown}: the cluster has {num_ps} ps and "
                             f"{num_workers} workers")
        if len(self.tasks) > 250:
            raise ValueError(f"{len(self.tasks)} tasks do not fit in {SUBNET}.0/24")
        self.prefix = f"sync-mnist-tb-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.prefix}-sw"
        self.namespace = {t: f"{self.prefix}-{'ps' if t[0] == 'ps' else 'w'}{t[1]}"
                          for t in self.tasks}
        self.address = {t: f"{SUBNET}.{k + 1}" for k, t in enumerate(self.tasks)}
        self.port = {t: f"p{k}" for k, t in enumerate(self.tasks)}  # its port on the switch
        self._namespaces: list[str] = []  # created, in order
        self._cgroups: dict[Task, Path] = {}
        self._fds: list[int] = []
        self._entries: dict[Task, _Entry] = {}
        self._nft_ready = False  # the switch's fault table exists
        self._delayers: list[subprocess.Popen] = []  # delay.py, one per delayed task

    def __enter__(self) -> Testbed:
        self.build()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def build(self) -> None:
        """Creates the namespaces, links, caps and cgroups. On failure, undoes what it made.

        Raises:
          Unavailable: a command failed (the message quotes it and its error).
        """
        check(cpu=any(s.cpu_share for s in self.slow.values()))
        remove_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        log.info("testbed %s: %s", self.prefix, "; ".join(
            f"{t[0]} {t[1]} at {self.address[t]}" + (
                f" ({self.slow[t].describe()})" if t in self.slow else "")
            for t in self.tasks))

    def _build(self) -> None:
        for ns in (self.switch, *self.namespace.values()):
            _ip("netns", "add", ns)
            self._namespaces.append(ns)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for task, ns in self.namespace.items():
            port = self.port[task]
            # Made inside the switch's namespace with its peer born in the task's: no interface
            # ever appears in the host's namespace.
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{self.address[task]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            slow = self.slow.get(task, Slowdown())
            if slow.link_rate:
                for where, dev in ((ns, "eth0"), (self.switch, port)):
                    _tbf(where, dev, slow.link_rate)
            net_fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            self._fds.append(net_fd)
            cgroup_fd = self._cpu_cgroup(task, slow.cpu_share) if slow.cpu_share else None
            self._entries[task] = _Entry(net_fd, cgroup_fd)

    def _cpu_cgroup(self, task: Task, share: float) -> int:
        path = CPU_CGROUP / self.namespace[task]
        try:
            path.mkdir()
            self._cgroups[task] = path
            (path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(round(share * CFS_PERIOD_US)))
            fd = os.open(path / "cgroup.procs", os.O_WRONLY)
        except OSError as e:
            raise Unavailable(f"cannot make the CPU cgroup {path}: {e.strerror}") from None
        self._fds.append(fd)
        return fd

    def hosts(self, num_ps: int, num_workers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Every task's address:port, as launch.run_cluster's `network` gives them."""
        if (num_ps, num_workers) != self.shape:
            raise ValueError(f"the testbed has {self.shape[0]} ps and {self.shape[1]} workers, "
                             f"not {num_ps} and {num_workers}")
        ps = tuple(f"{self.address[t]}:{PORT}" for t in self.tasks if t[0] == "ps")
        workers = tuple(f"{self.address[t]}:{PORT}" for t in self.tasks if t[0] == "worker")
        return ps, workers

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(t[0] == "ps" for t in self.tasks), sum(t[0] == "worker" for t in self.tasks))

    def entry(self, role: str, index: int) -> _Entry:
        """What task (role, index)'s child enters between fork and exec (`enter()`)."""
        return self._entries[role, index]

    def confine(self, role: str, index: int, pid: int) -> None:
        """Moves process `pid` (all its threads) into task (role, index)'s CPU cgroup: for a
        task started through `ip netns exec` rather than `entry`."""
        (self._cgroups[role, index] / "cgroup.procs").write_text(str(pid))

    def cut(self, role: str, index: int) -> None:
        """Unplugs task (role, index)'s cable at the switch: its host keeps running, unreachable.

        Raises:
          Unavailable: the command failed (the message quotes it and its error).
        """
        _ip("-n", self.switch, "link", "set", self.port[role, index], "down")

    def partition(self, role: str, index: int) -> None:
        """Drops every frame to and from task (role, index) at the switch; `heal` undoes it.

        Unlike `cut`, the link stays up: neither side gets an error, only silence.
        """
        self._fault(role, index, "partition", "")

    def partition_from(self, task: Task, peer: Task) -> None:
        """Drops every frame between `task` and `peer` alone at the switch; `heal(*task)`
        undoes it. Each still reaches every other task."""
        self._fault(*task, "partition", f"{{}} {self.port[peer]}")

    def drop_flows(self, task: Task, peer: Task, local_port: int | None = None) -> int:
        """Drops, at the switch, every frame of the TCP connections `task` has now with `peer`
        (those of its `local_port` alone: a server's), both ways; their later connections pass.
        Returns how many connections. `heal(*task)` undoes it. What a peer that died unheard
        leaves: connections whose other end never answers nor closes, so that `task` is not
        told of the death on them, whatever either end sends."""
        out = _run(["ip", "netns", "exec", self.namespace[task], "ss", "-Htn", "state",
                    "established", "dst", self.address[peer]])
        flows = [(local.rsplit(":", 1)[1], remote.rsplit(":", 1)[1])
                 for local, remote in (line.split()[-2:] for line in out.splitlines())]
        flows = [f for f in flows if local_port is None or f[0] == str(local_port)]
        other = self.address[peer]
        for local, remote in flows:
            self._fault(*task, "flows", f"ip daddr {other} tcp sport {local} tcp dport {remote}",
                        directions=("iifname",))
            self._fault(*task, "flows", f"ip saddr {other} tcp sport {remote} tcp dport {local}",
                        directions=("oifname",))
        return len(flows)

    def lose(self, role: str, index: int, fraction: float) -> None:
        """Drops each frame to and from task (role, index) with probability `fraction`."""
        if not 0 < fraction < 1:
            raise ValueError(f"loss {fraction} is not a fraction between 0 and 1")
        self._fault(role, index, "loss", f"numgen random mod 1000000 < {round(fraction * 1e6)}")

    def heal(self, role: str, index: int) -> None:
        """Removes every fault `partition` or `lose` put on task (role, index)."""
        port = self.port[role, index]
        listed = json.loads(_run(["ip", "netns", "exec", self.switch, "nft", "-j", "-a", "list",
                                  "chain", "bridge", NFT_TABLE, "forward"])) \
            if self._nft_ready else {}
        for item in listed.get("nftables", []):
            rule = item.get("rule")
            if rule and rule.get("comment", "").endswith(f" {port}"):
                _run(["ip", "netns", "exec", self.switch, "nft", "delete", "rule", "bridge",
                      NFT_TABLE, "forward", "handle", str(rule["handle"])])

    def delay(self, role: str, index: int, ms: float) -> None:
        """Delays every packet task (role, index) sends or receives by `ms` (each way).

        Raises:
          Unavailable: the delaying process or the iptables rules could not be set up.
        """
        ns = self.namespace[role, index]
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "lab.delay",
             "--queue", "0", "--delay-ms", f"{ms:g}"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, cwd=ROOT)
        self._delayers.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], IP_TIMEOUT_SECS)
        first = proc.stdout.readline().strip() if ready else "no answer"
        if first != "ready":
            raise Unavailable(f"the delay for {role} {index} did not start: {first}")
        for chain, direction in (("POSTROUTING", "-o"), ("PREROUTING", "-i")):
            _run(["ip", "netns", "exec", ns, "iptables", "-w", "-t", "mangle", "-A", chain,
                  direction, "eth0", "-j", "NFQUEUE", "--queue-num", "0"])

    def dropped(self, role: str, index: int) -> int:
        """Frames to and from task (role, index) that the faults dropped so far (nft counters)."""
        port = self.port[role, index]
        text = _run(["ip", "netns", "exec", self.switch, "nft", "list", "chain", "bridge",
                     NFT_TABLE, "forward"]) if self._nft_ready else ""
        return sum(int(m.group(1)) for m in re.finditer(
            rf"counter packets (\d+) bytes \d+ drop comment \"\w+ {port}\"", text))

    def _fault(self, role: str, index: int, kind: str, match: str,
               directions: tuple[str, ...] = ("iifname", "oifname")) -> None:
        port = self.port[role, index]
        if not self._nft_ready:
            _run(["ip", "netns", "exec", self.switch, "nft", "add", "table", "bridge",
                  NFT_TABLE])
            _run(["ip", "netns", "exec", self.switch, "nft", "add", "chain", "bridge",
                  NFT_TABLE, "forward",
                  "{ type filter hook forward priority 0; policy accept; }"])
            self._nft_ready = True
        # A match with {} names the other end: the direction opposite this port's.
        for direction, other in (("iifname", "oifname"), ("oifname", "iifname")):
            if direction not in directions:
                continue
            _run(["ip", "netns", "exec", self.switch, "nft", "add", "rule", "bridge", NFT_TABLE,
                  "forward", direction, port, *match.replace("{}", other).split(), "counter",
                  "drop", "comment", f'"{kind} {port}"'])

    def pids(self) -> dict[str, list[int]]:
        """{namespace: pids of the processes in it}, for the testbed's namespaces that have any."""
        return {ns: pids for ns in self._namespaces if (pids := _pids_in(ns))}

    def link_stats(self) -> dict[str, dict]:
        """Per task ("worker 1"): bytes it sent and received, and each direction's tbf, if any.

        Read from the kernel (`ip -s link`, `tc -s qdisc`) while the testbed stands: the proof
        that a cap is in place and that the task's traffic went through it.
        """
        stats = {}
        for task, ns in self.namespace.items():
            link = _json("ip", "-n", ns, "-j", "-s", "link", "show", "eth0")[0]["stats64"]
            stats[f"{task[0]} {task[1]}"] = {
                "address": self.address[task],
                "sent_bytes": link["tx"]["bytes"], "received_bytes": link["rx"]["bytes"],
                "send_qdisc": _root_qdisc(ns, "eth0"),
                "receive_qdisc": _root_qdisc(self.switch, self.port[task]),
                "cpu_quota_us": int((self._cgroups[task] / "cpu.cfs_quota_us").read_text())
                if task in self._cgroups else None,
                # nr_periods > 0: the task ran in the group; nr_throttled: the cap bit.
                "cpu_stat": dict((k, int(v)) for k, v in (
                    line.split() for line in
                    (self._cgroups[task] / "cpu.stat").read_text().splitlines()))
                if task in self._cgroups else None,
            }
        return stats

    def close(self) -> None:
        """Kills what still runs in the namespaces, deletes them (their veths and qdiscs go
        with them) and the cgroups. Safe to call more than once, and after a failed build."""
        for proc in self._delayers:  # its queue goes with the namespace; it need not outlive it
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()
        self._delayers.clear()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        errors = _remove_namespaces(reversed(self._namespaces))
        self._namespaces.clear()
        errors += _remove_cgroups(list(self._cgroups.values()))
        self._cgroups.clear()
        if errors:
            log.error("testbed %s: could not remove %s", self.prefix, "; ".join(errors))


def _root_qdisc(ns: str, dev: str) -> dict | None:
    """The tbf at dev's root: its rate (bits/s) and what went through it; None if another kind."""
    for q in _json("tc", "-n", ns, "-j", "-s", "qdisc", "show", "dev", dev):
        if q.get("root") and q["kind"] == "tbf":
            return {"kind": "tbf", "rate_bits": 8 * q["options"]["rate"], "bytes": q["bytes"],
                    "packets": q["packets"], "drops": q["drops"],
                    "overlimits": q["overlimits"]}
    return None


def _tbf(ns: str, dev: str, rate: str) -> None:
    _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
          "burst", str(TBF_BURST_BYTES), "latency", TBF_LATENCY])


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _run(argv: list[str]) -> str:
    """Runs an ip or tc command (bounded); its stdout.

    Raises:
      Unavailable: it failed or hung; the message quotes it and its error.
    """
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_SECS)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"`{' '.join(argv)}` did not finish within {IP_TIMEOUT_SECS:g} s") \
            from None
    if out.returncode:
        raise Unavailable(f"`{' '.join(argv)}` failed: {out.stderr.strip() or out.returncode}")
    return out.stdout


def _json(*argv: str) -> list:
    return json.loads(_run(list(argv)) or "[]")


def _pids_in(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                         timeout=IP_TIMEOUT_SECS)
    return [int(p) for p in out.stdout.split()]


def _remove_namespaces(namespaces) -> list[str]:
    """Kills what runs in these namespaces (only the testbed starts anything there), deletes
    them; returns what could not be deleted."""
    namespaces = list(namespaces)
    for ns in namespaces:
        for pid in _pids_in(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    errors = []
    for ns in namespaces:
        out = subprocess.run(["ip", "netns", "delete", ns], capture_output=True, text=True,
                             timeout=IP_TIMEOUT_SECS)
        if out.returncode:
            errors.append(f"namespace {ns}: {out.stderr.strip()}")
    return errors


def _remove_cgroups(paths: list[Path]) -> list[str]:
    errors = []
    for path in paths:
        try:
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            rmdir_when_empty(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            errors.append(f"cgroup {path}: {e.strerror}")
    return errors


def rmdir_when_empty(path: Path, attempts: int = 50) -> None:
    """rmdir of a cgroup fails with EBUSY until its killed processes are reaped (bounded)."""
    for _ in range(attempts - 1):
        try:
            path.rmdir()
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            time.sleep(0.1)
    path.rmdir()


def remove_stale() -> None:
    """Namespaces and cgroups of an earlier testbed whose creator died before its cleanup."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=IP_TIMEOUT_SECS).stdout.splitlines()
    stale = [line.split(" ")[0] for line in listed
             if (m := NAME.match(line)) and not Path(f"/proc/{m.group(1)}").exists()]
    if stale:
        log.warning("removing %d namespaces left by a testbed that died: %s", len(stale),
                    ", ".join(stale))
        _remove_namespaces(stale)
    if CPU_CGROUP.is_dir():
        _remove_cgroups([p for p in CPU_CGROUP.iterdir() if (m := NAME.match(p.name))
                         and not Path(f"/proc/{m.group(1)}").exists()])


def leftovers() -> list[str]:
    """This module's namespaces and cgroups that exist now (for tests: nothing may be left)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=IP_TIMEOUT_SECS).stdout.splitlines()
    found = [line.split(" ")[0] for line in listed if NAME.match(line)]
    if CPU_CGROUP.is_dir():
        found += [str(p) for p in CPU_CGROUP.iterdir() if NAME.match(p.name)]
    return found
