"""Shared fixtures. TensorFlow runs in tf.compat.v1 graph mode, as the package does.

The tiers are the directories below this one, chosen by what a test starts:
  fast/       nothing: no TensorFlow session or server, no task or launcher process (a test
              may build a graph, or run a command that stops before TensorFlow starts);
              `make test-fast`, under 30 s
  inprocess/  TensorFlow sessions and servers in the test's own process
  cluster/    tasks and launchers as processes, through the real command line
  recovery/   clusters through the real command line with faults injected: tasks killed,
              frozen or preempted, a ps that never answers, a worker that starts late, a
              full disk or a --logdir the ps does not share, the chaos soak stopped
              (`make test-recovery`; they wait out timeouts and restarts, 6 to 7 minutes)
  convergence/ models trained to near their planted truth, or the MLP on the complete MNIST
              and its SavedModel's scores, in-process or through the real command line
              (`make test-convergence`; about 3 minutes)
  soak/       long cluster runs (`make soak`)
  network/    clusters on the testbed's namespaces, a link partitioned; the launcher with
              no namespace of its own (`make test-network`, root; about 2 minutes)
  slurm/      the sbatch script under a real Slurm of its own (`make test-slurm`)
  container/  the TFJob's pods: as processes given the operator's TF_CONFIG, and the image
              built with podman, its pods run as containers
              (`make test-container`)
`make test` (and a bare `pytest`, see setup.cfg's testpaths) runs fast, inprocess and cluster.
The helpers shared across tiers stay here: procs.py (processes and what they leave behind),
hand_cluster.py (a cluster started task by task) and fake_task.py (a stand-in task for the
launcher's tests).
budget.py is the plugin that holds `make test`'s tiers to their CPU budgets.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import types

import pytest
from hypothesis import HealthCheck, settings

# The fuzzing profiles of tests/fast/test_fuzz.py, chosen with Hypothesis's own pytest option
# --hypothesis-profile. "fast", the default (`make test`): every entry point in a few seconds,
# the same examples on every run. "soak" (`make soak`): 10,000 fresh examples per entry point.
# Neither keeps a database: what a run finds goes into test_fuzz.py as an explicit @example.
# No deadline: each example has a bound of its own (test_fuzz.bounded) that only a hang reaches.
settings.register_profile("fast", max_examples=150, derandomize=True, deadline=None,
                          database=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", max_examples=10_000, deadline=None, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fast")

# lab/ (test infrastructure, not installed) for the processes tests start, as pytest's
# pythonpath (pyproject.toml) gives it to this one: `python -m lab.chaos` from any directory.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))

# Quiet TensorFlow's C++ logs before it is imported, as cli.main does for users.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# And without Keras 3, as cli.py starts every task: about 0.9 s of CPU less in each test process
# and each process a test starts (saved_models.py's stand-in for a user's own program excepted).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


# tryfirst: pytest-xdist reads the xdist_group marks in a hook of its own, registered after
# this file, and so otherwise called first, before the marks below exist.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Graph mode, as the package runs, once TensorFlow is in (collected test modules that
    # import it have imported it by now).
    if "tensorflow" in sys.modules:
        from sync_mnist.core import tfcompat

        tfcompat.graph_mode(verbose=False)
    # Under `make test` (pytest-xdist, --dist loadgroup), the tests that share a run go to one
    # test process, so that each run happens once, not once per process that runs one of them:
    # the session runs below, and a test module's own module-scoped fixture.
    for item in items:
        group = _shared_run_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    # The tests that start clusters first, the quick ones last: a long test handed out at the
    # end would run on alone while the other test processes sit idle.
    items.sort(key=_tier_rank)


# A test marked own_process leaves a TensorFlow call that never returns in a thread it abandons:
# the bound under test abandons it, and a task then ends its process (bounded.bounded_call).
# Left in a test process that goes on to other tests, such a call can abort it later: CI saw
# "Fatal Python error: Aborted" in an xdist test process, in the abandoned wait of test_ps.py's
# ps for a sibling that never came, once its port was free for another test's server. So each
# such test runs alone in a pytest process of its own, which ends with os._exit, as a task does.
OWN_PROCESS = "SYNC_MNIST_OWN_PROCESS"  # set in that process
OWN_PROCESS_SECS = 300.0
_exit_status = pytest.ExitCode.INTERNAL_ERROR


def pytest_configure(config):
    config.addinivalue_line("markers", "own_process: run alone in a pytest process of its "
                                       "own (tests/conftest.py, OWN_PROCESS)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """The test's body, for an own_process test: its pytest process of its own runs the test
    whole, fixtures and all (this process sets up and tears down its cheap fixtures too)."""
    if pyfuncitem.get_closest_marker("own_process") is None or os.environ.get(OWN_PROCESS):
        return None
    _in_own_process(pyfuncitem)
    return True


def _in_own_process(item) -> None:
    """Runs the test `item` in a pytest process of its own; fails or skips as it did there."""
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", item.nodeid],
        cwd=item.config.rootpath, env={**os.environ, OWN_PROCESS: "1"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=OWN_PROCESS_SECS)
    except subprocess.TimeoutExpired:
        output = f"(no result within {OWN_PROCESS_SECS:g} s)"
    finally:
        _kill_group(child)
    lines = output.strip().splitlines() or [""]
    summary = lines[-1]  # "1 passed in 3.1s", "1 skipped in ...", ...
    if child.returncode == pytest.ExitCode.OK and summary.startswith("1 skipped"):
        pytest.skip(f"in its own process: {lines[-2]}")
    if child.returncode != pytest.ExitCode.OK or not summary.startswith("1 passed"):
        pytest.fail(f"in its own process, pytest ended {child.returncode}:\n{output}",
                    pytrace=False)


def _kill_group(child) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = exitstatus


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if os.environ.get(OWN_PROCESS):  # its report is written; the abandoned call goes with it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(_exit_status))


def _tier_rank(item) -> int:
    return {"fast": 2, "inprocess": 1}.get(item.path.parent.name, 0)


def _shared_run_group(item) -> str | None:
    names = set(getattr(item, "fixturenames", ()))
    if {"fixed_run", "question_run"} & names:
        return "shared_runs"
    info = getattr(item, "_fixtureinfo", None)
    for fixturedefs in (info.name2fixturedefs.values() if info else ()):
        if any(d.scope == "module" and d.baseid == item.nodeid.split("::")[0]
               for d in fixturedefs):
            return item.nodeid.split("::")[0]
    return None


@pytest.fixture
def without_pytorch(monkeypatch):
    """The bench's plans as a fresh clone's `make install` leaves them: no PyTorch, so no ddp
    row (tests/fast/test_bench_ddp.py has it)."""
    from sync_mnist.bench import bench

    monkeypatch.setattr(bench, "torch_installed", lambda: False)


@pytest.fixture
def processes():
    """Starts processes for a test; kills each one's process group when the test ends."""
    from procs import Processes

    procs = Processes()
    try:
        yield procs
    finally:
        procs.kill_all()


