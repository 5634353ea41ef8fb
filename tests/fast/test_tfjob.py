"""Kubernetes TFJob: pods that share one command and learn their place from TF_CONFIG alone.

Here, the manifest: validated against the TFJob CRD and the operator's webhook rules, and its
command a valid task in every pod. tests/container/test_tf_config_cluster.py runs those pods
as processes.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from procs import operator_tf_config


# ---------------------------------------------------------------------------- the manifest

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "kubernetes" / "tfjob.yaml"
CRD = REPO.parent / "shared" / "kubeflow" / "kubeflow.org_tfjobs.yaml"
# What the operator accepts for the fields the schema types only as strings
# (pkg/apis/kubeflow.org/v1/common_types.go, tfjob_types.go).
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")
SUCCESS_POLICIES = ("", "AllWorkers")
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def _crd_schema() -> dict:
    if not CRD.exists():
        pytest.skip(f"no TFJob CRD at {CRD}")
    return _read_crd_schema()


@functools.lru_cache(maxsize=1)
def _read_crd_schema() -> dict:
    import yaml

    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def _load_manifest() -> dict:
    (job,) = [d for d in _load_documents() if d["kind"] == "TFJob"]
    return job


def _load_documents() -> list[dict]:
    import yaml

    return list(yaml.safe_load_all(MANIFEST.read_text()))


def _unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """Keys the schema does not define. The schema does not reject them, but the API server
    prunes or (with strict field validation, kubectl's default) rejects them: a typo such as
    `cleanpodPolicy` would silently be no policy at all."""
    found = []
    if isinstance(value, dict):
        known = schema.get("properties")
        for key, item in value.items():
            if known is not None and key not in known:
                if not schema.get("x-kubernetes-preserve-unknown-fields"):
                    found.append(f"{path}.{key}")
                continue
            child = known[key] if known is not None else schema.get("additionalProperties")
            if isinstance(child, dict):
                found += _unknown_fields(item, child, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += _unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def _webhook_errors(job: dict) -> list[str]:
    """The operator's admission webhook rules the schema leaves out (see its README)."""
    errors = []
    name = job.get("metadata", {}).get("name", "")
    if not (DNS_1035.fullmatch(name) and len(name) <= 63):
        errors.append(f"metadata.name {name!r} is not a DNS-1035 label")
    replicas = job["spec"]["tfReplicaSpecs"]
    for rtype, spec in replicas.items():
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        tensorflow = [c for c in containers if c.get("name") == "tensorflow"]
        if not tensorflow:
            errors.append(f"{rtype}: no container named tensorflow")
        elif not tensorflow[0].get("image"):
            errors.append(f"{rtype}: the tensorflow container has no image")
    chiefs = sum(spec.get("replicas", 1) for rtype, spec in replicas.items()
                 if rtype in ("Chief", "Master"))
    if chiefs > 1:
        errors.append(f"{chiefs} Chief/Master replicas; at most one")
    return errors


def _validate(job: dict) -> list[str]:
    import jsonschema

    schema = _crd_schema()
    problems = [f"schema: {'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(job)]
    problems += [f"unknown field {f}" for f in _unknown_fields(job, schema)]
    problems += _webhook_errors(job)
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        if spec.get("restartPolicy", "Never") not in RESTART_POLICIES:
            problems.append(f"{rtype}: restartPolicy {spec['restartPolicy']!r}")
    if job["spec"].get("runPolicy", {}).get("cleanPodPolicy", "None") not in CLEAN_POD_POLICIES:
        problems.append(f"cleanPodPolicy {job['spec']['runPolicy']['cleanPodPolicy']!r}")
    if job["spec"].get("successPolicy", "") not in SUCCESS_POLICIES:
        problems.append(f"successPolicy {job['spec']['successPolicy']!r}")
    return problems


def test_manifest_validates_against_the_crd_and_the_webhook_rules():
    assert _validate(_load_manifest()) == []


def test_manifest_is_1_ps_and_3_workers_with_one_command_and_the_chosen_policies():
    job = _load_manifest()
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    replicas = job["spec"]["tfReplicaSpecs"]
    assert {rtype: spec["replicas"] for rtype, spec in replicas.items()} == {"PS": 1, "Worker": 3}
    commands = [spec["template"]["spec"]["containers"][0]["args"] for spec in replicas.values()]
    assert commands[0] == commands[1]  # one command for every pod ...
    assert commands[0][0] == "sync-mnist"
    assert not {"--role", "--index", "--ps-hosts", "--worker-hosts"} & set(commands[0])
    # ... and it parses: with each pod's TF_CONFIG, it is a valid task (checked in-process).
    assert {spec["restartPolicy"] for spec in replicas.values()} == {"ExitCode"}
    assert job["spec"]["successPolicy"] == "AllWorkers"
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    (port,) = replicas["Worker"]["template"]["spec"]["containers"][0]["ports"]
    assert port == {"name": "tfjob-port", "containerPort": 2222}  # what TF_CONFIG will name


def test_every_pod_mounts_one_read_write_many_claim_at_the_logdir():
    # Each ps writes its shard of a checkpoint to its own filesystem, and the chief restores
    # from its own: --logdir must be storage that every pod shares (an emptyDir is the pod's).
    (claim,) = [d for d in _load_documents() if d["kind"] == "PersistentVolumeClaim"]
    assert claim["apiVersion"] == "v1"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for rtype, spec in _load_manifest()["spec"]["tfReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        logdir = container["args"][container["args"].index("--logdir") + 1]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == logdir]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume == {"name": mount["name"], "persistentVolumeClaim": {
            "claimName": claim["metadata"]["name"]}}, rtype


@pytest.mark.parametrize("task_type, index", [("ps", 0), ("worker", 0), ("worker", 2)])
def test_manifest_command_is_a_valid_task_in_every_pod(task_type, index, monkeypatch):
    from sync_mnist.task import cli

    command = _load_manifest()["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]["args"]
    spec = {"ps": ["sync-mnist-ps-0.default.svc:2222"],
            "worker": [f"sync-mnist-worker-{i}.default.svc:2222" for i in range(3)]}
    monkeypatch.setenv("TF_CONFIG", operator_tf_config(spec, task_type, index))
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    args = cli.task_parser().parse_args(command[1:])
    layout, role, task_index = cli.task_in_cluster(args, cli.task_parser())
    assert (role, task_index) == (task_type, index)
    assert layout.address(role, task_index) == spec[task_type][index]


DOCKERFILE = REPO / "deploy" / "kubernetes" / "Dockerfile"


def _dockerfile_instruction(name: str) -> str:
    (value,) = [line.split(None, 1)[1] for line in DOCKERFILE.read_text().splitlines()
                if line.split(None, 1)[:1] == [name]]
    return value


def test_the_image_runs_the_manifest_args_under_tini_as_a_non_root_user():
    # tests/container runs the image's default command, with no args; the pods give these
    # args. A `command:` would replace the image's ENTRYPOINT and make the task PID 1, which
    # ignores the kubelet's SIGTERM until Python has installed its handler.
    import json

    container = _load_manifest()["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]
    assert "command" not in container
    assert json.loads(_dockerfile_instruction("ENTRYPOINT")) == ["tini", "--"]
    assert json.loads(_dockerfile_instruction("CMD")) == container["args"]
    assert _dockerfile_instruction("USER") == "1000"


BROKEN = {
    "replicas not a number": (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"].update(
        replicas="three"), "schema: spec.tfReplicaSpecs.Worker.replicas: 'three' is not of type"),
    "misspelt policy key": (lambda j: j["spec"]["runPolicy"].update(cleanpodPolicy="All"),
                            "unknown field .spec.runPolicy.cleanpodPolicy"),
    "container renamed": (lambda j: j["spec"]["tfReplicaSpecs"].update(
        PS={**j["spec"]["tfReplicaSpecs"]["PS"], "template": {"spec": {"containers": [
            {"name": "trainer", "image": "sync-mnist:0.1.0"}]}}}),
        "PS: no container named tensorflow"),
    "name not DNS-1035": (lambda j: j["metadata"].update(name="Sync_MNIST"),
                          "metadata.name 'Sync_MNIST' is not a DNS-1035 label"),
    "two chiefs": (lambda j: j["spec"]["tfReplicaSpecs"].update(
        Chief={**j["spec"]["tfReplicaSpecs"]["PS"], "replicas": 2}),
        "2 Chief/Master replicas; at most one"),
    "unknown restart policy": (lambda j: j["spec"]["tfReplicaSpecs"]["PS"].update(
        restartPolicy="ExitCodes"), "PS: restartPolicy 'ExitCodes'"),
}


@pytest.mark.parametrize("damage, expected", BROKEN.values(), ids=BROKEN.keys())
def test_the_validation_catches_a_broken_manifest(damage, expected):
    job = _load_manifest()
    damage(job)
    problems = _validate(job)
    assert any(p.startswith(expected) for p in problems), problems
