"""Network and disk faults on one task of the localhost cluster: the chaos soak's (chaos.py).

The launcher runs every task in one private network namespace whose only link is loopback
(launcher/netns.py), so a task's packets cannot be caught at a switch as on the testbed
(testbed.py, where each task has a link of its own). They are caught in that namespace, in
nftables' output hook, which every packet on loopback passes once:
  - every packet the victim's process sends: the process is moved into a cgroup v1 net_cls
    class of its own, which retags its sockets, open ones included, and `meta cgroup`
    matches the class;
  - every packet sent to the victim's server port, from its peers, while the victim lives.
The fault is the process's, as a SIGSTOP is: once the launcher has replaced the victim (a pod
made again elsewhere), `release_port` lifts the port's rule, and the replacement, outside the
class, is not cut off.

  partition  all of them dropped: the victim and its peers see silence, no error
  loss       each dropped with a probability
  delay      each queued (iptables NFQUEUE: nftables' `queue` is not built here) to
             delay.py, which releases it that much later

`heal` removes the rules, moves the process back and removes its class. A full disk:
`DiskFull` fills a small tmpfs (the run's --logdir) to the last block and frees it again.

Root only (nftables, cgroups, mounts); `unavailable()` says why where they are missing.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from lab import ROOT, testbed

CLASSID = 0x5EED0001  # the victim's net_cls class: any value no one else here uses
TABLE = "sync_mnist_chaos"  # the rule on the victim's class
PORT_TABLE = "sync_mnist_chaos_port"  # the rule on its port
QUEUE = 7  # the NFQUEUE number the delay process serves
COMMAND_SECS = 30.0  # nft, mount: bounded generously for a loaded machine


class FaultError(RuntimeError):
    """A fault could not be made or undone (the message names the command and its error)."""


def unavailable() -> str | None:
    """Why network faults cannot be made here, or None."""
    if os.geteuid() != 0:
        return "they need root (nftables, cgroups)"
    for tool in ("nft", "iptables", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: apt-get install nftables iptables)"
    return None


def run(argv: list[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=COMMAND_SECS)
    except subprocess.TimeoutExpired:
        raise FaultError(f"`{' '.join(argv)}` did not end in {COMMAND_SECS:g} s") from None
    if done.returncode:
        raise FaultError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


class NetClass:
    """A cgroup v1 net_cls hierarchy, mounted privately for the soak (unmounted by close), with
    one class, CLASSID, for the victim of the moment."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="sync-mnist-net_cls-"))
        try:
            run(["mount", "-t", "cgroup", "-o", "net_cls", "sync-mnist-chaos", str(self.root)])
        except FaultError:
            self.root.rmdir()
            raise
        # Every mount of net_cls is the one hierarchy: a class named for this soak alone.
        self.victim = self.root / f"sync-mnist-chaos-{os.getpid()}"
        self.victim.mkdir()
        (self.victim / "net_cls.classid").write_text(str(CLASSID))

    def enter(self, pid: int) -> None:
        """Moves process `pid`, every thread and every socket of it, into the class."""
        (self.victim / "cgroup.procs").write_text(str(pid))

    def release(self) -> None:
        """Moves whatever is in the class back out."""
        for pid in (self.victim / "cgroup.procs").read_text().split():
            try:
                (self.root / "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                pass  # it ended meanwhile

    def close(self) -> None:
        self.release()
        testbed.rmdir_when_empty(self.victim)  # a victim just killed may not be reaped yet
        run(["umount", str(self.root)])
        self.root.rmdir()


class LoopbackFault:
    """One network fault on one task, in the launcher's namespace (that of `holder_pid`)."""

    def __init__(self, net_class: NetClass, holder_pid: int):
        self.net_class = net_class
        self.nsenter = ["nsenter", f"--net=/proc/{holder_pid}/ns/net"]
        self._delayer: subprocess.Popen | None = None
        self._port: int | None = None
        self._healing = threading.Lock()  # heal: from the soak's timer, and again at the end

    def _rules(self, port: int, action: str) -> None:
        for table, match in ((TABLE, f"meta cgroup {CLASSID}"), (PORT_TABLE, f"tcp dport {port}")):
            run([*self.nsenter, "nft", "-f", "-"], stdin=(
                f"table inet {table} {{\n chain out {{\n"
                "  type filter hook output priority 0; policy accept;\n"
                f"  {match} {action}\n }}\n}}\n"))
        self._port = port

    def partition(self, pid: int, port: int) -> None:
        self.net_class.enter(pid)
        self._rules(port, "counter drop")

    def lose(self, pid: int, port: int, fraction: float) -> None:
        if not 0 < fraction < 1:
            raise ValueError(f"loss {fraction} is not a fraction between 0 and 1")
        self.net_class.enter(pid)
        self._rules(port, f"numgen random mod 1000000 < {round(fraction * 1e6)} counter drop")

    def delay(self, pid: int, port: int, ms: float) -> None:
        self._delayer = subprocess.Popen(
            [*self.nsenter, sys.executable, "-m", "lab.delay", "--queue",
             str(QUEUE), "--delay-ms", f"{ms:g}"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            cwd=ROOT)
        first = self._delayer.stdout.readline().strip()
        if first != "ready":
            raise FaultError(f"the delay process did not start: {first or 'no output'}")
        self.net_class.enter(pid)
        for match in (["-m", "cgroup", "--cgroup", str(CLASSID)],
                      ["-p", "tcp", "--dport", str(port)]):
            run([*self.nsenter, "iptables", "-w", "-t", "mangle", "-A", "OUTPUT", *match,
                 "-j", "NFQUEUE", "--queue-num", str(QUEUE)])
        self._port = port

    def release_port(self) -> None:
        """Lifts the rule on the victim's port: its replacement listens there now."""
        with self._healing:
            self._undo(["nft", "delete", "table", "inet", PORT_TABLE],
                       ["iptables", "-w", "-t", "mangle", "-D", "OUTPUT", "-p", "tcp", "--dport",
                        str(self._port), "-j", "NFQUEUE", "--queue-num", str(QUEUE)])

    def _undo(self, *commands: list[str]) -> None:
        for argv in commands:
            try:
                run([*self.nsenter, *argv])
            except FaultError as e:
                # No such table or rule (never made, or undone already), or no namespace: the
                # run has ended and its rules went with it.
                if "No such" not in str(e) and "Bad rule" not in str(e):
                    raise

    def heal(self) -> None:
        """Removes the rules (if the namespace still exists) and the delay process, and moves
        the victim back out of its class. Twice is harmless."""
        with self._healing:
            self._undo(["nft", "delete", "table", "inet", TABLE],
                       ["nft", "delete", "table", "inet", PORT_TABLE],
                       ["iptables", "-w", "-t", "mangle", "-F", "OUTPUT"])
            if self._delayer is not None:
                self._delayer.terminate()
                self._delayer.stdin.close()
                self._delayer.wait(COMMAND_SECS)
                self._delayer = None
            self.net_class.release()


class DiskFull:
    """Fills the filesystem of `directory` to its last block (a file beside it), and frees it."""

    def __init__(self, directory: Path):
        self.filler = directory / ".chaos-filler"

    def fill(self) -> int:
        """Writes until the disk is full, in ever smaller pieces; returns the bytes written."""
        written = 0
        with open(self.filler, "wb", buffering=0) as f:
            for size in (1 << 20, 4096, 1):
                piece = b"\0" * size
                try:
                    while True:
                        written += f.write(piece)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
        return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)
