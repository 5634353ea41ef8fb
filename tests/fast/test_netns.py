"""The launcher's private network namespace (issue 4, Security).

A TensorFlow gRPC server listens on every interface and runs any graph any client sends. The
localhost launcher therefore runs the whole cluster in one network namespace with loopback
only. These tests show that the namespace has only loopback and that its ports cannot be
reached from outside, that its holder dies with the launcher, and that where no namespace can
be made the reason names each attempt and `--isolate on` refuses with exit 2. Whole clusters
in it (or not: `--isolate off`, or where none can be made) are in
tests/cluster/test_isolated_cluster.py.

"Where no namespace can be made" is reproduced for real, not mocked (conftest.py's
`locked_down`): a user namespace of the test's own in which CAP_SYS_ADMIN is dropped and
user.max_user_namespaces is 0, as in a locked-down container. That sysctl is per user namespace, so the host's value is untouched.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from procs import ENV, ROOT, interfaces, listening_ports, ns_inode, refused_from_here
from sync_mnist.core.cluster import free_ports
from sync_mnist.launcher import cli as launcher_cli
from sync_mnist.launcher import launch, netns

COMMON = ("--dataset", "synthetic", "--train-steps", "60", "--timeout", "60", "--log-every", "10")


def _namespace_or_skip() -> netns.PrivateNamespace:
    try:
        return netns.create()
    except netns.Unavailable as e:
        pytest.skip(f"no network namespace can be made here: {e}")


@pytest.fixture
def namespace():
    ns = _namespace_or_skip()
    try:
        yield ns
    finally:
        ns.close()


# ---------------------------------------------------------------- the namespace on its own

def test_namespace_has_only_loopback_and_its_ports_are_unreachable_from_outside(namespace):
    port = free_ports(1)[0]
    server = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import socket, sys
            s = socket.socket(socket.AF_INET6)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::", {port})); s.listen()  # every interface, as a gRPC server binds
            print("listening", flush=True)
            sys.stdin.read()""")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=namespace.enter,
        start_new_session=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        assert ns_inode(server.pid) == ns_inode(namespace.holder_pid) != ns_inode("self")
        assert interfaces(server.pid) == ["lo"]
        # From inside, the port answers; from here, on this host, it does not.
        inside = subprocess.run(
            [sys.executable, "-c", f"import socket; socket.create_connection(('localhost', "
                                   f"{port}), timeout=5); print('connected')"],
            preexec_fn=namespace.enter, capture_output=True, text=True, timeout=30)
        assert inside.stdout.strip() == "connected", inside.stderr
        assert port in listening_ports(f"/proc/{server.pid}")
        assert refused_from_here(port).keys() == {"127.0.0.1", "::1"}
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.communicate()  # reaps it and closes the pipes


def test_holder_dies_with_the_launcher_and_on_close():
    _namespace_or_skip().close()  # skips where no namespace can be made
    launcher = subprocess.Popen(
        [sys.executable, "-c", "from sync_mnist.launcher import netns; import time; "
                               "print(netns.create().holder_pid, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=ENV, start_new_session=True)
    try:
        holder = int(launcher.stdout.readline())
        assert Path(f"/proc/{holder}").exists()
        os.killpg(launcher.pid, signal.SIGKILL)  # no finally runs: only the kernel can help
        launcher.wait()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{holder}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{holder}").exists(), "the holder outlived its launcher"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate()

    ns = netns.create()
    ns.close()
    assert ns.holder.returncode is not None and not Path(f"/proc/{ns.holder_pid}").exists()


@pytest.mark.parametrize("holder, reason", [
    ("print('error: unshare(CLONE_NEWNET): Operation not permitted')",
     "unshare(CLONE_NEWNET): Operation not permitted"),
    ("import sys; sys.exit(3)", "exit code 3"),
    ("raise SystemExit('something else went wrong')", "something else went wrong"),
])
def test_a_holder_that_fails_gives_its_reason(holder, reason):
    with pytest.raises(netns.Unavailable) as failure:
        netns.create(holder_argv=[sys.executable, "-c", holder])
    assert str(failure.value) == reason


def _unprivileged_python() -> str | None:
    """A Python interpreter that user `nobody` may run (the venv's may live under /root)."""
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin") or ""
    for candidate in dict.fromkeys([sys.executable, sys._base_executable, system]):
        if candidate and subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", candidate,
                 "-c", "import subprocess, sys; assert sys.version_info >= (3, 10); "
                       "subprocess.run([sys.executable, '-c', ''], check=True)"],
                capture_output=True, cwd="/", timeout=30).returncode == 0:
            return candidate
    return None


