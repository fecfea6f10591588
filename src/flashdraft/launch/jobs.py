"""Job manifests: a `LaunchSpec` -> a PyTorchJob (kubeflow.org/v1) or a TrainJob (trainer.kubeflow.org/v1alpha1).

Both run the same container command: plain `torchrun` configured only by the PET_* variables the
operators inject (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, and
PET_RDZV_* for elastic jobs), then `flashdraft train`. The trainer resumes from its output dir, which
lives on the shared volume, so a restarted pod or job continues from the latest checkpoint.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml

from flashdraft.config import RECIPES_DIR, load_config, read_yaml, recipe_path
from flashdraft.launch.job_spec import SCRATCH, LaunchSpec

PYTORCHJOB_API = ("kubeflow.org", "v1", "pytorchjobs")
TRAINJOB_API = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
PYTORCH_CONTAINER = "pytorch"  # the Training Operator finds the training container by this name
TRAINJOB_CONTAINER = "node"  # the container of the runtime's "node" replicated job
TRAINJOB_REPLICATED_JOB = "node"
PYTORCHJOB_PORT = 23456  # the operator's default master port
PATCH_MANAGER = "flashdraft.launch"
APP_LABELS = {"app.kubernetes.io/name": "flashdraft", "app.kubernetes.io/component": "train"}


def yaml_value(value: Any) -> str:
    """A value as `key=value` text that `parse_overrides` (YAML) reads back as the same value."""
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        # PyYAML reads "1e-05" as a string; it needs a dot in the mantissa.
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exp = text.split("e")
            text = f"{mantissa}.0e{exp}"
        return text
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip().removesuffix("...").strip()


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(_flatten(value, f"{name}."))
        else:
            out.append((name, value))
    return out


def train_arguments(recipe: str | None, overrides: list[str], output_dir: str) -> list[str]:
    """`flashdraft train` arguments for the pod.

    A packaged recipe travels by name. A recipe file on the launching machine does not exist in the
    pod, so its values travel as `key=value` overrides. The user's overrides follow and win; the
    output dir on the shared volume comes last.
    """
    args: list[str] = []
    if recipe is not None:
        path = recipe_path(recipe)
        if path.parent == RECIPES_DIR:
            args += ["--config", path.stem if Path(recipe).suffix else recipe]
        else:
            args += [f"{key}={yaml_value(value)}" for key, value in _flatten(read_yaml(path))]
    return args + list(overrides) + [f"train.output_dir={output_dir}"]


def check_train_arguments(args: list[str]) -> None:
    """Load the config exactly as the pod's `flashdraft train` will: a typo fails here, not in the pod."""
    if args[:1] == ["--config"]:
        load_config(args[1], args[2:])
    else:
        load_config(None, args)


def training_command(spec: LaunchSpec) -> list[str]:
    # --no-python: run the `flashdraft` console script itself in each process.
    return [
        "torchrun",
        "--no-python",
        "flashdraft",
        "train",
        *train_arguments(spec.recipe, spec.overrides, spec.resolved_output_dir),
    ]


def _env(spec: LaunchSpec) -> list[dict]:
    env = {
        "PYTHONUNBUFFERED": "1",
        # Pods may run as an arbitrary UID with a read-only image: every cache goes to scratch.
        "HOME": SCRATCH,
        "XDG_CACHE_HOME": f"{SCRATCH}/.cache",
        "TRITON_CACHE_DIR": f"{SCRATCH}/.triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{SCRATCH}/.inductor",
        # Target weights are cached once on the shared volume, not downloaded per pod.
        "HF_HOME": f"{spec.pvcs[0].mount_path.rstrip('/')}/hf-cache",
        **spec.env,
    }
    out = [{"name": k, "value": v} for k, v in env.items()]
    out += [{"name": s.env, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}} for s in spec.secret_env]
    return out


