"""Profile of one synchronous step: `sync-mnist-bench --profile DIR`.

A bare ps server runs in a child process (bench_tasks floor-ps); this process is worker 0, the
chief, with the real graph (graph.build_graph). Instead of MonitoredSession and the optimizer's
queue-runner thread, it runs both halves of a step itself, each with FULL_TRACE:

  * the worker's step: sess.run of the train op with the batch fed, as lockstep._StepRunner does
    (compute the gradients, count, push, wait for the token);
  * the chief's update: the queue runner's op, in a thread beside it (take the averaged
    gradients and the who-sum, apply Adam, global_step += 1, count, enqueue the tokens).

Each is written as a Chrome trace (chrome://tracing or https://ui.perfetto.dev), and a text
summary of where the step's time goes per device and per op goes to summary.txt.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

log = logging.getLogger("sync_mnist.bench.bench")

WARMUP_STEPS = 20  # untraced steps first: graph registration and first-run costs
TRACED_STEPS = 5
# How TensorFlow's gRPC transport labels a tensor it received, in a FULL_TRACE's step stats:
# "[0.4MB] [2.2Gb/s] edge_17_layer0/... from /job:ps/replica:0/task:1/device:CPU:0 to /job:...".
_RECEIVED = re.compile(r"\] (\S+) from (\S+) to (\S+)$")


def profile(out: Path, *, timed_steps: int = 200, proof: bool = True,
            model: str = "mlp") -> str:
    """Writes worker-step-K.json, update-K.json and summary.txt to `out`; returns the summary."""
    from sync_mnist.core import cluster as cluster_lib
    from sync_mnist.core import tfcompat

    tfcompat.graph_mode(verbose=False)
    out.mkdir(parents=True, exist_ok=True)
    ports = cluster_lib.free_ports(2)
    ps, worker = f"localhost:{ports[0]}", f"localhost:{ports[1]}"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    server = subprocess.Popen([sys.executable, "-m", "sync_mnist.bench.tasks", "floor-ps",
                               "--ps-hosts", ps, "--worker-hosts", worker], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        cluster_lib.wait_reachable(ps, "ps 0", 120)
        return _profile_against(out, ps, worker, timed_steps, proof, model)
    finally:
        os.killpg(server.pid, 9)
        server.wait()


class _Profiled:
    """Worker 0's graph in a session on the bare ps, both halves of a step run by hand."""

    def __init__(self, ps: str, worker_address: str, proof: bool, model_name: str):
        import tensorflow as tf

        from sync_mnist.core import cluster as cluster_lib
        from sync_mnist.core import sessions
        from sync_mnist.task.graph import build_graph
        from sync_mnist.core.config import TaskConfig, TrainConfig

        tf1 = tf.compat.v1
        # Without the optimizer's session hook one of its ops goes unused, which TensorFlow
        # logs as an error at exit; nothing is wrong.
        tf.get_logger().setLevel(logging.CRITICAL)
        layout = cluster_lib.ClusterLayout.parse(ps, worker_address)
        config = TaskConfig(role="worker", index=0, cluster=layout,
                            train=TrainConfig(model=model_name, train_steps=10**6,
                                              params={} if model_name == "ctr" else
                                              {"dataset": "synthetic"},
                                              proof=proof))
        # Kept on self: the server lives as long as the session that runs on it.
        self.server = tf.distribute.Server(layout.spec(), job_name="worker", task_index=0,
                                           start=True)
        self.shard, model = _profiled_shard(config, model_name)
        graph = tf.Graph()
        with graph.as_default():
            self.g = build_graph(config, model, self.shard.batch(0))
            optimizer = self.g.training.optimizer
            self.update_op = optimizer._chief_queue_runner.enqueue_ops[0]  # pylint: disable=protected-access
            init = [tf1.global_variables_initializer(), tf1.local_variables_initializer()]
        self.sess = tf1.Session(self.server.target, graph=graph,
                                config=sessions.session_config(layout.device_filters("worker", 0)))
        self.sess.run(init)
        self.sess.run([optimizer.chief_init_op, optimizer.local_step_init_op])
        self.full = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE,
                                   output_partition_graphs=True)
        self.fetches = [self.g.training.train_op, self.g.spec.loss, self.g.spec.train_metrics]

    def step(self, k: int, traced: bool):
        """Step k: the chief's update in a thread beside the worker's step; returns
        ({"worker": RunMetadata, "update": RunMetadata}, the worker step's seconds)."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        x, y = self.shard.batch(k)
        meta = {"worker": tf1.RunMetadata(), "update": tf1.RunMetadata()}
        update = threading.Thread(target=self.sess.run, args=(self.update_op,), kwargs=dict(
            options=self.full if traced else None,
            run_metadata=meta["update"] if traced else None))
        update.start()
        began = time.perf_counter()
        self.sess.run(self.fetches, self.g.feed(x, y), options=self.full if traced else None,
                      run_metadata=meta["worker"] if traced else None)
        took = time.perf_counter() - began
        update.join(60)
        return meta, took


def _profiled_shard(config, model_name: str):
    """(the shard worker 0 steps through, the model): the ctr model's clicks, or the MLP's
    synthetic data."""
    from sync_mnist.core.shard import Shard
    from sync_mnist.models import ctr, data, mlp
    from sync_mnist.task.inputs import input_data, model_params

    model = ctr.MODEL if model_name == "ctr" else mlp.MODEL
    if model_name == "ctr":
        features, labels = input_data("train_input_fn", model.train_input_fn,
                                      model_params(config, model))
    else:
        dataset = data.make_synthetic(0)
        features, labels = dataset.train_images, dataset.train_labels
    return Shard(features, labels, index=0, num_workers=1, batch_size=100, seed=0), model


def _profile_against(out: Path, ps: str, worker_address: str, timed_steps: int,
                     proof: bool, model_name: str) -> str:
    profiled = _Profiled(ps, worker_address, proof, model_name)
    for k in range(WARMUP_STEPS):
        profiled.step(k, traced=False)
    plain = [profiled.step(WARMUP_STEPS + k, traced=False)[1] for k in range(timed_steps)]
    lines = [f"{model_name} model, untraced steps (1 ps + 1 worker, proof "
             f"{'on' if proof else 'off'}, update loop "
             f"in a thread of this process): median {1000 * statistics.median(plain):.2f} ms "
             f"over {timed_steps} steps (min {1000 * min(plain):.2f}, max "
             f"{1000 * max(plain):.2f})"]
    lines += _traced_steps(profiled, out, WARMUP_STEPS + timed_steps)
    profiled.sess.close()
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    return text


def _traced_steps(profiled: _Profiled, out: Path, first: int) -> list[str]:
    """Runs TRACED_STEPS steps from step `first` with FULL_TRACE, writes each half's Chrome
    trace to `out`; returns the summary's lines: the last step's time and where it went, and
    the bytes a worker step moves between tasks."""
    from tensorflow.python.client import timeline

    lines = []
    worker_steps = []
    for k in range(TRACED_STEPS):
        meta, took = profiled.step(first + k, traced=True)
        worker_steps.append(meta["worker"])
        for name, m in meta.items():
            trace = timeline.Timeline(m.step_stats).generate_chrome_trace_format()
            (out / f"{name}-step-{k}.json").write_text(trace)
        if k == TRACED_STEPS - 1:
            lines.append(f"traced step {k}: {1000 * took:.2f} ms as seen by sess.run "
                         "(tracing adds its own cost)")
            lines += summarise(meta["worker"].step_stats, "worker step")
            lines += summarise(meta["update"].step_stats, "chief update")
    moved = wire_bytes(worker_steps)
    lines.append("bytes between tasks in a worker step: " + ", ".join(
        f"{src} -> {dst} {n:,}" for (src, dst), n in sorted(moved.items())))
    return lines


def wire_bytes(traced: Sequence) -> dict[tuple[str, str], int]:
    """Bytes one step moves between tasks, from runs of the same step traced with FULL_TRACE
    and output_partition_graphs (RunMetadata each).

    Which tensors cross comes from the partition graphs, the graphs each task ran: every _Recv
    of a tensor from another task (a control edge's dummy tensor left out). How many bytes each
    is comes from the transport: TensorFlow's record of receiving it (RecvTensor), at its size
    as received. A trace now and then lacks some of a ps's records (a race inside TensorFlow:
    about one trace in four here, in-process or not), so each tensor's size is taken from any
    of the runs that recorded it.

    Returns:
      {(sender, receiver): bytes}, each task named as in the logs ("worker 0", "ps 1").

    Raises:
      ValueError: a tensor that crosses was recorded in none of the runs; name and all.
    """
    import tensorflow as tf

    def task(device: str) -> str:
        spec = tf.DeviceSpec.from_string(device)
        return f"{spec.job} {spec.task}"

    crossing, sizes = {}, {}  # (tensor, receiver): sender; (tensor, receiver): bytes
    for meta in traced:
        for graph in meta.partition_graphs:
            nodes = {n.name: n for n in graph.node}
            for n in graph.node:
                if n.op == "_Send" and task(n.attr["send_device"].s.decode()) != task(
                        n.attr["recv_device"].s.decode()):
                    source = nodes.get(n.input[0].lstrip("^").split(":")[0])
                    if source is not None and source.op == "Const" and "/ctrl_" in source.name:
                        continue  # a control edge's dummy: no bytes of the model
                    crossing[n.attr["tensor_name"].s.decode(),
                             task(n.attr["recv_device"].s.decode())] = task(n.device)
        for dev in meta.step_stats.dev_stats:
            for node in dev.node_stats:
                match = _RECEIVED.search(node.timeline_label) \
                    if node.node_name == "RecvTensor" else None
                if match:
                    sizes[match.group(1), task(match.group(3))] = sum(
                        o.tensor_description.allocation_description.requested_bytes
                        for o in node.output)
    unrecorded = sorted(key for key in crossing if key not in sizes)
    if unrecorded:
        raise ValueError(f"no record of receiving {unrecorded[0][0]} on {unrecorded[0][1]} "
                         f"in {len(traced)} traced runs ({len(unrecorded)} such tensors)")
    moved: dict[tuple[str, str], int] = {}
    for (tensor, receiver), sender in crossing.items():
        moved[sender, receiver] = moved.get((sender, receiver), 0) + sizes[tensor, receiver]
    return moved


def summarise(step_stats, title: str, top: int = 12) -> list[str]:
    """Per device: the span of its ops and their summed time; the longest ops overall."""
    spans, ops = {}, []
    for dev in step_stats.dev_stats:
        starts, ends, busy = [], [], 0
        for node in dev.node_stats:
            start = node.all_start_micros
            end = start + max(node.all_end_rel_micros, node.op_end_rel_micros)
            starts.append(start)
            ends.append(end)
            busy += end - start
            ops.append((end - start, _short(dev.device), node.node_name, start))
        if starts:
            spans[dev.device] = (min(starts), max(ends), busy, len(starts))
    if not spans:
        return [f"{title}: no step stats"]
    origin = min(s[0] for s in spans.values())
    finish = max(s[1] for s in spans.values())
    lines = [f"{title}: {(finish - origin) / 1000:.2f} ms from first op to last"]
    for device, (start, end, busy, count) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        lines.append(f"  {_short(device):<40} {count:>4} ops, +{(start - origin) / 1000:6.2f} "
                     f"to +{(end - origin) / 1000:6.2f} ms, ops summed {busy / 1000:6.2f} ms")
    lines.append("  longest ops:")
    for micros, device, name, start in sorted(ops, reverse=True)[:top]:
        lines.append(f"    {micros / 1000:6.2f} ms at +{(start - origin) / 1000:6.2f}  "
                     f"{device:<28} {name}")
    return lines


def _short(device: str) -> str:
    return device.replace("/replica:0", "").replace("/device:", "/")


def main(out: Path, model: str = "mlp") -> int:
    text = profile(out, model=model)
    print(text, end="")
    print(f"Chrome traces in {out} (open in chrome://tracing or ui.perfetto.dev)")
    return 0
