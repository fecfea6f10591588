"""Generated PyTorchJob / TrainJob manifests against the Kubeflow CRD schemas.

jsonschema checks types and required fields of the CRDs' openAPIV3Schema; the CRDs do not reject
unknown fields or bad enum values, so `strict_errors` walks the manifest against the schema and does.
The CRD copies live next to the repository (../shared/crds); the tests skip, naming it, when absent.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import pytest
import yaml

from flashdraft.config import load_config
from flashdraft.launch.job_spec import job_spec
from flashdraft.launch.jobs import build_job

CRDS = Path(__file__).resolve().parents[2] / ".." / "shared" / "crds"
PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"
TRAINJOB_CRD = "trainer.kubeflow.org_trainjobs.yaml"
RUNTIME_CRD = "trainer.kubeflow.org_clustertrainingruntimes.yaml"

# Enums that the CRDs state only in prose (field name -> allowed values).
ENUMS = {
    "restartPolicy": {"Always", "OnFailure", "Never", "ExitCode"},
    "cleanPodPolicy": {"All", "Running", "None"},
    "rdzvBackend": {"c10d", "etcd", "etcd-v2"},
    "medium": {"", "Memory", "HugePages"},
    "effect": {"NoSchedule", "PreferNoSchedule", "NoExecute"},
    "imagePullPolicy": {"Always", "IfNotPresent", "Never"},
    "protocol": {"TCP", "UDP", "SCTP"},
    "propagation": {"None", "HostToContainer", "Bidirectional"},
}
TOLERATION_OPERATORS = {"Exists", "Equal"}
RUNTIME_KINDS = {"ClusterTrainingRuntime", "TrainingRuntime"}
OBJECT_META = {"name", "namespace", "labels", "annotations", "ownerReferences", "generateName", "finalizers"}
OWNER_REF = {"apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion"}


def crd_schema(filename: str) -> dict:
    path = CRDS / filename
    if not path.is_file():
        pytest.skip(f"CRD schema {filename} not found in {CRDS.resolve()} (the shared/crds folder beside the repo)")
    return copy.deepcopy(_load_schema(path))


@functools.lru_cache(maxsize=None)
def _load_schema(path: Path) -> dict:
    # The C loader when PyYAML has it: the CRDs are ~9000 lines each.
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]


def strict_errors(obj, schema: dict, path: str = "") -> list[str]:
    """Unknown fields and out-of-enum values in `obj` under a structural schema."""
    errors: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return errors
    if isinstance(obj, dict):
        props = schema.get("properties")
        if path == ".metadata" or path.endswith(".template.metadata") and not props:
            props = {k: {} for k in OBJECT_META}
        if path == ".metadata.ownerReferences[]":
            props = {k: {} for k in OWNER_REF}
        if props is not None:
            for key, value in obj.items():
                if key not in props:
                    errors.append(f"{path}.{key}: unknown field")
                else:
                    errors += strict_errors(value, props[key], f"{path}.{key}")
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, value in obj.items():
                errors += strict_errors(value, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(obj, list):
        for item in obj:
            errors += strict_errors(item, schema.get("items", {}), f"{path}[]")
    elif isinstance(obj, str):
        field = path.rsplit(".", 1)[-1]
        allowed = ENUMS.get(field)
        if field == "operator" and ".tolerations[]" in path:
            allowed = TOLERATION_OPERATORS
        if path.endswith(".runtimeRef.kind"):
            allowed = RUNTIME_KINDS
        if allowed is not None and obj not in allowed:
            errors.append(f"{path}: {obj!r} not one of {sorted(allowed)}")
    return errors


def assert_valid(manifest: dict, filename: str) -> None:
    schema = crd_schema(filename)
    jsonschema.validate(manifest, schema)
    assert strict_errors(manifest, schema) == []


VARIANTS = [
    dict(nodes=1, gpus_per_node=1),
    dict(
        nodes=4,
        gpus_per_node=8,
        cpu="96",
        memory="1Ti",
        shm_size="64Gi",
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"},
        service_account="flashdraft-trainer",
        image_pull_secrets=["regcred"],
        secret_env=["HF_TOKEN=flashdraft-hf-token:HF_TOKEN"],
        pvcs=["flashdraft-data:/data", "flashdraft-models:/models:targets"],
        env={"NCCL_DEBUG": "WARN"},
        timeout_s=86400,
    ),
    dict(nodes=2, gpus_per_node=0, procs_per_node=2, image="reg/flashdraft-runtime:0.1.0"),
]


def _spec(backend: str, **launch):
    values = dict(backend=backend, image="reg/flashdraft-trainer:0.1.0-cuda12.8", namespace="team-a", name="fd-test")
    values.update(launch)
    return job_spec(load_config("smollm2_135m", ["draft.num_layers=2"], {f"launch.{k}": v for k, v in values.items()}))


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_pytorchjob_validates_against_crd(variant):
    job = build_job(_spec("pytorchjob", **VARIANTS[variant]))
    assert_valid(job, PYTORCHJOB_CRD)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    nodes = VARIANTS[variant]["nodes"]
    assert replicas.get("Worker", {}).get("replicas", 0) == nodes - 1
    for replica in replicas.values():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert container["command"][:4] == ["torchrun", "--no-python", "flashdraft", "train"]


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_trainjob_validates_against_crd(variant):
    job = build_job(_spec("trainjob", **VARIANTS[variant]))
    assert_valid(job, TRAINJOB_CRD)
    assert job["spec"]["trainer"]["numNodes"] == VARIANTS[variant]["nodes"]


def test_elastic_pytorchjob_validates():
    job = build_job(_spec("pytorchjob", nodes=4, elastic_min_nodes=2))
    assert_valid(job, PYTORCHJOB_CRD)
    assert job["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 4, "maxRestarts": 3}


def test_owner_reference_validates():
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "pipeline-train-abc", "uid": "1234-5678"}
    for backend, crd in (("pytorchjob", PYTORCHJOB_CRD), ("trainjob", TRAINJOB_CRD)):
        job = build_job(_spec(backend), owner)
        assert_valid(job, crd)
        assert job["metadata"]["ownerReferences"] == [owner]


def test_runtime_manifest_validates():
    """The ClusterTrainingRuntime shipped in manifests/ against its CRD."""
    path = Path(__file__).resolve().parents[2] / "manifests" / "cluster" / "training-runtime.yaml"
    runtime = yaml.safe_load(path.read_text())
    assert_valid(runtime, RUNTIME_CRD)
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    assert job["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == "node"


def test_strict_walker_catches_what_jsonschema_misses():
    """The walker must fail on a misspelt field and a bad enum that the CRD schema lets through."""
    schema = crd_schema(PYTORCHJOB_CRD)
    job = build_job(_spec("pytorchjob", nodes=2))
    job["spec"]["runPolicy"]["backofLimit"] = 3  # typo
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFail"
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    jsonschema.validate(job, schema)  # passes: that is why the walker exists
    errors = strict_errors(job, schema)
    assert ".spec.runPolicy.backofLimit: unknown field" in errors
    assert any("restartPolicy: 'OnFail'" in e for e in errors)
    assert any(e.endswith("containers[].volumeMount: unknown field") for e in errors)
    job["metadata"]["lables"] = {}
    assert ".metadata.lables: unknown field" in strict_errors(job, schema)


def test_jsonschema_catches_wrong_types():
    job = build_job(_spec("trainjob"))
    job["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job, crd_schema(TRAINJOB_CRD))
