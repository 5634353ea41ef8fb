"""The launcher's private network namespace (issue 4, Security).

A TensorFlow gRPC server listens on every interface and runs any graph any client sends. The
localhost launcher therefore runs the whole cluster in one network namespace with loopback
only. These tests show, from outside that namespace, that its ports cannot be reached while
the cluster trains, that `--isolate off` leaves them reachable, and that where no namespace
can be made the launcher says so once (auto) or refuses with exit 2 (on). The `--isolate off`
run is also the launcher's only async run.

"Where no namespace can be made" is reproduced for real, not mocked: a user namespace of the
test's own in which CAP_SYS_ADMIN is dropped and user.max_user_namespaces is 0, as in a
locked-down container. That sysctl is per user namespace, so the host's value is untouched.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from procs import (ENV, ROOT, cluster_ports, interfaces, listening_ports, ns_inode,
                   reachable_from_here,
                   read_json, refused_from_here, task_pids)
from sync_mnist.cluster import free_ports
from sync_mnist.launcher import cli as launcher_cli
from sync_mnist.launcher import launch, netns

STEPS = 60  # long enough that the cluster is still up while the test probes it
BOUND = 90  # seconds a whole small cluster run may take on a loaded 2-core machine
COMMON = ("--dataset", "synthetic", "--train-steps", str(STEPS), "--timeout", "60",
          "--log-every", "10")
CHIEF_READY = r"\[worker 0\] ready after"
# Run a command where no network namespace can be made: a user namespace (root inside is
# mapped to root outside, so files keep working) that may create no further user namespace,
# and a bounding set without CAP_SYS_ADMIN, so no network namespace either.
LOCKED_DOWN = ("unshare", "--user", "--map-root-user", "sh", "-c",
               'echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv '
               '--bounding-set=-sys_admin --inh-caps=-sys_admin "$@"', "locked-down")


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


@pytest.fixture(scope="module")
def locked_down():
    """The LOCKED_DOWN prefix, if this machine can build it; else skip, saying why."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("needs util-linux's unshare and setpriv to simulate a locked-down host")
    probe = subprocess.run([*LOCKED_DOWN, "unshare", "--net", "true"], capture_output=True,
                           text=True, timeout=30)
    if "unshare failed" not in probe.stderr:  # the prefix itself failed, or did not lock
        pytest.skip("cannot simulate a host without namespaces (user namespace with "
                    f"user.max_user_namespaces=0 and no CAP_SYS_ADMIN): rc={probe.returncode} "
                    f"{probe.stderr.strip()!r}")
    return LOCKED_DOWN


def _assert_lockstep(summary: dict, workers: int) -> None:
    assert summary["global_step"] == STEPS
    assert summary["contributions"] == [STEPS] * workers
    assert summary["synchronous"] is True
    assert [t["exit_code"] for t in summary["tasks"]] == [0] * (workers + 1)


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


# ------------------------------------------------------------------- whole clusters

@pytest.mark.cluster
def test_isolated_cluster_is_unreachable_from_outside_and_trains_in_lockstep(fixed_run):
    # The shared run (conftest.py) is the launcher's default, in a private namespace where
    # one can be made, probed from outside while it trained.
    if not fixed_run.isolated:
        pytest.skip(f"no network namespace can be made here: {fixed_run.why_not_isolated}")
    assert fixed_run.ports == list(range(fixed_run.base, fixed_run.base + 4))  # as asked
    assert sorted(fixed_run.task_inodes) == ["ps 0", "worker 0", "worker 1", "worker 2"]
    inodes = set(fixed_run.task_inodes.values())
    assert len(inodes) == 1 and fixed_run.own_inode not in inodes  # one namespace, not ours
    assert fixed_run.interfaces == ["lo"]  # no way in from any other host
    assert set(fixed_run.ports) <= fixed_run.listening  # the servers really were up, inside
    assert all(r.keys() == {"127.0.0.1", "::1"} for r in fixed_run.refused.values()), \
        fixed_run.refused
    assert fixed_run.code == 0, fixed_run.output
    assert fixed_run.summary["synchronous"] is True
    assert "private network namespace with loopback only" in fixed_run.output
    assert fixed_run.leftovers == []


@pytest.mark.cluster
def test_isolate_off_leaves_the_ports_reachable_and_async_mode_shows_its_signature(
        processes, tmp_path):
    # Two behaviours from one run, to save a cluster's start-up: --isolate off, and the async
    # mode's counters (which no other launcher test runs).
    launcher = processes.launcher("--isolate", "off", "--base-port", "0", *COMMON,
                                  "--mode", "async", "--workers", "2",
                                  "--summary-json", str(tmp_path / "cluster.json"))
    ports = cluster_ports(launcher)
    launcher.wait_for_line(CHIEF_READY, BOUND)
    tasks = task_pids(launcher.popen.pid)
    assert {ns_inode(pid) for pid in tasks.values()} == {ns_inode("self")}
    assert [p for p in ports if not reachable_from_here(p)] == []

    assert launcher.wait(BOUND) == 0, launcher.output
    assert "network namespace" not in launcher.output
    summary = read_json(tmp_path / "cluster.json")
    # Every push is an update of its own: global_step is the total of the local steps.
    assert summary["local_steps"] == [STEPS] * 2
    assert summary["global_step"] == 2 * STEPS == sum(summary["pushed"])
    assert summary["synchronous"] is False
    assert "asynchronous (--mode async)" in summary["verdict"]
    assert [t["exit_code"] for t in summary["tasks"]] == [0, 0, 0]


@pytest.mark.cluster
def test_auto_where_impossible_says_so_once_and_goes_on(locked_down, processes, tmp_path):
    launcher = processes.start(
        [*locked_down, str(ROOT / "bin" / "sync-mnist-cluster"), "--base-port", "0", *COMMON,
         "--workers", "2", "--summary-json", str(tmp_path / "cluster.json")], "launcher")
    ports = cluster_ports(launcher)
    launcher.wait_for_line(CHIEF_READY, BOUND)
    assert [p for p in ports if not reachable_from_here(p)] == []  # exposed, as it says

    assert launcher.wait(BOUND) == 0, launcher.output
    _assert_lockstep(read_json(tmp_path / "cluster.json"), workers=2)
    said = [line for line in launcher.output.splitlines() if "namespace" in line]
    assert len(said) == 1, said
    assert re.search(r"\[cluster\] warning: no private network namespace \(unshare\(CLONE_NEWNET\): "
                     r"Operation not permitted .*\): the cluster's ports are open on every "
                     r"interface of this host; use it only on a trusted network$", said[0])
