"""Kubernetes TFJob: pods that share one command and learn their place from TF_CONFIG alone.

One process per pod through the real command line, each with the TF_CONFIG the TFJob operator
would give that pod (free ports on 127.0.0.1 stand in for the pods' service names), in an order
unlike the launcher's: the ps last. The pods train a model of the user's own, from a file
outside the repository (examples/your_model/my_model.py), and the chief exports it with its
own serving signature. Processes are killed by process group when a test ends. The manifest
itself is checked in tests/fast/test_tfjob.py.
"""

from __future__ import annotations

import sys

import pytest
from tensorflow.core.protobuf import saved_model_pb2

from procs import operator_tf_config, processes_mentioning, read_json, your_model_file
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import EXIT_OK

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine
STEPS = 20


# Replica types in the order their pods start here, and how many of each: the shipped
# manifest's. Where each pod of a layout with a Chief replica lands is checked in-process
# (tests/fast/test_task_identity.py); a whole cluster costs a TensorFlow start-up per pod.
LAYOUTS = {
    "PS 1 + Worker 3 (deploy/kubernetes)": [("worker", 3), ("ps", 1)],
}


@pytest.mark.parametrize("replicas", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_tf_config_only_cluster_trains_in_lockstep(replicas, processes, tmp_path):
    ports = iter(free_ports(sum(count for _, count in replicas)))
    spec = {job: [f"127.0.0.1:{next(ports)}" for _ in range(count)] for job, count in replicas}
    model = your_model_file(tmp_path)  # in every command line, to find leftovers
    logdir = tmp_path / "logdir"
    # The pod template's command: the same for every pod, with no --role or --index. (The
    # record path differs only because these "pods" share one filesystem.)
    command = [sys.executable, "-m", "sync_mnist", "--model", model, "--train-steps",
               str(STEPS), "--timeout", "60", "--log-every", "10", "--logdir", str(logdir)]
    pods = {}
    for job, count in replicas:
        for index in range(count):
            name = f"{job}-{index}"
            pods[name] = processes.start(
                ["env", f"TF_CONFIG={operator_tf_config(spec, job, index)}", *command,
                 "--summary-json", str(tmp_path / f"{name}.json")], name)

    for name, pod in pods.items():
        assert pod.wait(BOUND) == EXIT_OK, pod.output
    records = {name: read_json(tmp_path / f"{name}.json") for name in pods}
    chief_jobs = len(spec.get("chief", []))
    num_workers = chief_jobs + len(spec["worker"])
    # Each pod took the place its TF_CONFIG gave it: a Chief replica is worker 0, and the
    # Worker replicas follow it.
    expected = {"ps-0": ("ps", 0), "chief-0": ("worker", 0),
                **{f"worker-{i}": ("worker", chief_jobs + i) for i in range(len(spec["worker"]))}}
    assert {name: (r["role"], r["index"]) for name, r in records.items()} == \
        {name: place for name, place in expected.items() if name in records}
    for name, place in expected.items():
        if name in pods:
            pods[name].wait_for_line(rf"\[{place[0]} {place[1]}\] ", 1)  # log lines tagged so
    workers = [r for r in records.values() if r["role"] == "worker"]
    assert len(workers) == num_workers
    for w in workers:
        assert w["global_step"] == STEPS
        assert w["local_steps"] == STEPS
        assert w["contributions"] == [STEPS] * num_workers
        assert w["synchronous"] is True, w["verdict"]
    chief = next(w for w in workers if w["index"] == 0)
    assert chief["model"] == model
    # Only the chief evaluates: the model's own metric, on its own evaluation data.
    assert chief["test_metrics"]["accuracy"] == chief["test_accuracy"]
    assert [w["test_accuracy"] for w in workers if w["index"] != 0] == [None] * (num_workers - 1)
    assert records["ps-0"]["contributions"] == [STEPS] * num_workers
    # The SavedModel serves the model's own predictions, from its features as trained.
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((logdir / "saved_model" / "saved_model.pb").read_bytes())
    signature = saved.meta_graphs[0].signature_def["serving_default"]
    assert set(signature.inputs) == {"features"}
    assert set(signature.outputs) == {"classes", "probabilities"}
    assert processes_mentioning(model.split(":")[0]) == []
