"""A private network namespace for the localhost cluster: loopback only, unreachable from outside.

A TensorFlow gRPC server listens on every interface and runs any graph that any client sends; it
has no authentication. On one machine there is no need to expose it: the launcher creates one
network namespace whose only interface is loopback, and starts every task inside it. No other
host, and no process outside the namespace, can then connect to the cluster's ports.

How: a small holder process (`python -m sync_mnist.launcher.netns`) unshares its network namespace,
brings `lo` up and waits. The launcher opens the holder's namespace file and each task joins it
with setns(2) between fork and exec, so all tasks share the one namespace. Root does this
directly; any other user goes through a user namespace of its own (where the kernel allows
unprivileged user namespaces), which maps its own uid to itself, so files keep their owner.

The holder dies with the launcher twice over: PR_SET_PDEATHSIG, and end-of-file on its stdin,
a pipe only the launcher holds.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")
HOLDER_START_SECS = 30.0  # a bare Python start-up, bounded generously for a loaded machine

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_PR_SET_PDEATHSIG = 1
_READY = "ready"

_libc = ctypes.CDLL(None, use_errno=True)
# Looked up now, at import: `enter` and `_die_with_parent` run between fork and exec, where a
# symbol lookup (dlsym) in a threaded parent can deadlock.
_SETNS, _UNSHARE, _PRCTL = _libc.setns, _libc.unshare, _libc.prctl


class Unavailable(RuntimeError):
    """No private namespace can be made here; the message says why."""


class PrivateNamespace:
    """One network namespace, held open for as long as the cluster runs.

    Use `enter` as (part of) a child's preexec_fn; call `close` when the cluster has stopped.
    """

    def __init__(self, holder: subprocess.Popen, net_fd: int, user_fd: int | None):
        self.holder, self._net_fd, self._user_fd = holder, net_fd, user_fd

    @property
    def holder_pid(self) -> int:
        return self.holder.pid

    @property
    def via_user_namespace(self) -> bool:
        return self._user_fd is not None

    def enter(self) -> None:
        """Moves the calling process into the namespace. For a child between fork and exec.

        Joining a user namespace changes the process's credentials, which clears its
        PR_SET_PDEATHSIG: set the death signal after this call, not before.
        """
        if self._user_fd is not None:
            _setns(self._user_fd, _CLONE_NEWUSER)
        _setns(self._net_fd, _CLONE_NEWNET)

    def close(self) -> None:
        """Kills the holder and lets go of the namespace (it goes once its last task has)."""
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait()
        if self.holder.stdin:
            self.holder.stdin.close()
        if self.holder.stdout:
            self.holder.stdout.close()
        for fd in (self._net_fd, self._user_fd):
            if fd is not None:
                os.close(fd)


def for_cluster(mode: str) -> PrivateNamespace | None:
    """The launcher's namespace for --isolate `mode` (auto, on or off).

    Returns None for "off", and for "auto" where no namespace can be made, after one WARNING
    line that says why and what that means.

    Raises:
      Unavailable: mode "on" where no namespace can be made.
    """
    if mode == "off":
        return None
    try:
        namespace = create()
    except Unavailable as e:
        if mode == "on":
            raise
        log.warning("no private network namespace (%s): the cluster's ports are open on every "
                    "interface of this host; use it only on a trusted network", e)
        return None
    log.info("the cluster runs in a private network namespace with loopback only (held by pid "
             "%d%s): other hosts and processes outside it cannot reach its ports",
             namespace.holder_pid, ", through a user namespace" if namespace.via_user_namespace
             else "")
    return namespace


def create(*, holder_argv: list[str] | None = None) -> PrivateNamespace:
    """Starts a holder in a new network namespace with loopback up, and returns a handle on it.

    Args:
      holder_argv: the holder's command line; tests pass a stand-in. Default: this module.

    Raises:
      Unavailable: not Linux, no permission, user namespaces disabled; the message says which.
    """
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"network namespaces are Linux-only (this is {sys.platform})")
    argv = holder_argv or [sys.executable, "-m", "sync_mnist.launcher.netns"]
    holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True,
                              preexec_fn=_die_with_parent)
    try:
        ready, _, _ = select.select([holder.stdout], [], [], HOLDER_START_SECS)
        first = holder.stdout.readline().strip() if ready else ""
        if not first.startswith(_READY):
            if not ready:
                raise Unavailable(f"the namespace holder did not start within "
                                  f"{HOLDER_START_SECS:g} s")
            holder.kill()
            rest = holder.stdout.read().strip().splitlines()
            reason = first or (rest[-1] if rest else f"exit code {holder.wait()}")
            raise Unavailable(reason.removeprefix("error: "))
        # The launcher holds the namespace by these descriptors; the holder only made it.
        net_fd = _open_namespace(holder.pid, "net")
        user_fd = _open_namespace(holder.pid, "user") if first == f"{_READY} user" else None
        return PrivateNamespace(holder, net_fd, user_fd)
    except BaseException:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
        raise


def _open_namespace(pid: int, kind: str) -> int:
    try:
        return os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
    except OSError as e:
        raise Unavailable(f"cannot open the new {kind} namespace: {e.strerror}") from None


def _hold() -> int:
    """The holder's life: make the namespace, report, then wait for the launcher to go."""
    try:
        via_user = _unshare_network()
        _bring_up_loopback()
    except Unavailable as e:
        print(f"error: {e}", flush=True)
        return 1
    # Only now: a new user namespace gave this process new credentials, which cleared the death
    # signal set before exec. Should the launcher already be gone, stdin's end-of-file ends us.
    _die_with_parent()
    print(f"{_READY} user" if via_user else _READY, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when the namespace goes
    sys.stdin.read()
    return 0


def _unshare_network() -> bool:
    """Moves this (single-threaded) process into a new network namespace.

    Returns whether that needed a user namespace, i.e. whether tasks must join one too.
    """
    tried = []
    if os.geteuid() == 0:
        try:
            _unshare(_CLONE_NEWNET)
            return False
        except OSError as e:  # root without CAP_SYS_ADMIN, as in most containers
            tried.append(f"unshare(CLONE_NEWNET): {_why(e, 'root without CAP_SYS_ADMIN')}")
    uid, gid = os.geteuid(), os.getegid()
    try:
        _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
        # Map our own ids to themselves, so that the tasks' files keep their owner.
        for path, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
    except OSError as e:
        tried.append(f"unshare(CLONE_NEWUSER|CLONE_NEWNET): "
                     f"{_why(e, 'unprivileged user namespaces are not allowed')}")
        raise Unavailable("; ".join(tried)) from None
    return True


def _bring_up_loopback() -> None:
    """`ip link set lo up`, without needing the ip command: SIOCSIFFLAGS on a socket."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sH22x", b"lo", 0)
            flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request)[:18])[1]
            fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))
    except OSError as e:
        raise Unavailable(f"cannot bring up loopback in the new namespace: {_why(e)}") from None


def _why(error: OSError, not_permitted: str = "") -> str:
    hint = {
        errno.EPERM: not_permitted,
        errno.ENOSPC: "user namespaces are disabled or used up: user.max_user_namespaces",
        errno.EINVAL: "the kernel lacks network or user namespaces",
    }.get(error.errno)
    return f"{error.strerror or error}" + (f" ({hint})" if hint else "")


def _unshare(flags: int) -> None:
    if _UNSHARE(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def enter_network(fd: int) -> None:
    """Joins the network namespace open at `fd` (a child between fork and exec may call it:
    it uses only what was resolved before the fork)."""
    _setns(fd, _CLONE_NEWNET)


def _setns(fd: int, nstype: int) -> None:
    if _SETNS(fd, nstype) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _die_with_parent() -> None:
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(_hold())