def test_an_unprivileged_user_gets_a_namespace_through_a_user_namespace():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to become an unprivileged user")
    python = _unprivileged_python()
    if python is None:
        pytest.skip("no Python >= 3.10 that user nobody may run")
    script = textwrap.dedent("""
        import os, subprocess, sys
        from sync_mnist.launcher import netns
        try:
            ns = netns.create()
        except netns.Unavailable as e:
            print("unavailable:", e); sys.exit(0)
        child = subprocess.run(
            [sys.executable, "-c", "import os; rows = open('/proc/self/net/dev').readlines(); "
             "print(os.getuid(), ','.join(sorted(r.split(':')[0].strip() for r in rows[2:])))"],
            preexec_fn=ns.enter, capture_output=True, text=True)
        print(ns.via_user_namespace, child.stdout.strip() or child.stderr)
        ns.close()""")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python,
                          "-c", script], capture_output=True, text=True, cwd="/", timeout=60,
                         env={**ENV, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("unavailable:"):
        pytest.skip(f"unprivileged user namespaces are not allowed here: {out.stdout.strip()}")
    # Through a user namespace that maps nobody to nobody: files keep their owner.
    assert out.stdout.split() == ["True", "65534", "lo"], out.stdout


def test_where_no_namespace_can_be_made_the_reason_names_each_attempt(locked_down):
    out = subprocess.run([*locked_down, sys.executable, "-c",
                          "from sync_mnist.launcher import netns\ntry: netns.create()\n"
                          "except netns.Unavailable as e: print(e)"],
                         capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60)
    assert out.stdout.strip() == (
        "unshare(CLONE_NEWNET): Operation not permitted (root without CAP_SYS_ADMIN); "
        "unshare(CLONE_NEWUSER|CLONE_NEWNET): No space left on device (user namespaces are "
        "disabled or used up: user.max_user_namespaces)"), out.stderr


def test_isolate_on_where_impossible_exits_2_in_one_line(locked_down, tmp_path):
    out = subprocess.run([*locked_down, str(ROOT / "bin" / "sync-mnist-cluster"), "--isolate",
                          "on", *COMMON, "--summary-json", str(tmp_path / "cluster.json")],
                         capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: --isolate on: no private network namespace: unshare(CLONE_NEWNET): Operation "
        "not permitted (root without CAP_SYS_ADMIN); unshare(CLONE_NEWUSER|CLONE_NEWNET): No "
        "space left on device (user namespaces are disabled or used up: "
        "user.max_user_namespaces)"]
    assert "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "cluster.json").exists()  # no task was started


# --------------------------------------------------------------------- the command line

@pytest.fixture
def recorded_cluster(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "run_cluster", lambda **kwargs: calls.append(kwargs) or 0)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield calls
    root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("argv, isolate", [([], "auto"), (["--isolate", "off"], "off"),
                                           (["--isolate=on"], "on")])
def test_isolate_is_the_launchers_own_option(recorded_cluster, argv, isolate):
    assert launcher_cli.main([*argv, "--train-steps", "5"]) == 0
    (kwargs,) = recorded_cluster
    assert kwargs["isolate"] == isolate
    assert kwargs["task_args"] == ["--train-steps", "5"]  # never passed on to the tasks


def test_isolate_rejects_an_unknown_value(recorded_cluster, capsys):
    with pytest.raises(SystemExit) as exit_info:
        launcher_cli.main(["--isolate", "maybe"])
    assert exit_info.value.code == 2
    assert "argument --isolate: invalid choice: 'maybe'" in capsys.readouterr().err
    assert recorded_cluster == []
