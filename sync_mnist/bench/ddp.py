"""The benchmark's PyTorch peer: DistributedDataParallel over gloo on the CPU, the all-reduce
data parallelism users compare a parameter server with. `sync-mnist-bench` (bench.py) starts
one process per worker; nobody else does.

    python -m sync_mnist.bench.ddp --rank R --worker-hosts H0,H1,... [--model mlp|ctr]

The same model, optimizer, batch and data as the PS rows:
  mlp  the question's MLP (784-256-256-10, ReLU), softmax cross-entropy, Adam at 0.001, on the
       synthetic MNIST (models/data.make_synthetic), each worker its own shard;
  ctr  the click model (models/ctr.py): 26 fields, each (field, id) its own row of a
       1,000,000 x 16 table (`nn.Embedding(sparse=True)`: its gradient is sparse, and DDP
       all-reduces it as such over gloo), the rows concatenated into a ReLU layer of 64 and a
       logit, the logistic loss, Adagrad at 0.1 from an initial accumulator of 1e-5, on the
       generated clicks (models/clicks.py). Its rows are field * vocabulary + id, no hash:
       no two (field, id) share a row, and a lookup costs what the hashed one does.
After the last step worker 0 logs the ctr model's log-loss on the 50,000 evaluation clicks
beside the planted model's, as the PS chief does.

Each worker logs `ready to step` once DDP has made its first step (its buckets, the first
all-reduce), then `step=K global_step=K` every --log-every steps, as the PS workers do; bench.py
times its window on those lines. PyTorch is the `ddp` extra (`pip install -e '.[ddp]'`), never
a dependency of the package; this module imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys

import numpy as np

log = logging.getLogger("sync_mnist.bench.ddp")

READY = "ready to step"  # as bench/tasks.py's
# models/mlp.py's and models/ctr.py's, which import TensorFlow (tests/fast/test_bench_ddp.py
# checks that they agree).
MLP_SIZES = (784, 256, 256, 10)
ADAM_LEARNING_RATE = 0.001
CTR = {"fields": 26, "rows": 1_000_000, "dimension": 16, "hidden_units": [64],
       "learning_rate": 0.1, "initial_accumulator": 1e-5, "vocabulary": 200, "zipf": 1.1,
       "weight_scale": 0.25, "bias": -1.0, "train_examples": 600_000, "eval_examples": 50_000}
RENDEZVOUS_SECS = 120  # every worker joins the process group within it, or it fails


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sync_mnist.bench.ddp")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--worker-hosts", required=True,
                   help="HOST:PORT of each worker; worker 0's is the rendezvous")
    p.add_argument("--model", choices=("mlp", "ctr"), default="mlp")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [ddp {args.rank}] %(message)s", datefmt="%H:%M:%S")
    import torch
    import torch.distributed as dist

    # One thread each, as torchrun starts a worker (OMP_NUM_THREADS=1 where a host has several):
    # with PyTorch's default of a thread per core, the workers of one host share its cores.
    torch.set_num_threads(1)
    # Adagrad's sparse update builds its tensors from valid ones: no invariant to check.
    torch.sparse.check_sparse_tensor_invariants.disable()
    hosts = args.worker_hosts.split(",")
    host, port = hosts[0].rsplit(":", 1)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=args.rank,
                            world_size=len(hosts),
                            timeout=datetime.timedelta(seconds=RENDEZVOUS_SECS))
    try:
        train = _ctr if args.model == "ctr" else _mlp
        train(args, len(hosts))
    finally:
        dist.destroy_process_group()
    return 0


def _shard(features, labels, args, num_workers: int):
    from sync_mnist.core.shard import Shard  # numpy only

    return Shard(features, labels, index=args.rank, num_workers=num_workers,
                 batch_size=args.batch_size, seed=args.seed)


def _mlp(args, num_workers: int) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from sync_mnist.models import data  # numpy only

    dataset = data.make_synthetic(args.seed)
    shard = _shard(dataset.train_images, dataset.train_labels, args, num_workers)
    layers = []
    for k, (fan_in, fan_out) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:])):
        layers += [nn.Linear(fan_in, fan_out)] + [nn.ReLU()] * (k < len(MLP_SIZES) - 2)
    model = DistributedDataParallel(nn.Sequential(*layers))
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM_LEARNING_RATE)
    loss_of = nn.CrossEntropyLoss()

    def step(k: int) -> float:
        x, y = shard.batch(k)
        pixels = torch.from_numpy(np.asarray(x, np.float32) / 255.0)
        optimizer.zero_grad()
        loss = loss_of(model(pixels), torch.from_numpy(np.asarray(y, np.int64)))
        loss.backward()  # DDP all-reduces (mean) the gradients as backward produces them
        optimizer.step()
        return loss.item()  # as sess.run hands back its fetch

    _steps(step, args)


def _ctr(args, num_workers: int) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from sync_mnist.models import clicks as clicks_lib  # numpy only

    params = {**CTR, "seed": args.seed}
    fields, vocabulary = params["fields"], params["vocabulary"]
    offsets = np.arange(fields, dtype=np.int64) * vocabulary
    train = clicks_lib.generate(params, params["train_examples"], part=0)
    shard = _shard(train.ids + offsets, train.labels, args, num_workers)
    del train
    model = DistributedDataParallel(_click_model(params))
    optimizer = torch.optim.Adagrad(model.parameters(), lr=params["learning_rate"],
                                    initial_accumulator_value=params["initial_accumulator"])
    loss_of = nn.BCEWithLogitsLoss()

    def step(k: int) -> float:
        rows, y = shard.batch(k)
        optimizer.zero_grad()
        loss = loss_of(model(torch.from_numpy(rows)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        return loss.item()

    _steps(step, args)
    if args.rank == 0:
        evaluation = clicks_lib.generate(params, params["eval_examples"], part=1)
        with torch.no_grad():
            logits = model.module(torch.from_numpy(evaluation.ids + offsets))
            loss = loss_of(logits, torch.from_numpy(evaluation.labels)).item()
        log.info("log_loss=%.4f planted_log_loss=%.4f on %d evaluation examples", loss,
                 evaluation.planted_log_loss(), len(evaluation.labels))


def _click_model(params):
    from torch import nn

    class ClickModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(params["rows"], params["dimension"], sparse=True)
            nn.init.trunc_normal_(self.table.weight, std=0.05, a=-0.1, b=0.1)
            sizes = [params["fields"] * params["dimension"], *params["hidden_units"]]
            hidden = []
            for fan_in, fan_out in zip(sizes, sizes[1:]):
                hidden += [nn.Linear(fan_in, fan_out), nn.ReLU()]
            self.hidden = nn.Sequential(*hidden, nn.Linear(sizes[-1], 1))

        def forward(self, rows):
            return self.hidden(self.table(rows).flatten(1)).squeeze(1)

    return ClickModel()



def _steps(step, args) -> None:
    step(0)  # DDP's first step builds its buckets and joins the all-reduce: untimed
    log.info(READY)
    for k in range(1, args.steps + 1):
        step(k)
        if k % args.log_every == 0:
            log.info("step=%d global_step=%d", k, k)


if __name__ == "__main__":
    sys.exit(main())
