"""Soak (issue 4, scenario 8): back-to-back short clusters through the real command line.

Each run must exit 0 in lockstep, within a hard bound, and leave nothing behind: no process
of the run, and no port in use. Where the launcher runs the cluster in a private network
namespace (`--isolate auto`, the default), the ports live in that namespace, so "no port left"
means the namespace itself is gone: no process is in it and no file descriptor holds it. With
`--isolate off` (SOAK_ISOLATE=off) the ports are on this host and are checked here.

Slow, so it is in tests/soak: `make soak`, or `pytest -s tests/soak/test_back_to_back.py`.
The closing figures are always printed; with SOAK_REPORT set they are also written there as
JSON. SOAK_RUNS changes the number of runs (default 20).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import sys
import time
from pathlib import Path

from procs import listening_ports, processes_mentioning, read_json

RUNS = int(os.environ.get("SOAK_RUNS", "20"))
ISOLATE = ("--isolate", os.environ["SOAK_ISOLATE"]) if os.environ.get("SOAK_ISOLATE") else ()
STEPS = 20
WORKERS = 3
BOUND = 180  # seconds one small cluster run may take on a loaded 2-core machine
COMMON = ("--base-port", "0", "--dataset", "synthetic", "--train-steps", str(STEPS),
          "--timeout", "60", "--log-every", "10")
# The launcher logs the namespace holder (when it makes a namespace), then the cluster line:
# "cluster: ps localhost:P, workers localhost:A,localhost:B; dataset ...".
HOLDER_OR_CLUSTER = r"held by pid (?P<holder>\d+)|cluster: ps "
CLUSTER_LINE = re.compile(r"cluster: ps (?P<ps>[^\s,;]+(?:,[^\s,;]+)*), "
                          r"workers (?P<workers>[^\s,;]+(?:,[^\s,;]+)*)")
HOLDER_ARGV = "sync_mnist.launcher.netns"  # the namespace holder's command line: python -m sync_mnist.launcher.netns


def _ports(launcher_output: str) -> list[int]:
    match = CLUSTER_LINE.search(launcher_output)
    assert match, f"no 'cluster: ps ..., workers ...' line in:\n{launcher_output}"
    hosts = match["ps"].split(",") + match["workers"].split(",")
    return [int(h.rsplit(":", 1)[1]) for h in hosts]


def _bind_fails(port: int) -> str | None:
    """Why `port` cannot be bound as gRPC binds it (wildcard, SO_REUSEADDR), or None if it can.

    With SO_REUSEADDR, Linux refuses the bind only while a socket listens on the port: a port
    whose last connections sit in TIME_WAIT binds, and gRPC could serve on it again.
    """
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                return f"bind {host}:{port}: {e.strerror}"
    return None


def _netns(pid: int | str) -> str | None:
    """pid's network namespace, as /proc names it ("net:[4026532...]"), or None if it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _holding(namespace: str) -> list[str]:
    """Processes in `namespace`, or holding a file descriptor on it: what keeps it alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        if _netns(entry.name) == namespace:
            found.append(f"{entry.name}: in it")
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == namespace:
                    found.append(f"{entry.name}: fd {fd.name}")
            except OSError:
                continue
    return found


def _alive_holder(pid: int | None) -> list[str]:
    if pid is None:
        return []
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return []
    return [f"{pid}: {argv}"] if HOLDER_ARGV in argv else []


def _kill(entries: list[str]) -> None:
    """SIGKILLs each "pid: ..." entry (its process group too); all are this test's own."""
    for entry in entries:
        pid = int(entry.split(":", 1)[0])
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _one_run(processes, run_dir: Path, record: dict) -> None:
    """One cluster run and its checks; fills `record` as it learns, raises on the first failure."""
    marker = str(run_dir / "data")  # every task's command line carries it (--data-dir)
    summary_path = run_dir / "cluster.json"
    started = time.monotonic()
    holder = None
    launcher = processes.launcher(*COMMON, *ISOLATE, "--data-dir", marker,
                                  "--summary-json", str(summary_path))
    try:
        first = launcher.wait_for_line(HOLDER_OR_CLUSTER, BOUND)
        if first["holder"]:
            holder = int(first["holder"])
            record["namespace"] = _netns(holder)  # read while the cluster runs in it
        # The hard bound on the whole run: raises, with the output, on a hang.
        code = launcher.wait(max(1.0, BOUND - (time.monotonic() - started)))
        record["wall_s"] = round(time.monotonic() - started, 3)
        record["exit_code"] = code
        # The launcher has reaped every task and the holder, so their sockets are closed and
        # their namespace references dropped: check right away, no waiting.
        record["ports"] = ports = _ports(launcher.output)
        record["isolated"] = holder is not None
        record["orphans"] = processes_mentioning(marker) + _alive_holder(holder)
        if holder is None:
            listening = listening_ports()
            record["ports_listening"] = [p for p in ports if p in listening]
            record["ports_unbindable"] = [why for why in map(_bind_fails, ports) if why]
        else:
            assert record["namespace"], f"namespace holder {holder} gone while the run was up"
            record["namespace_left"] = left = _holding(record["namespace"])
            # Listening sockets can only survive in a namespace that survives.
            in_it = [e.split(":", 1)[0] for e in left if e.endswith("in it")]
            listening = listening_ports(f"/proc/{in_it[0]}") if in_it else set()
            record["ports_listening"] = [p for p in ports if p in listening]

        assert code == 0, f"launcher exited {code}; output:\n{launcher.output}"
        summary = read_json(summary_path)
        record["launcher_wall_s"] = summary["wall_s"]
        assert summary["global_step"] == STEPS, summary
        assert summary["contributions"] == [STEPS] * WORKERS, summary
        assert summary["synchronous"] is True, summary
        assert record["orphans"] == [], record["orphans"]
        assert record.get("namespace_left", []) == [], \
            f"namespace {record['namespace']} still held: {record['namespace_left']}"
        assert record["ports_listening"] == [], f"still listening: {record['ports_listening']}"
        assert record.get("ports_unbindable", []) == [], record["ports_unbindable"]
    finally:
        record.setdefault("wall_s", round(time.monotonic() - started, 3))
        launcher.kill()  # its own process group; tasks die with it (PR_SET_PDEATHSIG)
        record["killed_after"] = processes_mentioning(marker) + _alive_holder(holder)
        _kill(record["killed_after"])


