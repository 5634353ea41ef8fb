"""The experiment tooling of issue 12 without a cluster: arguments, refusals, arithmetic.

straggler.py and scaling.py need root and start clusters; here only what decides what they
run and what they report: rates, the setups' options, refusals with exit 2, the table, and the
update-time model's arithmetic (by hand). test_straggler.py runs the real thing.
"""

from __future__ import annotations

import json

import pytest

from lab import scaling, straggler, testbed

MODEL_BYTES = 4 * (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10)


@pytest.mark.parametrize("text, bits", [("20mbit", 20e6), ("500kbit", 5e5), ("1gbit", 1e9),
                                        ("1.5Mbit", 1.5e6)])
def test_rates_read_as_tc_reads_them(text, bits):
    assert testbed.rate_bits(text) == bits


@pytest.mark.parametrize("text", ["20", "20mb", "fast", "0mbit", "-1mbit"])
def test_a_bad_rate_is_refused_naming_it(text):
    with pytest.raises(ValueError, match=f"link rate {text!r}"):
        testbed.rate_bits(text)


def test_without_root_the_testbed_says_so(monkeypatch):
    monkeypatch.setattr(testbed.os, "geteuid", lambda: 1000)
    with pytest.raises(testbed.Unavailable, match=r"needs root \(euid is 1000\)"):
        testbed.check(cpu=False)


def test_without_root_the_straggler_command_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(testbed.os, "geteuid", lambda: 1000)
    code = straggler.main(["--slow-link", "20mbit", "--dataset", "synthetic"])
    assert code == 2
    assert "needs root (euid is 1000)" in capsys.readouterr().err


def test_without_a_cpu_controller_a_cpu_cap_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(testbed.os, "geteuid", lambda: 0)
    monkeypatch.setattr(testbed, "CPU_CGROUP", tmp_path / "nothing")
    with pytest.raises(testbed.Unavailable, match="no cgroup v1 cpu controller"):
        testbed.check(cpu=True)


@pytest.mark.parametrize("argv, message", [
    (["--workers", "4", "--straggler", "4", "--slow-link", "1mbit"],
     "--straggler 4 is not a worker (0-3)"),
    (["--slow-link", "fast"], "link rate 'fast'"),
    (["--slow-cpu", "0"], "CPU share 0.0 is outside"),
    (["--setups", "sync,lockstep", "--slow-link", "1mbit"], "unknown lockstep"),
    (["--no-baseline"], "nothing to run"),
    (["--workers", "1", "--setups", "backup", "--slow-link", "1mbit"],
     "backup setup needs at least 2 workers"),
])
def test_bad_arguments_exit_2_naming_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        straggler.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_each_setup_gets_its_own_options_after_the_users():
    exp, trains = straggler.parse_args(["--workers", "4", "--slow-cpu", "0.25", "--epochs", "2",
                                        "--mode", "async", "--replicas-to-aggregate", "2"])
    assert exp.straggler == 3 and exp.task_args == ("--epochs", "2", "--mode", "async",
                                                    "--replicas-to-aggregate", "2")
    assert (trains["sync"].mode, trains["sync"].aggregate(4)) == ("sync", 4)
    assert (trains["backup"].mode, trains["backup"].aggregate(4)) == ("sync", 3)
    assert trains["async"].mode == "async"
    assert straggler.setup_args("backup", 4)[-2:] == ["--replicas-to-aggregate", "3"]


def test_only_the_straggler_is_slowed_and_every_link_takes_cap_links():
    exp, _ = straggler.parse_args(["--workers", "3", "--straggler", "1", "--slow-cpu", "0.5",
                                   "--cap-links", "1gbit"])
    slowed = straggler.slowdowns(exp, straggled=True)
    assert slowed["worker", 1] == testbed.Slowdown(link_rate="1gbit", cpu_share=0.5)
    assert {t: s for t, s in slowed.items() if t != ("worker", 1)} == {
        t: testbed.Slowdown(link_rate="1gbit") for t in
        [("ps", 0), ("worker", 0), ("worker", 2)]}
    assert straggler.slowdowns(exp, straggled=False)["worker", 1].cpu_share is None


