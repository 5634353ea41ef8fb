"""A cluster in one process: 1 ps (or num_ps) and N workers, each a thread running the real
task."""

from __future__ import annotations

import threading
import types

from sync_mnist.core.cluster import ClusterLayout, free_ports
from sync_mnist.core.config import TaskConfig, TrainConfig

GUARD = 120.0  # seconds for a whole in-process run; past it a task is taken to be stuck


def run_cluster(num_workers: int, model=None, num_ps: int = 1,
                **train_kwargs) -> types.SimpleNamespace:
    """num_ps ps + num_workers workers, each a thread running the real task (on `model`, a
    sync_mnist.api.Model, or the one --model names); their result records (`ps`: ps 0's)."""
    import tensorflow as tf

    from sync_mnist.task import ps, worker

    ports = free_ports(num_workers + num_ps)
    layout = ClusterLayout(tuple(f"localhost:{p}" for p in ports[:num_ps]),
                           tuple(f"localhost:{p}" for p in ports[num_ps:]))
    if model is None or "dataset" in model.params:  # a model without it refuses it
        train_kwargs.setdefault("params", {"dataset": "synthetic"})
    train = TrainConfig(timeout=30.0, log_every=10, **train_kwargs)
    servers = {("ps", p): tf.distribute.Server(layout.spec(), job_name="ps", task_index=p)
               for p in range(num_ps)}
    for i in range(num_workers):
        servers["worker", i] = tf.distribute.Server(layout.spec(), job_name="worker",
                                                    task_index=i)
    outcome: dict = {}

    def run(role, index):
        config = TaskConfig(role=role, index=index, cluster=layout, train=train)
        try:
            if role == "ps":
                outcome[role, index] = ps.run_ps(config, server=servers[role, index])
            else:
                outcome[role, index] = worker.run_worker(config, model=model,
                                                         server=servers[role, index])
        except BaseException as e:  # reported below, in the test's thread
            outcome[role, index] = e

    threads = [threading.Thread(target=run, args=key, daemon=True) for key in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
    stuck = [key for key, t in zip(servers, threads) if t.is_alive()]
    assert not stuck, f"still running after {GUARD:g} s: {stuck}"
    errors = {key: value for key, value in outcome.items() if isinstance(value, BaseException)}
    assert not errors, errors
    return types.SimpleNamespace(
        ps=outcome["ps", 0], chief=outcome["worker", 0],
        workers=[outcome["worker", i] for i in range(num_workers)])
