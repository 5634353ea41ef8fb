"""The benchmark's pure parts (arguments, window and table arithmetic, JSON, plot) and one
short real run of its smallest configuration."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from sync_mnist.bench import bench
from sync_mnist.bench.bench import Sample

pytestmark = pytest.mark.usefixtures("without_pytorch")


def test_quick_runs_only_what_the_targets_compare():
    config = bench.parse_args(["--quick"])
    assert (config.repeats, config.steps, config.log_every) == (1, 200, 20)
    assert bench.plan(config) == [pair for pair in bench.QUICK_PLAN if pair[0] != "ddp"]
    assert len(bench.plan(config)) == 7


def test_explicit_values_override_quick():
    config = bench.parse_args(["--quick", "--workers", "2,3", "--repeats", "4", "--steps", "50",
                               "--setups", "sync,single"])
    assert (config.repeats, config.steps, config.log_every) == (4, 50, 5)
    assert bench.plan(config) == [("single", 1), ("sync", 2), ("sync", 3)]


def test_default_plan_runs_single_once_and_the_rest_per_worker_count():
    config = bench.parse_args([])
    pairs = bench.plan(config)
    assert pairs.count(("single", 1)) == 1
    # Every setup but single at each of 3 worker counts; the file setups only with --files.
    assert len(pairs) == 1 + 3 * (len(bench.SETUPS) - 1 - len(bench.PAIRED) - 1)  # no ddp
    assert not any(setup in bench.FILE_SETUPS for setup, _ in pairs)
    assert config.repeats == 2


@pytest.mark.parametrize("argv, message", [
    (["--setups", "sync,ring"], "unknown ring"),
    (["--workers", "1,x"], "'1,x' is not a comma-separated list"),
    (["--workers", "0"], "each count must be 1-8"),
    (["--steps", "10"], "--steps must be at least 20"),
    (["--repeats", "0"], "--repeats must be at least 1"),
])
def test_bad_arguments_exit_2_naming_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        bench.parse_args(argv)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_window_runs_from_the_first_progress_line_to_the_one_at_90_percent():
    sample = Sample("sync", 2)
    # (time, CPU ticks, worker 0's step, global_step, the ps's CPU ticks); steps=100, lines
    # every 10
    ticks = [(10.0 + 0.1 * k, 1000 + 30 * k, 10 * (k + 1), 10 * (k + 1), 400 + 10 * k)
             for k in range(10)]
    bench.fill_window(sample, ticks, steps=100, clock_ticks=100)
    assert sample.updates == 90 - 10
    assert sample.wall_s == pytest.approx(0.8)
    assert sample.cpu_s == pytest.approx(8 * 30 / 100)
    assert sample.ps_cpu_s == pytest.approx(8 * 10 / 100)
    assert sample.examples == 80 * 2 * bench.BATCH  # lockstep: every worker's batch per update


def test_async_window_counts_global_steps_and_one_batch_per_update():
    sample = Sample("async", 3)
    ticks = [(0.0, 0, 10, 25, 0), (1.0, 50, 20, 55, 20), (2.0, 100, 30, 90, 40)]
    bench.fill_window(sample, ticks, steps=30, clock_ticks=100)
    assert (sample.updates, sample.examples) == (55 - 25, 30 * bench.BATCH)
    assert sample.wall_s == 1.0


def test_a_window_needs_two_lines_and_progress():
    one = Sample("sync", 1)
    bench.fill_window(one, [(0.0, 0, 10, 10, 0)], steps=100, clock_ticks=100)
    assert one.error == "only 1 progress lines from worker 0"
    stuck = Sample("sync", 1)
    bench.fill_window(stuck, [(0.0, 0, 10, 7, 0), (1.0, 5, 20, 7, 2)], steps=100,
                      clock_ticks=100)
    assert stuck.error == "global_step did not advance in the window (7 to 7)"


def _sample(setup, n, seconds, updates=100, cpu=None, error=None):
    return Sample(setup, n, updates=updates,
                  examples=updates and updates * bench.examples_per_update(setup, n), wall_s=seconds,
                  cpu_s=cpu, startup_s=5.0, peak_rss_mb=100.0, error=error)


def test_summary_takes_median_and_spread_and_ratio_to_single():
    samples = [_sample("single", 1, 1.0, cpu=0.5), _sample("single", 1, 2.0, cpu=0.5),
               _sample("single", 1, 4.0, cpu=0.5),
               _sample("sync", 2, 2.0, cpu=1.0), _sample("sync", 2, 1.0, cpu=3.0),
               _sample("sync", 2, None, updates=None, error="worker 1 exited 4: boom")]
    rows = {(r.setup, r.workers): r for r in bench.summarise(samples)}
    single, sync = rows[("single", 1)], rows[("sync", 2)]
    assert (single.runs, single.examples_per_s) == (3, 100 * bench.BATCH / 2.0)
    assert (single.examples_per_s_min, single.examples_per_s_max) == (2500, 10000)
    assert single.ms_per_update == 20.0 and single.cpu_ms_per_update == 5.0
    assert sync.runs == 2 and sync.errors == ["worker 1 exited 4: boom"]
    assert sync.examples_per_s == pytest.approx((10000 + 20000) / 2)  # median of two
    assert sync.cpu_ms_per_update == pytest.approx(20.0)  # median of 10 and 30
    assert sync.vs_single == pytest.approx(15000 / 5000)
    assert [r.setup for r in bench.summarise(samples)] == ["single", "sync"]


def test_table_json_and_targets_carry_the_figures():
    samples = [_sample("single", 1, 0.1), _sample("floor", 1, 0.3), _sample("sync", 1, 0.5),
               _sample("sync", 2, 1.0), _sample("async", 2, 0.9, updates=200),
               _sample("sync-noproof", 2, 0.95), _sample("mwms", 2, 0.8),
               _sample("async", 3, None, updates=None, error="not done after 240 s")]
    rows = bench.summarise(samples)
    table = bench.format_table(rows)
    assert "20,000" in table  # sync x2: 100 updates x 200 examples in 1 s
    assert "failed: not done after 240 s" in table
    lines = bench.targets(rows, baseline_sync2=10000)
    assert "sync 2 workers vs before the changes: 2.00x" in lines[0]
    assert "sync / async, 2 workers: 0.90 (target >= 0.95)" in lines
    assert any("price of the proof, 2 workers: +5.0%" in line for line in lines)
    assert any(line.startswith("1 ps + 1 worker step: 5.00 ms = 1.25x compute + floor (1.00 + "
                               "3.00 ms") for line in lines)
    config = bench.parse_args(["--quick"])
    record = json.loads(json.dumps(bench.to_json(config, rows, samples)))
    assert record["config"]["steps"] == 200
    assert {r["setup"] for r in record["rows"]} == {"single", "floor", "sync", "async",
                                                      "sync-noproof", "mwms"}
    assert len(record["samples"]) == len(samples)


def test_without_matplotlib_the_plot_says_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    why = bench.plot([], tmp_path / "bench.png")
    assert "matplotlib is not installed" in why
    assert not (tmp_path / "bench.png").exists()


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows = bench.summarise([_sample("single", 1, 0.1), _sample("sync", 1, 0.5),
                            _sample("sync", 2, 1.0)])
    assert bench.plot(rows, tmp_path / "bench.png") is None
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_smallest_real_run_writes_table_and_json(processes, tmp_path):
    """1 ps + 1 worker, sync, once: real processes, a real window, nothing left running."""
    from procs import processes_mentioning

    out = tmp_path / "out"
    run = processes.start([sys.executable, "-m", "sync_mnist.bench.bench", "--setups", "sync",
                           "--workers", "1", "--repeats", "1", "--steps", "40", "--out",
                           str(out)], "bench")
    assert run.wait(timeout=240) == 0, run.output
    record = json.loads((out / "bench.json").read_text())
    (row,) = record["rows"]
    assert (row["setup"], row["workers"], row["runs"], row["errors"]) == ("sync", 1, 1, [])
    (sample,) = record["samples"]
    assert sample["updates"] == 36 - 4  # worker 0's lines at steps 4..40; window ends at 36
    assert sample["cpu_s"] > 0 and sample["peak_rss_mb"] > 50 and sample["startup_s"] > 0
    assert 0 < sample["ps_cpu_s"] < sample["cpu_s"]  # the ps's share of the run's CPU
    assert row["examples_per_s"] == pytest.approx(
        sample["examples"] / sample["wall_s"])
    assert "sync" in run.output and "examples/s" in run.output
    assert processes_mentioning(str(out)) == []


def test_without_proof_the_graph_has_no_counters_but_still_trains():
    """--bench-no-proof: no who-accumulator and no counting ops; the same token-valued step."""
    import tensorflow as tf

    import mlp_graph
    from sync_mnist.core import optimizers, sync

    def ops_of(proof):
        graph = tf.Graph()
        with graph.as_default():
            state = sync.build_shared_state(2)
            loss = mlp_graph.variables().spec.loss
            training = sync.build_train_op(loss, state, optimizers.make_optimizer("adam", 0.001),
                                           worker_index=0, num_workers=2,
                                           replicas_to_aggregate=2, is_chief=True, proof=proof)
            assert training.train_op.dtype == tf.int64  # the token: the global step
        return {op.type for op in graph.get_operations()}, \
            [op.name for op in graph.get_operations()]

    (with_types, with_names), (without_types, without_names) = ops_of(True), ops_of(False)
    assert any("who_accumulator" in n for n in with_names)
    assert not any("who_accumulator" in n for n in without_names)
    assert "ResourceScatterAdd" in with_types and "ResourceScatterAdd" not in without_types


def test_a_reaped_process_keeps_its_cpu_time():
    """Workers that end before worker 0 still count in the window's CPU (not as zero)."""
    # bench._Proc, private: the bench's own child runner, tested alone.
    proc = bench._Proc("busy", [sys.executable, "-c", "sum(range(3 * 10**7))"], dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while not proc.reap():
            assert time.monotonic() < deadline, "the child did not end within 60 s"
            time.sleep(0.05)
    finally:
        proc.kill()
    assert proc.exit_code == 0
    assert proc.cpu_ticks() == proc.final_ticks > 0
    assert proc.maxrss_kb > 0


@pytest.mark.skipif(not bench.torch_installed(),
                    reason="PyTorch is not installed (the ddp extra: pip install -e '.[ddp]')")
def test_the_ddp_row_trains_2_workers_in_a_real_window():
    """bench/ddp.py's processes, as the bench starts them: a rendezvous, DDP's lines, a window."""
    config = bench.parse_args(["--steps", "40"])
    sample = bench.run_one("ddp", 2, config)
    assert sample.error is None, sample.error
    assert sample.updates == 36 - 4  # worker 0's lines at steps 4..40; the window ends at 36
    assert sample.examples == sample.updates * 2 * bench.BATCH  # both workers' batches
    assert sample.cpu_s > 0 and sample.startup_s > 0 and sample.worker_rss_mb > 50