def test_the_table_takes_medians_of_the_runs_that_exited_0():
    def record(exit_code, step, train_s, dropped, eps):
        tasks = [{"role": "worker", "index": i, "examples_per_sec": e} for i, e in enumerate(eps)]
        return {"setup": "backup", "straggled": True, "straggler": 2, "exit_code": exit_code,
                "cluster": {"global_step": step, "train_s": train_s, "test_accuracy": 0.9,
                            "dropped": dropped, "tasks": tasks}}

    records = [record(0, 100, 10.0, [0, 0, 90], [1000, 1000, 100]),
               record(0, 100, 20.0, [0, 2, 80], [1000, 1000, 300]),
               record(1, 1, 1000.0, [9, 9, 9], [1, 1, 1])]  # failed: left out of the figures
    assert straggler.figures(records[0])["updates_per_s"] == 10.0
    row = straggler.format_table(records).splitlines()[1].split()
    # setup, straggler, runs, ok, updates/s (median of 10 and 5), (min-max), train s
    assert row[:7] == ["backup", "yes", "3", "2", "7.5", "(5.0-10.0)", "15.0"]
    assert "[0, 1, 85]" in " ".join(row) and row[-1] == "0.20"  # (0.1 + 0.3) / 2


COSTS = scaling.Costs(t_single=0.005, t_update=0.001, t_accum=0.0002, t_rpc=0.0001,
                      c_byte=1e-9, cpu_floor=0.002, efficiency=1.0, t_sync=0.0, cores=2,
                      bytes_total=1_000_000, tensors_total=6)


def test_the_model_on_one_machine_uncapped_is_cpu_bound_by_hand():
    p = scaling.predict(COSTS, 4, [1_000_000], cores=2)
    # fixed: t_fb 0.004 + 2 RPCs 0.0002 + 2 MB 0.002 + ps (0.001 + 4 x 0.0002)
    assert p.latency == p.link == pytest.approx(0.008)
    # The 3 other workers' CPU (4 steps of t_fb + floor and 3 more accumulations, beyond one
    # worker's) shares the 2 cores with the step's own fixed part.
    others = 4 * 0.006 + 0.0018 - (0.006 + 0.0012)
    assert p.cpu == pytest.approx(0.008 + others / 2)
    assert (p.total, p.bottleneck) == (pytest.approx(0.008 + others / 2), "cpu")
    # One worker has nobody to compete with: its step is its latency.
    alone = scaling.predict(COSTS, 1, [1_000_000], cores=2)
    assert alone.total == pytest.approx(alone.latency)


def test_cpu_the_other_workers_use_stretches_the_steps_own_cpu_part_beside_the_wire():
    # T = W + fixed / (1 - o / T): the wire's part W unchanged, the fixed part slowed by the
    # share o / T of the cores the others keep busy.
    costs = scaling.dataclasses.replace(COSTS, cpu_step=0.02)
    p = scaling.predict(costs, 4, [250_000] * 4, rate_bits=100e6, cores=2)
    fixed, o = p.latency - 0.16, 3 * 0.02 / 2 + 3 * 0.0002 / 2
    assert p.total - 0.16 == pytest.approx(fixed / (1 - o / p.total))
    assert p.latency < p.total < p.latency + o
    assert scaling.predict(costs, 4, [250_000] * 4, rate_bits=100e6).total == p.latency


