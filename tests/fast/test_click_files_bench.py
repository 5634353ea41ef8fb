"""`sync-mnist-bench --model ctr --files` without a cluster: sync-files, the ctr model reading
its clicks from TFRecord files, planned beside sync from memory, its tasks pointed at the
files, and the target line that compares the two (bench.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sync_mnist.bench import bench
from sync_mnist.bench.bench import Sample

pytestmark = pytest.mark.usefixtures("without_pytorch")


def test_files_adds_sync_files_right_after_sync_at_each_worker_count():
    quick = bench.parse_args(["--model", "ctr", "--files", "--quick"])
    assert bench.plan(quick) == [("sync", 2), ("sync-files", 2), ("mwms", 2), ("sync", 3),
                                 ("sync-files", 3), ("mwms", 3)]
    measured = bench.parse_args(["--model", "ctr", "--setups", "sync,sync-files",
                                 "--workers", "2,3", "--repeats", "3"])
    assert bench.plan(measured) == [("sync", 2), ("sync-files", 2), ("sync", 3),
                                    ("sync-files", 3)]
    assert "sync-files" not in dict(bench.plan(bench.parse_args(["--model", "ctr"])))


def test_with_files_every_other_round_runs_each_worker_count_s_setups_in_reverse(monkeypatch):
    config = bench.parse_args(["--model", "ctr", "--setups", "sync,sync-files", "--workers",
                               "2,3", "--repeats", "2"])
    pairs = bench.plan(config)
    swapped = [("sync-files", 2), ("sync", 2), ("sync-files", 3), ("sync", 3)]
    assert [bench.in_round(pairs, k) for k in range(4)] == [pairs, swapped, pairs, swapped]
    ran = []  # what run_all runs, in its order
    monkeypatch.setattr(bench, "click_files", lambda config: None)
    monkeypatch.setattr(bench, "run_one", lambda setup, n, config, num_ps: ran.append(
        (setup, n)) or Sample(setup, n, error="not run"))
    bench.run_all(config)
    assert ran == pairs + swapped
    assert bench.in_round(pairs[:2], 1) == swapped[:2]
    without = bench.plan(bench.parse_args(["--model", "ctr", "--workers", "2,3"]))
    assert bench.in_round(without, 1) == without  # no files target: the plan's own order


@pytest.mark.parametrize("argv, message", [
    (["--files"], "--files is for --model ctr"),
    (["--setups", "sync-files"], "sync-files cannot run --model mlp"),
])
def test_files_are_the_click_model_s_only(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_sync_files_tasks_read_the_click_log_under_out():
    config = bench.parse_args(["--model", "ctr", "--files", "--out", "/tmp/b"])
    tasks = bench._task_argvs("sync-files", 2, ["localhost:1"], ["localhost:2", "localhost:3"],
                              config)
    for _, argv in tasks:
        assert argv[argv.index("--model") + 1] == "ctr"
        assert Path(argv[argv.index("--data-dir") + 1]) == Path("/tmp/b") / bench.FILES_DIR
    assert "--data-dir" not in bench._task_argvs("sync", 2, ["localhost:1"],
                                                 ["localhost:2", "localhost:3"], config)[1][1]


def _sample(setup, n, seconds):
    return Sample(setup, n, updates=100, examples=100 * bench.examples_per_update(setup, n),
                  wall_s=seconds, cpu_s=seconds)


def test_the_target_compares_files_with_memory_with_the_spread():
    samples = [_sample("sync", 2, 1.0), _sample("sync", 2, 1.1), _sample("sync", 2, 0.9),
               _sample("sync-files", 2, 1.0), _sample("sync-files", 2, 1.25),
               _sample("sync-files", 2, 1.05), _sample("sync", 3, 1.0)]
    (line,) = bench.files_targets(bench.summarise(samples))
    # 20,000 examples a run: files' median 19,048 (16,000-20,000), memory's 20,000
    assert line == ("files / memory, ctr, 2 workers: 0.95x (19,048 (16,000-20,000) vs 20,000 "
                    "(18,182-22,222) examples/s, 3 and 3 runs; target >= 0.95x)")
    assert line in bench.ctr_targets(bench.summarise(samples))


def test_with_the_samples_the_target_gives_each_round_s_ratio_and_their_median():
    # Round k: the k-th run of each. Files over memory: 1.0/1.0, 1.1/1.25 and 0.9/1.05 of the
    # memory's seconds over the files' (equal examples): 1.00x, 0.88x, 0.86x; median 0.88x.
    samples = [_sample("sync", 2, 1.0), _sample("sync-files", 2, 1.0),
               _sample("sync", 2, 1.1), _sample("sync-files", 2, 1.25),
               _sample("sync", 2, 0.9), _sample("sync-files", 2, 1.05)]
    (line,) = bench.files_targets(bench.summarise(samples), samples)
    assert line.endswith("target >= 0.95x); round by round 1.00x, 0.88x, 0.86x: median 0.88x")
    assert line in bench.ctr_targets(bench.summarise(samples), samples)
    # A failed run leaves its round out; one round left is no series.
    samples[3].error = "worker 1 exited 1"
    (line,) = bench.files_targets(bench.summarise(samples), samples)
    assert line.endswith("round by round 1.00x, 0.86x: median 0.93x")
    samples[1].error = "worker 0 exited 1"
    (line,) = bench.files_targets(bench.summarise(samples), samples)
    assert line.endswith("target >= 0.95x)")


def test_with_the_ps_s_cpu_the_target_gives_the_workers_cpu_over_the_ps_s():
    # The ps's CPU is the control: files' workers spend 2.1 and 2.3 times the ps's (median 2.2),
    # memory's 2.0 and 2.0: +10.0%. A run without the ps's CPU (a failed one) is left out.
    def run(setup, cpu, ps):
        return dataclasses.replace(_sample(setup, 3, 1.0), cpu_s=cpu, ps_cpu_s=ps)

    samples = [run("sync", 3.0, 1.0), run("sync-files", 3.1, 1.0), run("sync", 6.0, 2.0),
               run("sync-files", 6.6, 2.0), run("sync-files", 9.0, None)]
    assert bench.workers_over_ps(samples, "sync-files", 3) == pytest.approx(2.2)
    (line,) = bench.files_targets(bench.summarise(samples), samples)
    assert line.endswith("; the workers' CPU over the ps's (medians): files 2.200, memory "
                         "2.000: +10.0%")
    assert bench.workers_over_ps(samples, "sync", 2) is None


def test_click_files_of_an_earlier_format_are_written_again(tmp_path, monkeypatch):
    from sync_mnist.models import clickformat, clickwriter

    written = []

    def write(directory, *args, **kwargs):
        written.append(directory)
        directory.mkdir(parents=True)
        (directory / clickformat.MANIFEST).write_text('{"features": ["label", "ids"]}')

    monkeypatch.setattr(clickwriter, "write", write)
    config = bench.parse_args(["--model", "ctr", "--files", "--out", str(tmp_path)])
    directory = tmp_path / bench.FILES_DIR
    directory.mkdir()
    (directory / clickformat.MANIFEST).write_text('{"format": "tfrecord"}')  # a list a column
    (directory / "train-00000-of-00012.tfrecord").write_bytes(b"old")
    assert bench.click_files(config) == directory and written == [directory]
    assert not (directory / "train-00000-of-00012.tfrecord").exists()
    bench.click_files(config)  # the current format: kept
    assert written == [directory]


def test_sync_count_runs_the_click_model_counted_beside_sync_when_named():
    """--setups sync,sync-count: the click model with --count-examples, run right after sync at
    each worker count, and its target line: the price of counting (issue 55)."""
    assert "sync-count" not in bench.parse_args(["--model", "ctr"]).setups
    with pytest.raises(SystemExit):
        bench.parse_args(["--setups", "sync-count"])  # the mlp has no click numbers
    config = bench.parse_args(["--model", "ctr", "--setups", "sync,sync-count",
                               "--workers", "2,3", "--repeats", "2"])
    assert bench.plan(config) == [("sync", 2), ("sync-count", 2), ("sync", 3),
                                  ("sync-count", 3)]
    assert bench.in_round(bench.plan(config), 1)[:2] == [("sync-count", 2), ("sync", 2)]
    argv = bench._task_argvs("sync-count", 2, ["localhost:1"], ["localhost:2", "localhost:3"],
                             config)[1][1]
    assert argv[len(argv) - argv[::-1].index("--model")] == "sync_mnist.bench.counted:CTR"
    assert argv[argv.index("--count-examples") + 1] == "example"
    samples = [_sample("sync", 2, 1.0), _sample("sync-count", 2, 1.04)]
    assert bench.files_targets(bench.summarise(samples), samples, "sync-count") == [
        "--count-examples / without, ctr, 2 workers: 0.96x (19,231 (19,231-19,231) vs 20,000 "
        "(20,000-20,000) examples/s, 1 and 1 runs; target >= 0.95x)"]