def _resources(spec: LaunchSpec) -> dict:
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if spec.gpus_per_node > 0:
        limits[spec.gpu_resource] = str(spec.gpus_per_node)
    if spec.cpu:
        requests["cpu"] = spec.cpu
    if spec.memory:
        requests["memory"] = limits["memory"] = spec.memory
    out: dict[str, dict] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _volumes(spec: LaunchSpec) -> tuple[list[dict], list[dict]]:
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        # NCCL and DataLoader workers need a /dev/shm larger than the runtime's 64 MiB default.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
    ]
    mounts = [{"name": "scratch", "mountPath": SCRATCH}, {"name": "dshm", "mountPath": "/dev/shm"}]
    for i, pvc in enumerate(spec.pvcs):
        volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": pvc.claim}})
        mount = {"name": f"pvc-{i}", "mountPath": pvc.mount_path}
        if pvc.sub_path:
            mount["subPath"] = pvc.sub_path
        mounts.append(mount)
    return volumes, mounts


def _pod_scheduling(spec: LaunchSpec) -> dict:
    out: dict[str, Any] = {"securityContext": {"runAsNonRoot": True}}
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.service_account:
        out["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    return out


def _metadata(spec: LaunchSpec, owner: dict | None) -> dict:
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "labels": dict(APP_LABELS)}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def build_pytorchjob(spec: LaunchSpec, owner: dict | None = None) -> dict:
    """A PyTorchJob: one Master and `nodes - 1` Workers, each one node with `procs` processes."""
    spec.validate()
    volumes, mounts = _volumes(spec)
    container = {
        "name": PYTORCH_CONTAINER,
        "image": spec.image,
        "command": training_command(spec),
        "env": _env(spec),
        "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}],
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    template = {
        "metadata": {"labels": dict(APP_LABELS)},
        "spec": {"containers": [container], "volumes": volumes, **_pod_scheduling(spec)},
    }
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if spec.nodes > 1:
        replicas["Worker"] = {
            "replicas": spec.nodes - 1,
            "restartPolicy": "OnFailure",
            "template": copy.deepcopy(template),
        }
    # Pods are kept after the job ends so failed ones can be inspected; deleting the job removes them.
    run_policy: dict[str, Any] = {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": "None"}
    if spec.active_deadline_s:
        run_policy["activeDeadlineSeconds"] = spec.active_deadline_s
    job_spec: dict[str, Any] = {
        "runPolicy": run_policy,
        "nprocPerNode": str(spec.procs),
        "pytorchReplicaSpecs": replicas,
    }
    if spec.elastic_min_nodes is not None:
        job_spec["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "minReplicas": spec.elastic_min_nodes,
            "maxReplicas": spec.nodes,
            "maxRestarts": spec.max_restarts,
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(spec, owner),
        "spec": job_spec,
    }


def build_trainjob(spec: LaunchSpec, owner: dict | None = None) -> dict:
    """A TrainJob on our ClusterTrainingRuntime; pod-level settings go in as a runtime patch."""
    spec.validate()
    volumes, mounts = _volumes(spec)
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": training_command(spec),
        "env": _env(spec),
        "numNodes": spec.nodes,
        "numProcPerNode": spec.procs,
    }
    resources = _resources(spec)
    if resources:
        trainer["resourcesPerNode"] = resources
    pod_patch = {
        "containers": [
            {
                "name": TRAINJOB_CONTAINER,
                "volumeMounts": mounts,
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
        "volumes": volumes,
        **_pod_scheduling(spec),
    }
    job_spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": spec.runtime},
        "trainer": trainer,
        "runtimePatches": [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": TRAINJOB_REPLICATED_JOB,
                                    "template": {"spec": {"template": {"spec": pod_patch}}},
                                }
                            ]
                        }
                    }
                },
            }
        ],
    }
    if spec.active_deadline_s:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_s
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(spec, owner),
        "spec": job_spec,
    }


def build_job(spec: LaunchSpec, owner: dict | None = None) -> dict:
    return build_pytorchjob(spec, owner) if spec.backend == "pytorchjob" else build_trainjob(spec, owner)
