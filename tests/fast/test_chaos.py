"""The chaos soak (lab/chaos.py): its plans and how it judges a run.

The classifier is pure, so every outcome it must tell apart is given here as the launcher
would leave it (exit code, --summary-json, output lines). The soak itself, a few real runs, is
in tests/soak/test_back_to_back.py (`make soak`).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import threading

import pytest

from lab import chaos


def _plan(**changes) -> chaos.Plan:
    fields = dict(run=1, ps=1, replicas=3, max_restarts=0, victim="worker 1", fault="kill",
                  phase="training", pause=0.0, at_step=50, delay=0.1, timeout=15.0,
                  train_steps=100, log_every=10)
    return chaos.Plan(**{**fields, **changes})


def _verified(steps=100, **changes) -> dict:
    summary = dict(synchronous=True, global_step=steps, target_steps=steps,
                   contributions=[steps] * 3, restarts={}, tasks=[], stop_step=None,
                   verdict=f"synchronous: each of {steps} updates averaged exactly one gradient "
                           f"from each of 3 workers; contributions {[steps] * 3}")
    return {**summary, **changes}


def _seen(code=0, summary=None, lines=(), **changes) -> dict:
    seen = dict(code=code, summary=_verified() if summary is None else summary,
                lines=list(lines), hang=False, leftovers=[], fault_landed=True)
    return {**seen, **changes}


def test_a_verified_run_and_one_verified_after_a_restart():
    assert chaos.classify(_plan(), _seen()) == ("verified", [])
    restarted = _verified(restarts={"worker 1": 1})
    assert chaos.classify(_plan(max_restarts=3), _seen(summary=restarted)) == ("restarted", [])


def test_a_documented_failure_must_name_the_victim():
    named = ["21:00:01 [cluster] error: worker 1 exited with code -9; stopping the cluster"]
    failed = dict(synchronous=False, verdict=None, global_step=None, contributions=None)
    assert chaos.classify(_plan(), _seen(1, failed, named)) == ("failed-named", [])
    other = ["21:00:01 [cluster] error: worker 2 exited with code 200; stopping the cluster"]
    assert chaos.classify(_plan(), _seen(200, failed, other)) == ("defect", ["unnamed"])
    # One ps: "the ps" names it.
    ps_lines = ["[worker 0] error: worker 0: waited 15 s for an update after local step 40; "
                "the ps is reachable but its counters cannot be read"]
    assert chaos.classify(_plan(victim="ps 0"), _seen(200, failed, ps_lines))[0] == "failed-named"
    assert chaos.classify(_plan(victim="ps 0", ps=2), _seen(200, failed, ps_lines)) == \
        ("defect", ["unnamed"])


def test_a_verified_run_reported_as_a_failure_contradicts_its_counters():
    lines = ["[cluster] error: ps 0 exited with code -9; stopping the cluster"]
    assert chaos.classify(_plan(victim="ps 0"), _seen(200, _verified(), lines)) == \
        ("defect", ["contradiction"])


def test_a_run_a_worker_verified_that_then_failed_is_a_defect():
    # The ps frozen at the end: the chief and worker 1 verified the final counters and exited
    # 0, then the run ended 200 (the ps, waiting for done reports, ran past the launcher's end
    # bound). A verified result must stand.
    tasks = [{"role": "worker", "index": 1, "exit_code": 0, "synchronous": True},
             {"role": "worker", "index": 0, "exit_code": 0, "synchronous": True},
             {"role": "worker", "index": 2, "exit_code": 200, "synchronous": None}]
    summary = _verified(synchronous=False, tasks=tasks)
    lines = ["[cluster] error: ps 0 still running 70 s after worker 2 ended; stopping the "
             "cluster"]
    frozen = dict(victim="ps 0", fault="stop-long", pause=25.0, phase="end")
    assert chaos.classify(_plan(**frozen), _seen(200, summary, lines)) == \
        ("defect", ["verified-but-failed"])
    # Frozen past --timeout before the chief ended, with no restart: the chief's evaluation
    # waited for it, and the run fails (the README's exception); with restarts it should not.
    tasks[1] = {"role": "worker", "index": 0, "exit_code": 130, "synchronous": None}
    assert chaos.classify(_plan(**frozen), _seen(200, summary, lines)) == ("failed-named", [])
    assert chaos.classify(_plan(**frozen, max_restarts=3), _seen(200, summary, lines)) == \
        ("defect", ["restart-failed", "verified-but-failed"])


def test_the_model_lost_before_the_chief_ended_is_the_documented_exit_1():
    # The others verified the counters; the chief, killed before it ended and not restarted,
    # lost its evaluation and its model: exit 1, as the README says. With restarts allowed,
    # the same ending is a defect (the launcher should have restarted it).
    tasks = [{"role": "worker", "index": 1, "exit_code": 0, "synchronous": True},
             {"role": "worker", "index": 0, "exit_code": -9, "synchronous": None}]
    summary = _verified(synchronous=False, tasks=tasks)
    lines = ["[cluster] error: worker 0 exited with code -9; stopping the cluster"]
    chief = dict(victim="worker 0", fault="kill", max_restarts=0)
    assert chaos.classify(_plan(**chief), _seen(1, summary, lines)) == ("failed-named", [])
    chief["max_restarts"] = 3
    assert chaos.classify(_plan(**chief), _seen(1, summary, lines)) == \
        ("defect", ["restart-failed", "verified-but-failed"])
    # A ps killed before the chief ended took the model with it: exit 1 too, not restarted
    # (the launcher stops the cluster). Restarted, it comes back empty (ModelLost) and the
    # chief restores the last checkpoint: a failure is then a defect (issue 35: every run
    # with a restart allowed ends verified).
    lines = ["[cluster] error: ps 1 exited with code -9; stopping the cluster"]
    ps = dict(victim="ps 1", ps=2, fault="kill")
    assert chaos.classify(_plan(**ps, max_restarts=0), _seen(1, summary, lines)) == \
        ("failed-named", [])
    assert chaos.classify(_plan(**ps, max_restarts=1), _seen(1, summary, lines)) == \
        ("defect", ["restart-failed"])


def test_a_preempted_run_must_resume_and_end_verified_with_the_whole_plan():
    term = _plan(fault="term")
    stopped = _verified(steps=40, target_steps=100, stop_step=40, preempted_at=40)
    resumed = dict(code=0, summary=_verified(), wall_s=9.0)
    assert chaos.classify(term, _seen(143, stopped, rerun=resumed)) == ("preempted", [])
    # The rerun started over (its contributions are its own), or failed: a defect.
    over = dict(resumed, summary=_verified(contributions=[60, 60, 60]))
    assert chaos.classify(term, _seen(143, stopped, rerun=over)) == ("defect", ["not-resumed"])
    assert chaos.classify(term, _seen(143, stopped, rerun=dict(resumed, code=200))) == \
        ("defect", ["not-resumed"])
    # 143 after any other fault is not what the README says.
    assert chaos.classify(_plan(), _seen(143, stopped))[1] == ["unexpected-code"]


def test_exit_0_without_the_counters_to_show_it_is_a_contradiction():
    short = _verified(contributions=[100, 100, 99])
    assert chaos.classify(_plan(), _seen(0, short)) == ("defect", ["contradiction"])
    assert chaos.classify(_plan(), _seen(0, {})) == ("defect", ["contradiction"])  # no record


def test_two_gradients_of_one_worker_in_lockstep_is_a_defect_not_so_with_backups():
    verdict = ("NOT synchronous: contributions [759, 756, 585] are not 700 for every worker; "
               "115 of 700 updates averaged more than one gradient of the same worker")
    summary = dict(synchronous=False, verdict=verdict, global_step=700, target_steps=700,
                   contributions=[759, 756, 585])
    assert chaos.classify(_plan(max_restarts=1), _seen(3, summary)) == ("defect", ["repeat"])
    # With backups, shared tokens may give a fast worker two of an update's gradients.
    backups = _verified(contributions=[80, 70, 60], verdict="synchronous with 1 backup worker: "
                        "...; 3 updates took two or more gradients from one worker")
    assert chaos.classify(_plan(replicas=2), _seen(0, backups)) == ("verified", [])


def test_hangs_leftovers_tracebacks_and_launcher_bounds_are_defects():
    assert "hang" in chaos.classify(_plan(), _seen(-9, hang=True))[1]
    assert chaos.classify(_plan(), _seen(leftovers=["123: python -m sync_mnist"])) == \
        ("defect", ["leftover"])
    traceback = ["[worker 1] Traceback (most recent call last):"]
    assert chaos.classify(_plan(), _seen(lines=traceback)) == ("defect", ["traceback"])
    overdue = _verified(tasks=[{"blocked": True, "error": "still running 60 s after worker 0 "
                                "ended; stopped by the launcher"}], synchronous=False)
    lines = ["[cluster] error: worker 1 still running 60 s after worker 0 ended; stopping"]
    assert chaos.classify(_plan(), _seen(200, overdue, lines)) == ("defect", ["overdue"])
    # The tasks a launcher stops once it has given up are no defect of their own.
    stopped = dict(overdue, tasks=[{"blocked": True, "error": "still running at the end; "
                                    "stopped by the launcher"}])
    assert chaos.classify(_plan(), _seen(200, stopped, lines)) == ("failed-named", [])


@pytest.mark.parametrize("fault", chaos.SURVIVABLE)
def test_a_failure_after_a_survivable_fault_or_a_missed_fault_is_a_defect(fault):
    failed = dict(synchronous=False, verdict=None, global_step=None, contributions=None)
    named = ["[worker 0] error: worker 0: ...; missing: worker 1 (no gradient for update 41)"]
    assert chaos.classify(_plan(fault=fault, pause=4.0), _seen(200, failed, named)) == \
        ("defect", ["survivable-failed"])
    assert chaos.classify(_plan(), _seen(200, failed, named, fault_landed=False)) == \
        ("defect", ["no-fault-failed"])
    assert chaos.classify(_plan(), _seen(201, failed, named)) == ("defect", ["unexpected-code"])


def test_plans_cover_every_configuration_victim_fault_and_phase():
    plans = chaos.plan_runs(random.Random(0), 1000, timeout=10.0, train_steps=100, log_every=10,
                            max_restarts=3)
    assert {(p.ps, p.replicas, p.max_restarts) for p in plans} == {
        (ps, r, k) for ps in (1, 2) for r in (2, 3) for k in (0, 3)}
    assert {(p.victim_kind, p.fault, p.phase) for p in plans} == {
        (v, f, ph) for v in ("ps", "chief", "worker") for f in chaos.FAULTS
        for ph in chaos.PHASES if f != "disk-full" or v == "chief"}
    for p in plans:
        assert int(p.victim.split()[1]) < (p.ps if p.victim_kind == "ps" else chaos.WORKERS)
        assert 10 <= p.at_step < 90 and p.at_step % 10 == 0
        low, high = {"kill": (0, 0), "stop-short": (2, 6), "stop-long": (12, 16),
                     "term": (0, 0), "partition-short": (2, 6), "partition-long": (12, 16),
                     "loss": (12, 16), "delay": (12, 16), "disk-full": (2, 6)}[p.fault]
        assert low <= p.pause <= high, p
        if p.fault == "disk-full":
            assert p.victim == "worker 0"  # the chief writes --logdir


def test_where_network_faults_cannot_be_made_only_signals_are_drawn():
    plans = chaos.plan_runs(random.Random(1), 100, timeout=10.0, train_steps=100, log_every=10,
                            max_restarts=1, faults=chaos.SIGNAL_FAULTS)
    assert {p.fault for p in plans} == set(chaos.SIGNAL_FAULTS)


def test_a_full_disk_at_the_export_is_the_documented_exit_1_not_a_defect():
    """README: a disk too full for the trained model fails the run, exit 1, however its
    counters verified it; no restart frees a disk. Anything else a full disk does is a defect."""
    plan = _plan(fault="disk-full", victim="worker 0", max_restarts=1, pause=4.0)
    export = ["[worker 0] error: failed: ExportError: could not write the trained model to "
              "/x/saved_model: No space left on device (ENOSPC)"]
    assert chaos.classify(plan, _seen(1, _verified(), export)) == ("failed-named", [])
    chief_verified = _verified(tasks=[dict(role="worker", index=0, synchronous=True)])
    assert chaos.classify(plan, _seen(1, chief_verified, export)) == ("failed-named", [])
    other = ["[worker 0] error: failed: ResourceExhaustedError: Graph execution error:"]
    assert chaos.classify(plan, _seen(1, _verified(), other)) == (
        "defect", ["contradiction", "restart-failed", "survivable-failed"])
    # The same line after a kill is no excuse.
    assert chaos.classify(_plan(max_restarts=1), _seen(1, _verified(), export))[1] == [
        "contradiction", "restart-failed", "unnamed"]
    # No room for the very first checkpoint: exit 2, naming the directory (found by make chaos:
    # the tmpfs filled before the chief's first save).
    first = ["[worker 0] error: --logdir /x has no room for a checkpoint: No space left on "
             "device (ENOSPC) while saving the checkpoint of global_step 0: free some space",
             "[cluster] error: worker 0 exited with code 2; stopping the cluster"]
    assert chaos.classify(plan, _seen(2, {}, first)) == ("failed-named", [])
    assert chaos.classify(plan, _seen(2, {}, other)) == ("defect", ["unexpected-code"])
    assert chaos.classify(_plan(max_restarts=1), _seen(2, {}, first)) == (
        "defect", ["unexpected-code"])


def test_the_victims_port_is_read_from_the_launchers_cluster_line():
    lines = ["12:00:00 [cluster] starting", "12:00:01 [cluster] cluster: ps localhost:2222,"
             "localhost:2223, workers localhost:2224,localhost:2225,localhost:2226; dataset "
             "synthetic; mode sync"]
    assert chaos.victim_port(lines, "ps 1") == 2223
    assert chaos.victim_port(lines, "worker 0") == 2224
    assert chaos.victim_port(lines, "worker 2") == 2226


@pytest.mark.parametrize("quick", [True, False])
def test_a_plan_becomes_the_launchers_command_line(quick, tmp_path):
    plan = _plan(ps=2, replicas=2, max_restarts=3) if not quick else \
        chaos.quick_plans(timeout=15.0, train_steps=100, log_every=10, max_restarts=3)[0]
    args = chaos.launcher_args(plan, tmp_path / "marker", tmp_path / "run.json",
                               tmp_path / "logdir")
    assert args[args.index("--logdir") + 1] == str(tmp_path / "logdir")
    assert args[args.index("--save-steps") + 1] == "10"  # every progress line
    assert args[args.index("--ps") + 1] == str(plan.ps)
    assert args[args.index("--data-dir") + 1] == str(tmp_path / "marker")
    assert ("--replicas-to-aggregate" in args) == (plan.replicas < chaos.WORKERS)
    assert args[args.index("--max-restarts") + 1] == "3"
    assert args[args.index("--timeout") + 1] == "15"
    assert "--isolate" not in args


def test_a_network_fault_runs_the_cluster_in_a_namespace_of_its_own(tmp_path):
    args = chaos.launcher_args(_plan(fault="partition-long"), tmp_path / "m", tmp_path / "s",
                               tmp_path / "l")
    assert args[args.index("--isolate") + 1] == "on"


# Which fault kinds are drawn: a kind this machine cannot make is an error, unless skipped.

NOT_SIGNALS = ",".join(chaos.NETWORK_FAULTS + chaos.DISK_FAULTS)


def _ran(plan: chaos.Plan, code: int = 0) -> dict:
    """What run_one would have seen of a run that ended `code` (0: verified)."""
    summary = _verified() if code == 0 else dict(synchronous=False, verdict=None,
                                                  global_step=None, contributions=None)
    return _seen(code, summary, phase_seen="training", fault_at_s=1.0, wall_s=1.0, pids={},
                 victim_pid=None, fault_landed=plan.fault != chaos.NO_FAULT)


@pytest.fixture
def not_root(monkeypatch):
    """As a user who is not root: no network or disk fault can be made. No run is started
    (run_one must be replaced to run any), and the soak's SIGTERM handler is not installed."""
    monkeypatch.setattr(chaos.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(chaos.signal, "signal", lambda *args: None)

    def no_run(*args, **kwargs):
        raise AssertionError("a run was started")

    monkeypatch.setattr(chaos, "run_one", no_run)


@pytest.mark.parametrize("form", [[], ["--short"]])
def test_a_kind_that_cannot_be_drawn_is_an_error_exit_2_naming_it_and_why(
        form, not_root, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        chaos.main([*form, "--runs", "1", "--json", str(tmp_path / "c.json")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert ("cannot draw these fault kinds here: partition-short, partition-long, loss, "
            "delay: they need root (nftables, cgroups); disk-full: it needs root") in err
    assert f"--skip {NOT_SIGNALS}" in err
    # Skipping some of them is not enough.
    with pytest.raises(SystemExit) as exit_:
        chaos.main([*form, "--skip", "loss,delay", "--json", str(tmp_path / "c.json")])
    assert exit_.value.code == 2
    assert "--skip partition-short,partition-long,disk-full" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("skip, named", [
    ("partition", "'partition' is not a fault kind"),
    ("kill,stop,disk", "'stop', 'disk' are not fault kinds"),
])
def test_a_name_that_is_not_a_kind_is_an_error_naming_it_and_the_kinds(skip, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        chaos.main(["--skip", skip])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert named in err and f"(the kinds: {', '.join(chaos.FAULTS)})" in err


def test_skipping_every_kind_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        chaos.main(["--skip", ",".join(chaos.FAULTS)])
    assert exit_.value.code == 2
    assert "--skip leaves no fault kind to draw" in capsys.readouterr().err


def test_skipped_kinds_are_not_drawn_and_the_summary_lists_them(not_root, monkeypatch,
                                                                  tmp_path, capsys):
    monkeypatch.setattr(chaos, "run_one", lambda plan, *args, **kwargs: _ran(plan))
    out = tmp_path / "c.json"
    assert chaos.main(["--runs", "40", "--seed", "1", "--skip", f"delay,{NOT_SIGNALS}",
                       "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {run["fault"] for run in record["runs"]} == set(chaos.SIGNAL_FAULTS)
    assert record["skipped"] == list(chaos.NETWORK_FAULTS + chaos.DISK_FAULTS)
    printed = capsys.readouterr().out
    assert f"skipped (--skip): {', '.join(chaos.NETWORK_FAULTS + chaos.DISK_FAULTS)}" in printed
    assert "40 runs in" in printed


def test_short_draws_each_kind_once_then_replays_the_end_of_run_faults():
    options = dict(timeout=20.0, train_steps=100, log_every=10, max_restarts=1)
    plans = chaos.short_plans(random.Random(chaos.SHORT_SEED), **options)
    assert plans == chaos.short_plans(random.Random(chaos.SHORT_SEED), **options)  # fixed
    drawn, replays = plans[:len(chaos.FAULTS)], plans[len(chaos.FAULTS):]
    assert [p.fault for p in drawn] == list(chaos.FAULTS)
    assert [p.run for p in plans] == list(range(1, len(plans) + 1))
    assert all(p.victim == "worker 0" for p in drawn if p.fault == "disk-full")
    assert [(p.victim, p.fault, p.phase, p.max_restarts) for p in replays] == [
        ("ps 0", "stop-long", "end", 1), ("worker 1", "stop-long", "end", 1),
        ("ps 0", "kill", "end", 1)]
    assert all(p.note.startswith("replay: ") for p in replays)
    # Only the kinds not skipped, a skipped kind's replay too; numbered on.
    signals = chaos.short_plans(random.Random(0), **options, faults=chaos.SIGNAL_FAULTS)
    assert [p.fault for p in signals[:4]] == list(chaos.SIGNAL_FAULTS)
    assert len(signals) == 4 + len(replays)
    kills = chaos.short_plans(random.Random(0), **options, faults=("kill",))
    assert [(p.run, p.fault, p.note[:7]) for p in kills] == [(1, "kill", ""),
                                                             (2, "kill", "replay:")]


def test_each_replay_is_the_run_its_seed_drew():
    """`--seed S` draws a replayed run again as run N (the replay's note names both)."""
    options = dict(timeout=20.0, train_steps=100, log_every=10)
    for replay in chaos.replay_plans(1, **options):
        words = replay.note.split()
        run, seed = int(words[2]), int(words[5].rstrip(","))
        drawn = chaos.plan_runs(random.Random(seed), run, **options, max_restarts=1)[-1]
        assert dataclasses.replace(drawn, run=replay.run, note=replay.note) == replay
    # A stop's pause scales with --timeout, as a drawn one does.
    assert chaos.replay_plans(1, **{**options, "timeout": 10.0})[0].pause == 13.7


def test_a_replay_runs_beside_fault_free_runs_until_it_ends(monkeypatch, tmp_path):
    """run_beside: fault-free runs one after another beside the run, the first started with
    it, the last ended after it (the replayed run here waits until one has started, and the
    load's lasts until the replayed run ends)."""
    load_started, replay_ended = threading.Event(), threading.Event()
    faults = []

    def run_one(plan, workdir, fault=True, net_class=None):
        faults.append((plan.run, fault))
        if plan.fault == chaos.NO_FAULT:
            load_started.set()
            assert replay_ended.wait(10), "the replayed run did not end"
        else:
            assert load_started.wait(10), "no load run beside the replayed run"
            replay_ended.set()
        return _ran(plan)

    replay = chaos.replay_plans(5, timeout=20.0, train_steps=100, log_every=10)[0]
    runs = iter(range(100, 200))
    options = dict(timeout=replay.timeout, train_steps=100, log_every=10)
    monkeypatch.setattr(chaos, "run_one", run_one)
    seen, loads = chaos.run_beside(replay, tmp_path, lambda: chaos.load_plan(next(runs), **options))
    assert seen["code"] == 0 and loads and loads[0][0].run == 100
    assert all(p.fault == chaos.NO_FAULT and p.note == "load" for p, _ in loads)
    assert (5, True) in faults and all(not fault for run, fault in faults if run >= 100)


def test_short_classifies_every_run_the_loads_too_and_a_failed_load_is_a_defect(
        not_root, monkeypatch, tmp_path, capsys):
    def run_one(plan, workdir, fault=True, net_class=None):
        return _ran(plan, code=200 if plan.run == 8 else 0)

    def run_beside(plan, workdir, next_load, net_class=None):  # one load run (tested above)
        load = next_load()
        return run_one(plan, workdir), [(load, run_one(load, workdir, fault=False))]

    monkeypatch.setattr(chaos, "run_one", run_one)
    monkeypatch.setattr(chaos, "run_beside", run_beside)
    out = tmp_path / "short.json"
    assert chaos.main(["--short", "--skip", NOT_SIGNALS, "--json", str(out)]) == 1
    record = json.loads(out.read_text())
    assert record["seed"] == chaos.SHORT_SEED
    runs = {run["run"]: run for run in record["runs"]}
    assert [runs[n]["fault"] for n in range(1, 5)] == list(chaos.SIGNAL_FAULTS)
    assert [runs[n]["note"][:7] for n in range(5, 8)] == ["replay:"] * 3
    loads = [run for run in record["runs"] if run["note"] == "load"]
    assert [run["run"] for run in loads] == [8, 9, 10]
    assert runs[8]["defects"] == ["no-fault-failed"]
    assert [run["category"] for run in record["runs"] if run["run"] != 8] == \
        ["verified"] * (len(record["runs"]) - 1)
    printed = capsys.readouterr().out
    assert "no fault  exit 0" in printed and "(load)" in printed
    assert "no fault" in chaos.tables(record["runs"])
    assert (tmp_path / "short-run-8.log").exists()


def test_a_known_defect_is_named_only_with_its_signature_and_alone():
    # None is listed now (issue 56); the zombie update's old entry shows what one is.
    assert chaos.KNOWN_DEFECTS == {}
    known = {"zombie-update": chaos.KnownDefect(
        "worker 0", ("partition-short", "partition-long"),
        frozenset({"restart-failed", "survivable-failed"}),
        re.compile(r"rejoining at global_step \d+, waited \S+ s for the update my "
                   r"predecessor's last gradient joined"))}
    lines = ["[cluster] warning: worker 1 exited with code 200 naming worker 0 as missing; ...",
             "[worker 1] error: worker 1: rejoining at global_step 82, waited 20 s for the update "
             "my predecessor's last gradient joined"]
    failed = dict(synchronous=False, verdict=None, global_step=None, contributions=None)
    plan = _plan(victim="worker 0", fault="partition-long", max_restarts=1, pause=30.2, ps=2)
    seen = _seen(200, failed, lines)
    category, defects = chaos.classify(plan, seen)
    assert (category, defects) == ("defect", ["restart-failed"])
    assert chaos.known_defect(plan, seen, defects, known) == "zombie-update"
    assert chaos.known_defect(plan, seen, defects) is None  # not listed: a defect like any
    # Not with another victim or fault, without the line, or beside another defect.
    assert chaos.known_defect(_plan(victim="ps 0", fault="partition-long", max_restarts=1),
                              seen, defects, known) is None
    assert chaos.known_defect(dataclasses.replace(plan, fault="kill"), seen, defects,
                              known) is None
    assert chaos.known_defect(plan, _seen(200, failed, lines[:1]), defects, known) is None
    assert chaos.known_defect(plan, seen, [*defects, "traceback"], known) is None
    # It is printed apart, and does not fail the soak on its own; any other defect does.
    records = [{"victim_kind": "chief", "fault": "partition-long", "phase_seen": "training",
                "category": "defect", "defects": defects, "known": "zombie-update",
                "run": 1, "fault_landed": True}]
    assert "of which known (KNOWN_DEFECTS, filed, not fixed): zombie-update 1" in \
        chaos.tables(records)