def test_the_model_at_a_cap_is_bound_by_the_ps_link_until_enough_ps_share_it():
    one = scaling.predict(COSTS, 4, [1_000_000], rate_bits=100e6)
    fixed = 0.008  # as above: the link idles while it runs
    assert one.link == pytest.approx(fixed + 8 * 2 * 4 * 1e6 / 100e6)  # 4 pulls, 4 pushes
    assert one.latency == pytest.approx(fixed + 8 * 2e6 / 100e6)  # the worker's own link
    assert one.bottleneck == "link"
    two = scaling.predict(COSTS, 4, [500_000, 500_000], rate_bits=100e6)
    assert (two.link, two.bottleneck) == (pytest.approx(0.0071 + 0.32), "link")
    four = scaling.predict(COSTS, 4, [250_000] * 4, rate_bits=100e6)
    assert four.latency == pytest.approx(0.004 + 0.0002 + 0.002 + 0.0018 / 4 + 0.16)
    assert four.link == pytest.approx(four.latency)  # a ps link carries N B / P = B
    assert four.bottleneck == "latency"
    # A ps link carries N x B / P, a worker's B: past P = N more ps only shave the ps's work.
    assert scaling.ps_needed(COSTS, 4, 100e6) == 4
    # Half the goodput of the rate doubles every wire term.
    slow = scaling.predict(scaling.dataclasses.replace(COSTS, efficiency=0.5), 4, [1_000_000],
                           rate_bits=100e6)
    assert slow.link - fixed == pytest.approx(2 * (one.link - fixed))
    # tbf's bucket lets each phase's first `burst` bytes through at once.
    bucket = scaling.predict(COSTS, 4, [1_000_000], rate_bits=100e6, burst=100_000)
    assert bucket.link == pytest.approx(fixed + 2 * 8 * (4e6 - 1e5) / 100e6)
    assert bucket.latency == pytest.approx(fixed + 2 * 8 * (1e6 - 1e5) / 100e6)


def test_each_ps_beyond_the_first_adds_its_calibrated_overhead():
    costs = scaling.dataclasses.replace(COSTS, t_ps_extra=0.005, cpu_ps_extra=0.003,
                                        cpu_ps_step=0.001, cpu_step=0.01)
    one = scaling.predict(costs, 4, [1_000_000], cores=2)
    three = scaling.predict(costs, 4, [1_000_000 / 3] * 3, cores=2)
    assert three.latency - one.latency == pytest.approx(2 * 0.005 - 0.0018 * 2 / 3)
    # What a ps costs once per update is in the one worker's step the others compete with;
    # its share of each worker step is the others' too: 3 workers x 2 extra ps.
    assert (three.cpu - three.latency) - (one.cpu - one.latency) == pytest.approx(
        3 * 2 * 0.001 / 2)


def test_a_full_duplex_ps_link_overlaps_pushes_with_pulls_as_far_as_calibrated():
    # 4 workers at 100 Mbit/s, one ps: a pull or a push of 1 MB is 0.08 s.
    def link(overlap, **kw):
        return scaling.predict(scaling.dataclasses.replace(COSTS, overlap=overlap), 4,
                               [1_000_000], rate_bits=100e6, **kw).link

    fixed = 0.008  # the rest of a step, while the link idles
    assert link(0.0) == pytest.approx(fixed + 0.64)  # 4 pulls out, then 4 pushes in: in turn
    assert link(1.0) == pytest.approx(fixed + 0.32 + 0.08)  # side by side, but the last push
    assert link(0.25) == pytest.approx(fixed + 0.64 - 0.25 * (0.32 - 0.08))
    # bfloat16: half the bytes each way, pulls and pushes; the worker's own link too.
    assert link(0.0, wire_share=0.5) == pytest.approx(fixed - 0.001 + 0.16 + 0.16)
    assert link(1.0, wire_share=0.5) == pytest.approx(fixed - 0.001 + 0.16 + 0.04)
    half = scaling.predict(COSTS, 4, [1_000_000], rate_bits=100e6, wire_share=0.5)
    assert half.latency == pytest.approx(0.004 + 0.0002 + 0.001 + 0.04 + 0.04 + 0.0018)
    # The sweep's calibration finds the overlap that a measured time implies, where the link
    # is the bottleneck; elsewhere it keeps what it had.
    measured = link(0.3)
    assert scaling.overlap_from(COSTS, 4, [1_000_000], measured, rate_bits=100e6) == \
        pytest.approx(0.3)
    assert scaling.overlap_from(COSTS, 4, [1_000_000], 10.0, rate_bits=100e6) == 0.0
    assert scaling.overlap_from(COSTS, 4, [1_000_000], 0.0, rate_bits=100e6) == 1.0
    latency_bound = scaling.dataclasses.replace(COSTS, overlap=0.7)
    assert scaling.overlap_from(latency_bound, 1, [1_000_000], 0.1, rate_bits=100e6) == 0.7


