"""The bench's PyTorch DDP row (bench/ddp.py) without running it: the same model and optimizer
as the PS rows, where it is planned, what each process is told, the target lines, and what the
bench does without PyTorch. tests/cluster/test_bench.py runs it for real where PyTorch is
installed."""

from __future__ import annotations

import pytest

from sync_mnist.bench import bench, ddp
from sync_mnist.bench.bench import Sample


def test_the_ddp_peer_trains_the_models_the_ps_rows_train():
    from sync_mnist.core.config import TrainConfig
    from sync_mnist.models import ctr, mlp

    assert [list(s) for s in zip(ddp.MLP_SIZES, ddp.MLP_SIZES[1:])] == [
        shape for shape in mlp.variable_shapes() if len(shape) == 2]
    assert ddp.ADAM_LEARNING_RATE == TrainConfig(train_steps=1).learning_rate
    assert ddp.CTR == {key: ctr.PARAMS[key] for key in ddp.CTR}
    assert set(ctr.PARAMS) - set(ddp.CTR) == {"seed", "data_dir", "train_files", "eval_files",
                                             "shuffle_buffer"}  # the files' params, unused


def test_with_pytorch_ddp_runs_beside_sync_at_2_workers_and_for_ctr_at_2_and_3(monkeypatch):
    monkeypatch.setattr(bench, "torch_installed", lambda: True)
    assert ("ddp", 2) in bench.plan(bench.parse_args(["--quick"]))
    assert [p for p in bench.plan(bench.parse_args(["--model", "ctr", "--quick"]))
            if p[0] == "ddp"] == [("ddp", 2), ("ddp", 3)]
    assert ("ddp", 3) in bench.plan(bench.parse_args([]))


def test_without_pytorch_ddp_is_left_out_and_asked_for_by_name_is_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(bench, "torch_installed", lambda: False)
    assert "ddp" not in dict(bench.plan(bench.parse_args(["--quick"])))
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--setups", "sync,ddp"])
    assert exit_.value.code == 2
    assert ("--setups ddp needs PyTorch, which is not installed: pip install -e '.[ddp]'"
            in capsys.readouterr().err)


def test_each_ddp_process_is_told_its_rank_the_rendezvous_and_the_model():
    workers = ["localhost:3", "localhost:4", "localhost:5"]
    config = bench.parse_args(["--model", "ctr", "--steps", "100"])
    tasks = bench._task_argvs("ddp", 3, [], workers, config)
    assert [name for name, _ in tasks] == ["worker 0", "worker 1", "worker 2"]
    for k, (_, argv) in enumerate(tasks):
        assert argv[1:3] == ["-m", "sync_mnist.bench.ddp"]
        assert argv[argv.index("--rank") + 1] == str(k)
        assert argv[argv.index("--worker-hosts") + 1] == ",".join(workers)
        assert argv[argv.index("--model") + 1] == "ctr"
        assert argv[argv.index("--steps") + 1] == "100"


def _sample(setup, n, seconds, loss=None):
    return Sample(setup, n, updates=100, examples=100 * bench.examples_per_update(setup, n),
                  wall_s=seconds, cpu_s=seconds, log_loss=loss)


def test_the_target_lines_put_sync_against_ddp():
    # 100 updates of n x 100 examples: sync 2 workers 20,000 in 2 s, DDP in 1 s
    mlp = bench.summarise([_sample("sync", 2, 2.0), _sample("ddp", 2, 1.0)])
    assert ("sync / PyTorch DDP, 2 workers: 0.50x (10,000 vs 20,000 examples/s; target >= "
            "0.75x)") in bench.targets(mlp)
    ctr = bench.summarise([_sample("sync", 2, 1.0, 0.56), _sample("ddp", 2, 2.0, 0.58),
                           _sample("sync", 3, 1.0), _sample("ddp", 3, 1.5)])
    assert bench.ctr_targets(ctr) == [
        "sync / PyTorch DDP, ctr, 2 workers: 2.00x (20,000 vs 10,000 examples/s; target >= "
        "1x); log-loss 0.5600 vs 0.5800",
        "sync / PyTorch DDP, ctr, 3 workers: 1.50x (30,000 vs 20,000 examples/s; target >= "
        "1.3x)"]
