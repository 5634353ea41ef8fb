"""The bytes one worker step of the ctr model moves each way, against the size of its table.

    python -m lab.sparse_bytes [--rows 100000 1000000 10000000] [--ps 2]
                                                  [--vocabulary 10000]
    python -m lab.sparse_bytes --rows 1000000 --ps 4 --vocabulary 200 --json
    python -m lab.sparse_bytes --vocabulary 200 --wire-dtype bfloat16

For each table size: K ps servers and one worker (the chief) in this process, the real graph
(build_graph of models/ctr.py, 26 fields, batch 100) and the real session; one
untraced step, then --traced steps with FULL_TRACE and the partition graphs, each measured
alone by bench_profile.wire_bytes (which tensors crossed from the partition graphs, their
sizes from the transport's receive records). The same batches for every size, so a step
looks up the same ids; only the table's rows differ. A step moves each way:

  worker -> ps: the ids each ps looks up, then the gradient: the rows the batch touched
                (sorted, unique) and their values, the dense layers' gradient, a few scalars;
  ps -> worker: the looked-up rows, the dense layers' weights, the token.

None of that grows with the table. Prints one line per size, and the table's bytes beside;
with --json, one JSON object per size instead (scaling.py's sweep of the ctr model reads it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

from sync_mnist.core.config import WIRE_DTYPES

_SERVERS: list = []


def measure(rows: int, num_ps: int, traced: int, batch_size: int = 100,
            vocabulary: int = 10_000, wire_dtype: str = "float32") -> dict:
    """{"pushed": bytes worker -> all ps per step, "pulled": ps -> worker, "per_ps_pushed" and
    "per_ps_pulled": the same for each ps, "steps": how many traced steps had every tensor's
    record} for a ctr table of `rows` rows and `vocabulary` ids a field, crossing in
    `wire_dtype` (--wire-dtype)."""
    import numpy as np
    import tensorflow as tf

    from sync_mnist.core.shard import Shard
    from sync_mnist.core import sessions
    from sync_mnist.task.graph import build_graph
    from sync_mnist.task.inputs import input_data, model_params
    from sync_mnist.core.cluster import ClusterLayout, free_ports
    from sync_mnist.core.config import TaskConfig, TrainConfig
    from sync_mnist.bench.profiling import wire_bytes
    from sync_mnist.models import ctr

    tf1 = tf.compat.v1
    # By default 10,000 ids a field, more than the default run's 200: a batch touches more
    # rows (about 1,600 of its 2,600 lookups), as measured in docs/sparse.md.
    model = dataclasses.replace(ctr.MODEL, params={**ctr.PARAMS, "rows": rows,
                                                   "vocabulary": vocabulary,
                                                   "train_examples": 20 * batch_size})
    ports = free_ports(num_ps + 1)
    layout = ClusterLayout(tuple(f"localhost:{p}" for p in ports[:num_ps]),
                           (f"localhost:{ports[-1]}",))
    servers = [tf.distribute.Server(layout.spec(), job_name="ps", task_index=p)
               for p in range(num_ps)]
    chief = tf.distribute.Server(layout.spec(), job_name="worker", task_index=0)
    # An in-process server cannot be stopped, and destroying one waits forever for its
    # threads: kept until the process ends (main ends it with os._exit).
    _SERVERS.extend([*servers, chief])
    config = TaskConfig(role="worker", index=0, cluster=layout,
                        train=TrainConfig(model="ctr", train_steps=traced + 1,
                                          batch_size=batch_size, wire_dtype=wire_dtype))
    features, labels = input_data("train_input_fn", model.train_input_fn,
                                         model_params(config, model))
    shard = Shard(features, labels, index=0, num_workers=1, batch_size=batch_size, seed=0)
    graph = tf.Graph()
    with graph.as_default():
        g = build_graph(config, model, shard.batch(0), target=traced + 1)
        sess = sessions.monitored_session(
            chief.target, is_chief=True, hooks=g.training.hooks,
            config=sessions.session_config(layout.device_filters("worker", 0)), timeout=120,
            transient=g.transient, status=sessions.SessionStatus())
    moved = []
    try:
        options = tf1.RunOptions(timeout_in_ms=120_000)
        token = int(sess.run(g.training.train_op, g.feed(*shard.batch(0)), options=options))
        trace = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE,
                               output_partition_graphs=True, timeout_in_ms=120_000)
        for _ in range(traced):
            meta = tf1.RunMetadata()
            token = int(sess.run(g.training.train_op, g.feed(*shard.batch(token)),
                                 options=trace, run_metadata=meta))
            try:
                moved.append(wire_bytes([meta]))
            except ValueError:  # a trace that lacks a record (bench_profile.wire_bytes)
                continue
    finally:
        sess.close()
    if not moved:
        raise RuntimeError(f"none of {traced} traced steps recorded every tensor received")

    def each_way(sender: str, receiver: str) -> float:
        return statistics.mean(sum(b for (s, r), b in m.items()
                                   if s.startswith(sender) and r.startswith(receiver))
                               for m in moved)

    def per_ps(sender: str, receiver: str) -> float:
        return statistics.mean(m.get((sender, receiver), 0) for m in moved)

    return {"rows": rows, "vocabulary": vocabulary, "ps": num_ps, "wire_dtype": wire_dtype,
            "table_bytes": rows * ctr.PARAMS["dimension"] * 4,
            "pushed": each_way("worker", "ps"), "pulled": each_way("ps", "worker"),
            "steps": len(moved),
            "per_ps_pushed": [per_ps("worker 0", f"ps {p}") for p in range(num_ps)],
            "per_ps_pulled": [per_ps(f"ps {p}", "worker 0") for p in range(num_ps)]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10**5, 10**6, 10**7],
                        help="table sizes (default: 100000 1000000 10000000)")
    parser.add_argument("--ps", type=int, default=2, help="ps tasks (default: 2)")
    parser.add_argument("--traced", type=int, default=6, help="traced steps (default: 6)")
    parser.add_argument("--batch-size", type=int, default=100, help="(default: 100)")
    parser.add_argument("--vocabulary", type=int, default=10_000,
                        help="ids a field (default: 10000; the default ctr run has 200)")
    parser.add_argument("--wire-dtype", choices=WIRE_DTYPES, default="float32",
                        help="what the rows and the dense layers cross in (default: float32)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per table size, not a line of text (default: off)")
    args = parser.parse_args(argv)
    from sync_mnist.core import tfcompat

    tfcompat.graph_mode(verbose=False)
    if not args.json:
        print(f"ctr model, 26 fields x 16, {args.vocabulary} ids a field, batch "
              f"{args.batch_size}, {args.ps} ps, 1 worker, --wire-dtype {args.wire_dtype}; "
              "bytes per step, mean over the traced steps", flush=True)
    for rows in args.rows:
        m = measure(rows, args.ps, args.traced, args.batch_size, args.vocabulary,
                    args.wire_dtype)
        if args.json:
            print(json.dumps(m), flush=True)
            continue
        print(f"rows={m['rows']:>10,} table={m['table_bytes'] / 1e6:8.1f} MB  "
              f"worker->ps={m['pushed']:>9,.0f} B ({m['pushed'] / m['table_bytes']:.3%})  "
              f"ps->worker={m['pulled']:>9,.0f} B ({m['pulled'] / m['table_bytes']:.3%})  "
              f"per ps pushed={[round(b) for b in m['per_ps_pushed']]}  "
              f"traced steps={m['steps']}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the in-process servers would hold an ordinary exit forever


if __name__ == "__main__":
    main()