def test_the_sweep_calibrates_on_the_points_that_can_tell_each_term():
    points = [(n, p, cap) for cap in (None, "200mbit", "100mbit") for p in (1, 2, 4)
              for n in (1, 2, 4, 6)]
    assert scaling.calibration_points(points) == {
        "t_sync, cpu_step": [(1, 1, None)],
        "t_ps_extra, cpu_ps_extra": [(1, 1, None), (1, 2, None), (1, 4, None)],
        "cpu_ps_step": [(6, 1, None), (6, 2, None), (6, 4, None)],
        "overlap": [(6, 1, "200mbit")]}
    assert list(scaling.calibration_points([(1, 1, None), (1, 1, "200mbit")])) == [
        "t_sync, cpu_step"]
    # Without 1 worker on 1 ps uncapped (a capped sweep, --costs from a calibrating one): only
    # the overlap.
    assert scaling.calibration_points([(1, 1, "200mbit"), (4, 1, "200mbit")]) == {
        "overlap": [(4, 1, "200mbit")]}


def _row(n, p, wall, cpu, cap=None):
    return {"workers": n, "ps": p, "cap": cap, "bytes_per_ps": [1_000_000 // p] * p,
            "measured_s": wall, "measured_cpu_s": cpu}


def test_each_extra_ps_is_fitted_over_every_1_worker_point_and_split_by_the_most_workers():
    bare = [scaling.predict(COSTS, 1, [1_000_000 // p] * p).latency for p in (1, 2, 4)]
    # 1 worker: 2 ms of wall time beyond the model for 1 ps; then 4 and 5 ms more with 1 and
    # 3 ps more: the line through the origin, (1 x 4 + 3 x 5) / (1 + 9) = 1.9 ms a ps.
    # CPU 0.010 on 1 ps, then 0.009 and 0.027 more: (9 + 81) / 10 = 9 ms a ps.
    # 6 workers: CPU 0.080 on 1 ps, 0.019 and 0.057 more: 19 ms a ps = 9 - b + 6 b, b = 2 ms.
    rows = [_row(1, 1, bare[0] + 0.002, 0.010), _row(1, 2, bare[1] + 0.006, 0.019),
            _row(1, 4, bare[2] + 0.007, 0.037), _row(6, 1, 0.05, 0.080),
            _row(6, 2, 0.05, 0.099), _row(6, 4, 0.05, 0.137)]
    costs = scaling.calibrate(COSTS, rows)
    assert costs.t_sync == pytest.approx(0.002)
    assert costs.cpu_step == pytest.approx(0.010 - 0.001 - 0.0002)
    assert costs.t_ps_extra == pytest.approx(0.0019)
    assert (costs.cpu_ps_extra, costs.cpu_ps_step) == (pytest.approx(0.007),
                                                       pytest.approx(0.002))
    assert [r["calibrates"] for r in rows] == [
        ["t_sync, cpu_step", "t_ps_extra, cpu_ps_extra"], ["t_ps_extra, cpu_ps_extra"],
        ["t_ps_extra, cpu_ps_extra"], ["cpu_ps_step"], ["cpu_ps_step"], ["cpu_ps_step"]]
    six = scaling.predict(costs, 6, [500_000] * 2, cores=2)
    # Beyond one worker's step: 5 steps of cpu_step + 1 ps's cpu_ps_step, 5 accumulations.
    assert six.cpu - six.latency == pytest.approx(5 * (costs.cpu_step + 0.002 + 0.0002) / 2)
    # No more than at 1 worker: all of it per update.
    flat = [dict(r) for r in rows]
    flat[4]["measured_cpu_s"], flat[5]["measured_cpu_s"] = 0.085, 0.095
    flat = scaling.calibrate(COSTS, flat)
    assert (flat.cpu_ps_extra, flat.cpu_ps_step) == (pytest.approx(0.009), 0.0)
    # A calibrating run that failed leaves its terms, and those built on them, as they were.
    failed = [dict(r) for r in rows]
    del failed[1]["measured_s"]
    kept = scaling.calibrate(scaling.dataclasses.replace(COSTS, t_ps_extra=0.5), failed)
    assert (kept.t_sync, kept.t_ps_extra) == (pytest.approx(0.002), 0.5)


def test_the_sweep_runs_every_point_once_a_round_and_models_each_points_median(monkeypatch):
    calibrating, capped = [(1, 1, None), (1, 2, None)], (1, 1, "200mbit")
    walls = {(1, 1, None): [0.012, 0.010, 0.017], (1, 2, None): [0.020, 0.016, 0.017],
             capped: [0.1, None]}  # None: its second run fails
    calls = []

    def measure_point(n, p, cap, steps, wire_dtype, model="mlp"):
        calls.append((n, p, cap))
        wall = walls[(n, p, cap)][calls.count((n, p, cap)) - 1]
        if wall is None:
            raise RuntimeError("sync x2: exited 1")
        return wall, 2 * wall, {}

    monkeypatch.setattr(scaling, "measure_point", measure_point)
    monkeypatch.setattr(scaling, "partition", lambda p, n=1: ([MODEL_BYTES // p] * p, [6] * p))
    rows, costs = scaling.sweep(COSTS, [capped, *calibrating], steps=20, repeats=3)
    # Round by round; the failed point is not run again.
    assert calls == [capped, *calibrating] * 2 + calibrating
    by_point = {(r["workers"], r["ps"], r["cap"]): r for r in rows}
    one = by_point[(1, 1, None)]
    assert (one["measured_s"], one["measured_cpu_s"], one["runs_s"]) == (0.012, 0.024,
                                                                         [0.012, 0.010, 0.017])
    assert (by_point[capped]["runs_s"], by_point[capped]["error"]) == ([0.1],
                                                                       "sync x2: exited 1")
    # Calibrated from the medians: t_sync is what 1 worker on 1 ps takes beyond the model.
    bare = scaling.predict(COSTS, 1, [MODEL_BYTES]).latency - COSTS.t_sync
    assert costs.t_sync == pytest.approx(0.012 - bare)
    table = scaling.format_sweep(rows).splitlines()
    assert table[0].split()[4:6] == ["ms", "spread"]
    assert [line.split()[3:5] for line in table[1:4]] == [["12.0", "10-17"], ["17.0", "16-20"],
                                                          ["100.0", "-"]]


def test_the_model_refuses_nonsense():
    with pytest.raises(ValueError, match="N=0"):
        scaling.predict(COSTS, 0, [1])


def test_the_bytes_each_ps_holds_come_from_the_real_graph():
    one_bytes, one_tensors = scaling.partition(1)
    assert (one_bytes, one_tensors) == ([MODEL_BYTES], [6])
    # --ps 2: one slice of each of the 6 variables on each ps, half the bytes each.
    assert scaling.partition(2) == ([MODEL_BYTES // 2] * 2, [6, 6])


def test_the_accuracy_curve_is_read_against_wall_time_since_the_chief_was_ready(tmp_path):
    import tensorflow as tf

    tf1 = tf.compat.v1
    writer = tf1.summary.FileWriter(str(tmp_path))
    for wall, step, accuracy in ((1000.5, 100, 0.91), (1002.0, 200, 0.95)):
        summary = tf1.Summary(value=[tf1.Summary.Value(tag=straggler.ACCURACY_TAG,
                                                       simple_value=accuracy),
                                     tf1.Summary.Value(tag="loss", simple_value=0.3)])
        writer.add_event(tf1.Event(wall_time=wall, step=step, summary=summary))
    writer.close()
    curve = straggler.accuracy_curve(tmp_path, since=1000.0)
    assert curve == [(0.5, pytest.approx(0.91)), (2.0, pytest.approx(0.95))]
    record = {"setup": "sync", "straggled": True, "logdir": str(tmp_path),
              "cluster": {"tasks": [{"role": "worker", "index": 0, "ready_at": 1000.0}]}}
    assert straggler.plot([record], tmp_path / "a.png") is None
    assert (tmp_path / "a.png").stat().st_size > 0
    assert "no 'nothing' summaries" in straggler.plot([record], tmp_path / "b.png", "nothing")


def test_the_sweep_plot_is_drawn_from_scaling_json_and_its_absence_is_named(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rows = [{"workers": n, "ps": 1, "cap": cap, "predicted_s": 0.01 * n, "measured_s": 0.011 * n}
            for n in (1, 2) for cap in (None, "200mbit")]
    for command in (["plot"], ["recheck", "--costs", str(tmp_path / "costs.json")]):
        assert scaling.main([*command, "--out", str(tmp_path)]) == 2
        assert f"error: no {tmp_path / 'scaling.json'}: run the sweep first" in \
            capsys.readouterr().err
    (tmp_path / "scaling.json").write_text(json.dumps({"rows": rows}))
    assert scaling.main(["plot", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_capped_link_charges_each_byte_moved_the_cpu_the_capped_floor_cost():
    # Measured here: one model's pull and push through 200 Mbit/s links cost 78.5 CPU ms (both
    # ends) against 5.0 uncapped; on one 2-core machine that, not the link, bounds 4 workers
    # with 3 or 4 ps.
    assert scaling.capped_cpu({"floor-capped": (0.089, 0.0785), "floor-packed": (0.004, 0.005)},
                              1_000_000) == pytest.approx((0.0785 - 0.005) / 2_000_000)
    costs = scaling.dataclasses.replace(COSTS, cpu_capped=1e-8)
    uncapped = scaling.predict(costs, 4, [500_000] * 2, cores=2).cpu
    capped = scaling.predict(costs, 4, [500_000] * 2, rate_bits=100e6, cores=2).cpu
    # The 3 workers beside one worker's step each move a pull and a push more.
    assert capped - uncapped == pytest.approx(3 * 2 * 1_000_000 * 1e-8 / 2)
    half = scaling.predict(costs, 4, [500_000] * 2, rate_bits=100e6, cores=2, wire_share=0.5)
    # (and the step's own per-byte cost halves: 2 x 500,000 bytes fewer at 1e-9)
    assert half.cpu - uncapped == pytest.approx(3 * 2 * 500_000 * 1e-8 / 2 - 0.001)
    # Between hosts of their own (cores=None) there is no shared CPU to charge.
    assert scaling.predict(costs, 4, [500_000] * 2, rate_bits=100e6).cpu == 0.0


@pytest.mark.parametrize("command", [["sweep"], ["predict"], ["recheck"]])
def test_a_costs_file_that_is_missing_or_wrong_is_named_not_a_traceback(command, tmp_path,
                                                                       capsys):
    (tmp_path / "scaling.json").write_text(json.dumps({"rows": []}))  # recheck reads it first
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    key = "floor_s" if command == ["recheck"] else "costs"
    for name, message in (("absent.json", "No such file or directory"),
                          ("text.json", "is not JSON"), ("other.json", f"has no {key!r}")):
        with pytest.raises(SystemExit) as exit_:
            scaling.main([*command, "--costs", str(tmp_path / name), "--out", str(tmp_path)])
        assert exit_.value.code == 2
        assert f"error: --costs {tmp_path / name}" in (err := capsys.readouterr().err)
        assert message in err


def test_the_sweep_runs_the_ctr_model_with_its_bytes_per_step_as_b(monkeypatch):
    # sparse_bytes' measure, made up: per ps, what a worker step pushes to it and pulls from it.
    moved = {1: {"pushed": 160_000, "pulled": 140_000, "per_ps_pushed": [160_000],
                 "per_ps_pulled": [140_000]},
             2: {"pushed": 170_000, "pulled": 141_000, "per_ps_pushed": [90_000, 80_000],
                 "per_ps_pulled": [71_000, 70_000]}}
    trained = []

    def measure_point(n, p, cap, steps, wire_dtype, model="mlp"):
        trained.append(model)
        return 0.05, 0.1, {"ps 0": 0.5, "worker 0": 1.2}

    def partition(*_):
        raise AssertionError("the MLP's trainable bytes are not the ctr model's B")

    monkeypatch.setattr(scaling, "measure_point", measure_point)
    monkeypatch.setattr(scaling, "ctr_bytes", moved.__getitem__)
    monkeypatch.setattr(scaling, "partition", partition)
    rows, _ = scaling.sweep(COSTS, [(4, 1, "200mbit"), (4, 2, "200mbit")], steps=20,
                            model="ctr")
    assert trained == ["ctr", "ctr"]
    by_ps = {r["ps"]: r for r in rows}
    # B_p: the mean of ps p's two directions, so that B's two wire phases carry both.
    assert by_ps[1]["bytes_per_ps"] == [150_000]
    assert by_ps[2]["bytes_per_ps"] == [80_500, 75_000]
    assert by_ps[2]["bytes_each_way"]["per_ps_pulled"] == [71_000, 70_000]
    assert (by_ps[2]["model"], by_ps[2]["task_cores"]) == ("ctr",
                                                          [{"ps 0": 0.5, "worker 0": 1.2}])


def test_model_ctr_reaches_every_task_of_the_sweeps_runs():
    assert scaling._parser().parse_args(["sweep", "--model", "ctr"]).model == "ctr"
    assert scaling._parser().parse_args(["sweep"]).model == "mlp"
    with pytest.raises(SystemExit) as exit_:
        scaling._parser().parse_args(["sweep", "--model", "dlrm"])
    assert exit_.value.code == 2
    hosts = (["10.77.0.1:2222", "10.77.0.2:2222"], ["10.77.0.3:2222"])
    for model, wanted, unwanted in (("ctr", ["--model", "ctr"], "--dataset"),
                                    ("mlp", ["--dataset", "synthetic"], "--model")):
        argvs = scaling.bench._task_argvs("sync", 1, *hosts,
                                          scaling._bench_config(40, model))
        assert [name for name, _ in argvs] == ["ps 0", "ps 1", "worker 0"]
        for _, argv in argvs:
            at = argv.index(wanted[0])
            assert argv[at:at + 2] == wanted and unwanted not in argv


def test_each_tasks_cores_are_read_over_the_middle_of_the_time_every_task_ran():
    # ps 0 from t=0, worker 0 from t=1 (its start-up), ps 0 gone at t=12: every task runs
    # from 1 to 11, so the middle (0.4-0.8) is 5 to 9.
    samples = [(0.0, {"ps 0": 0.0})]
    samples += [(float(t), {"ps 0": 0.25 * t, "worker 0": 0.5 * t + (2.0 if t > 7 else 0.0)})
                for t in range(1, 12)]
    samples += [(12.0, {"worker 0": 9.0})]
    cores = scaling.steady_cores(samples)
    # worker 0: 0.5 a second, and a 2 s jump between 7 and 8: (2 + 4 x 0.5) / 4.
    assert cores == {"ps 0": pytest.approx(0.25), "worker 0": pytest.approx(1.0)}
    assert scaling.steady_cores([(0.0, {"ps 0": 0.0})]) == {}
    assert scaling.steady_cores([]) == {}
