"""`sync-mnist-bench --model ctr` without a cluster: which runs it plans, what each task is
told, the log-loss it reads from worker 0's evaluation line, and the rows and target it
reports. tests/cluster/test_bench.py runs the bench for real (the MLP)."""

from __future__ import annotations

import pytest

from sync_mnist.bench import bench
from sync_mnist.bench.bench import Sample

pytestmark = pytest.mark.usefixtures("without_pytorch")


def test_ctr_runs_the_four_setups_that_hold_a_table_at_each_worker_count():
    config = bench.parse_args(["--model", "ctr"])
    assert config.model == "ctr" and config.repeats == 2 and config.steps == 400
    assert bench.plan(config) == [(s, n) for s in ("async", "sync", "sync-2ps", "mwms")
                                  for n in (1, 2, 3)]


def test_ctr_quick_runs_sync_and_mwms_at_2_and_3_workers_once():
    config = bench.parse_args(["--model", "ctr", "--quick"])
    assert (config.repeats, config.steps) == (1, 200)
    assert bench.plan(config) == [("sync", 2), ("mwms", 2), ("sync", 3), ("mwms", 3)]
    # --setups narrows the quick plan, as for the MLP
    narrowed = bench.parse_args(["--model", "ctr", "--quick", "--setups", "mwms"])
    assert bench.plan(narrowed) == [("mwms", 2), ("mwms", 3)]


def test_the_mlp_plan_is_unchanged_by_the_model_option():
    assert bench.plan(bench.parse_args(["--quick"])) == [
        pair for pair in bench.QUICK_PLAN if pair[0] != "ddp"]
    assert bench.parse_args([]).model == "mlp"


@pytest.mark.parametrize("argv, message", [
    (["--model", "ctr", "--setups", "sync,floor"], "floor cannot run --model ctr"),
    (["--model", "ctr", "--setups", "single,sync-bf16"], "single,sync-bf16 cannot run"),
    (["--model", "dlrm"], "invalid choice: 'dlrm'"),
])
def test_setups_the_ctr_model_cannot_run_exit_2_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_every_task_of_a_ctr_run_is_told_the_model():
    # bench._task_argvs, private: the argv of each process of one run.
    config = bench.parse_args(["--model", "ctr", "--steps", "100"])
    ps, workers = ["localhost:1", "localhost:2"], ["localhost:3", "localhost:4"]
    tasks = bench._task_argvs("sync-2ps", 2, ps, workers, config)
    assert [name for name, _ in tasks] == ["ps 0", "ps 1", "worker 0", "worker 1"]
    for _, argv in tasks:
        assert argv[argv.index("--model") + 1] == "ctr" and "--dataset" not in argv
        assert argv[argv.index("--train-steps") + 1] == "100"
    mwms = bench._task_argvs("mwms", 2, [], workers, config)
    assert [argv[argv.index("--model") + 1] for _, argv in mwms] == ["ctr", "ctr"]
    mlp = bench._task_argvs("mwms", 2, [], workers, bench.parse_args([]))
    assert [argv[argv.index("--model") + 1] for _, argv in mlp] == ["mlp", "mlp"]


def test_the_log_loss_is_read_from_the_chiefs_and_mwms_evaluation_lines():
    chief = ["22:31:02 [worker 0] step=400 global_step=400",
             "22:31:04 [worker 0] test_accuracy=- test_loss=0.5902 on 50000 evaluation "
             "examples (auc=0.7101 log_loss=0.5902 planted_auc=0.7704 planted_log_loss=0.5575)",
             "22:31:05 [worker 0] done"]
    assert bench.read_log_loss(chief) == (0.5902, 0.5575)
    mwms = ["22:32:16 [mwms 0] log_loss=0.6097 planted_log_loss=0.5575 on 50000 evaluation "
            "examples"]
    assert bench.read_log_loss(mwms) == (0.6097, 0.5575)
    # the planted figure alone is not the model's; the MLP's chief has neither
    assert bench.read_log_loss(["planted_log_loss=0.5575"]) == (None, None)
    assert bench.read_log_loss(["test_accuracy=0.9100 test_loss=0.3000"]) == (None, None)


def _sample(setup, n, seconds, loss, ps_mb=700.0, worker_mb=900.0):
    return Sample(setup, n, updates=100, examples=100 * bench.examples_per_update(setup, n),
                  wall_s=seconds, cpu_s=seconds, startup_s=5.0, peak_rss_mb=2000.0,
                  ps_rss_mb=ps_mb, worker_rss_mb=worker_mb, log_loss=loss,
                  planted_log_loss=0.5575)


def test_rows_carry_the_log_loss_spread_and_per_task_memory_and_the_target_compares():
    samples = [_sample("sync", 2, 1.0, 0.60, ps_mb=780), _sample("sync", 2, 2.0, 0.62, ps_mb=790),
               _sample("sync", 2, 4.0, 0.61, ps_mb=800),
               _sample("mwms", 2, 2.0, 0.605, ps_mb=None, worker_mb=1080),
               _sample("mwms", 2, 3.0, 0.615, ps_mb=None, worker_mb=1090),
               _sample("sync", 3, 1.0, 0.6), _sample("async", 3, 1.0, 0.6),
               _sample("sync", 1, 1.0, 0.6), _sample("mwms", 1, 1.0, 0.6)]
    rows = {(r.setup, r.workers): r for r in bench.summarise(samples)}
    sync2, mwms2 = rows[("sync", 2)], rows[("mwms", 2)]
    assert (sync2.log_loss, sync2.log_loss_min, sync2.log_loss_max) == (0.61, 0.60, 0.62)
    assert (sync2.ps_rss_mb, sync2.worker_rss_mb, sync2.planted_log_loss) == (790, 900, 0.5575)
    assert mwms2.ps_rss_mb is None and mwms2.worker_rss_mb == 1085
    assert mwms2.log_loss == pytest.approx(0.61)
    # 20,000 examples a run; sync: median of 20,000, 10,000 and 5,000 a second; mwms: the
    # median of 10,000 and 6,667
    # no mwms at 3 workers, and 1 worker is no target: one line
    (line,) = bench.ctr_targets(bench.summarise(samples))
    assert line.startswith("sync / MultiWorkerMirroredStrategy, ctr, 2 workers: 1.20x "
                           "(10,000 vs 8,333 examples/s")
    assert "log-loss 0.6100 vs 0.6100, planted 0.5575" in line
    table = bench.format_table(bench.summarise(samples))
    assert "log-loss" in table and "0.6100 (0.6000-0.6200)" in table
    assert "log-loss" not in bench.format_table(bench.summarise(
        [_sample("sync", 2, 1.0, None)]))