def _figures(records: list[dict]) -> dict:
    walls = [r["wall_s"] for r in records]
    return {
        "runs": len(records),
        "passed": sum(r["passed"] for r in records),
        "isolated_runs": sum(bool(r.get("isolated")) for r in records),
        "wall_s": {"min": min(walls), "median": statistics.median(walls), "max": max(walls),
                   "total": round(sum(walls), 3)},
        "orphans_found": sum(len(r.get("orphans", [])) for r in records),
        "ports_left_listening": sum(len(r.get("ports_listening", [])) for r in records),
        "ports_unbindable": sum(len(r.get("ports_unbindable", [])) for r in records),
        "namespaces_left": sum(bool(r.get("namespace_left")) for r in records),
        "killed_in_cleanup": sum(len(r["killed_after"]) for r in records),
        "failures": [{"run": r["run"], "error": r["error"]} for r in records if not r["passed"]],
        "per_run": [{k: r.get(k) for k in ("run", "passed", "wall_s", "launcher_wall_s",
                                            "exit_code", "isolated", "ports")}
                    for r in records],
    }


def _short(text: str, head: int = 1500, tail: int = 2500) -> str:
    return text if len(text) <= head + tail else f"{text[:head]}\n[...]\n{text[-tail:]}"


def test_back_to_back_clusters_leave_nothing_behind(processes, tmp_path, capsys):
    records = []
    for run in range(1, RUNS + 1):
        record = {"run": run, "passed": False, "error": None}
        records.append(record)
        try:
            _one_run(processes, tmp_path / f"run-{run:02d}", record)
            record["passed"] = True
        except AssertionError as e:
            # Keep going: a soak reports how often it fails, not just that it did.
            record["error"] = _short(str(e))

    figures = _figures(records)
    if os.environ.get("SOAK_REPORT"):
        Path(os.environ["SOAK_REPORT"]).write_text(json.dumps(figures, indent=2) + "\n")
    w = figures["wall_s"]
    with capsys.disabled():
        print(f"\nsoak: {figures['runs']} runs ({figures['isolated_runs']} in a private "
              f"network namespace), {figures['passed']} passed; wall s min {w['min']:.1f} "
              f"median {w['median']:.1f} max {w['max']:.1f} total {w['total']:.1f}; orphans "
              f"{figures['orphans_found']}; ports left listening "
              f"{figures['ports_left_listening']}; unbindable {figures['ports_unbindable']}; "
              f"namespaces left {figures['namespaces_left']}; killed in cleanup "
              f"{figures['killed_in_cleanup']}")
        for f in figures["failures"]:
            print(f"soak: run {f['run']} failed: {f['error']}")

    assert processes_mentioning(str(tmp_path)) == []
    assert figures["failures"] == [], [f"run {f['run']}" for f in figures["failures"]]


def test_chaos_quick_runs_classify_every_run_and_find_no_defect(processes, tmp_path, capsys):
    """`make chaos ARGS=--quick`: four runs, one of each fault (a worker killed with restarts,
    a backup stopped for less than --timeout, a worker stopped for more, a ps preempted and
    the rerun resumed), each classified."""
    out = tmp_path / "chaos.json"
    chaos = processes.start([sys.executable, "-m", "lab.chaos", "--quick",
                             "--json", str(out)], "chaos")
    code = chaos.wait(900)
    with capsys.disabled():
        print("\n" + chaos.output)
    runs = read_json(out)["runs"]
    assert [r["category"] for r in runs] == ["restarted", "verified", "failed-named",
                                             "preempted"], chaos.output
    assert all(r["fault_landed"] and r["leftovers"] == [] for r in runs), runs
    assert runs[2]["code"] == 200  # every failure a bounded wait: the frozen worker's peers
    assert code == 0, chaos.output