# Run a command where no network namespace can be made: a user namespace (root inside is
# mapped to root outside, so files keep working) that may create no further user namespace,
# and a bounding set without CAP_SYS_ADMIN, so no network namespace either.
LOCKED_DOWN = ("unshare", "--user", "--map-root-user", "sh", "-c",
               'echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv '
               '--bounding-set=-sys_admin --inh-caps=-sys_admin "$@"', "locked-down")


@pytest.fixture(scope="session")
def locked_down():
    """The LOCKED_DOWN prefix, if this machine can build it; else skip, saying why (for the
    netns tests of tests/fast and tests/cluster)."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("needs util-linux's unshare and setpriv to simulate a locked-down host")
    probe = subprocess.run([*LOCKED_DOWN, "unshare", "--net", "true"], capture_output=True,
                           text=True, timeout=30)
    if "unshare failed" not in probe.stderr:  # the prefix itself failed, or did not lock
        pytest.skip("cannot simulate a host without namespaces (user namespace with "
                    f"user.max_user_namespaces=0 and no CAP_SYS_ADMIN): rc={probe.returncode} "
                    f"{probe.stderr.strip()!r}")
    return LOCKED_DOWN


SHARED_STEPS = 60  # long enough that the cluster is still up while it is probed from outside


@pytest.fixture(scope="session")
def fixed_run(tmp_path_factory):
    """One launcher run of the fixed setup, 1 ps + 3 workers, shared by the tests that each
    used to start an identical one (lockstep, nothing left behind, the question's options,
    summaries over time, the private namespace).

    In a private network namespace where one can be made (`--isolate on`, on ports free on
    this host too, so that a refusal cannot come from someone else's server), else with the
    default `--isolate auto`. While it trains, it is probed from outside; the record holds
    what was seen.
    """
    from procs import (Processes, cluster_ports, free_run, interfaces, listening_ports,
                       ns_inode, processes_mentioning, read_json, refused_from_here, task_pids)
    from sync_mnist.launcher import netns

    tmp = tmp_path_factory.mktemp("fixed_run")
    run = types.SimpleNamespace(isolated=False, why_not_isolated=None, base=free_run(4),
                                marker=str(tmp / "data"), logdir=tmp / "logdir",
                                own_inode=ns_inode("self"))
    try:
        netns.create().close()
        run.isolated = True
    except netns.Unavailable as e:
        run.why_not_isolated = str(e)
    procs = Processes()
    try:
        # --log-every 10, as test_verdict_runs gives the question's setup; --timeout 30, not its
        # 10, because the workers wait that long for a ps that a loaded machine starts slowly.
        launcher = procs.launcher(
            "--isolate", "on" if run.isolated else "auto", "--base-port", str(run.base),
            "--dataset", "synthetic", "--train-steps", str(SHARED_STEPS), "--timeout", "30",
            "--log-every", "10", "--data-dir", run.marker, "--logdir", str(run.logdir),
            "--summary-json", str(tmp / "cluster.json"))
        run.ports = cluster_ports(launcher)
        launcher.wait_for_line(r"\[worker 0\] ready after", 180)
        tasks = task_pids(launcher.popen.pid)
        run.task_inodes = {task: ns_inode(pid) for task, pid in tasks.items()}
        some_task = tasks["ps 0"]
        run.interfaces = interfaces(some_task)
        run.listening = listening_ports(f"/proc/{some_task}")
        run.refused = {port: refused_from_here(port) for port in run.ports}
        run.code = launcher.wait(240)
        run.output = launcher.output
    finally:
        procs.kill_all()
    run.summary = read_json(tmp / "cluster.json")
    run.leftovers = processes_mentioning(run.marker)
    return run


QUESTION_TIMEOUT = 30


@pytest.fixture(scope="session")
def question_run(tmp_path_factory):
    """One launcher run of the question's setup (`--setup question`), with the fixed run's
    --train-steps and --log-every, --timeout QUESTION_TIMEOUT and --logdir; shared by the tests of its
    verdict and of its picture."""
    from procs import Processes, processes_mentioning, read_json

    tmp = tmp_path_factory.mktemp("question_run")
    run = types.SimpleNamespace(marker=str(tmp / "data"), logdir=tmp / "logdir")
    procs = Processes()
    try:
        launcher = procs.launcher(
            "--base-port", "0", "--dataset", "synthetic", "--setup", "question",
            # --timeout 30: its non-chief workers wait Supervisor's 30 s poll plus --timeout
            # for the chief's model; with 10, a loaded machine (a make test beside two
            # cluster runs) had the chief not ready within those 40 s, and with 20 within 50 s.
            "--train-steps", str(SHARED_STEPS), "--timeout", str(QUESTION_TIMEOUT),
            "--log-every", "10",
            "--data-dir", run.marker, "--logdir", str(run.logdir),
            "--summary-json", str(tmp / "cluster.json"))
        run.code = launcher.wait(300)
        run.output = launcher.output
    finally:
        procs.kill_all()
    run.summary = read_json(tmp / "cluster.json")
    run.leftovers = processes_mentioning(run.marker)
    return run
