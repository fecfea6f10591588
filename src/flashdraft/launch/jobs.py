"""Job manifests: a `LaunchSpec` -> a PyTorchJob (kubeflow.org/v1) or a TrainJob (trainer.kubeflow.org/v1alpha1).

Both run the same container command: plain `torchrun` configured only by the PET_* variables the
operators inject (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, and
PET_RDZV_* for elastic jobs), then `flashdraft train`. The trainer resumes from its output dir, which
lives on the shared volume, so a restarted pod or job continues from the latest checkpoint.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from flashdraft.launch.job_spec import SCRATCH, LaunchSpec

PYTORCHJOB_API = ("kubeflow.org", "v1", "pytorchjobs")
TRAINJOB_API = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
PYTORCH_CONTAINER = "pytorch"  # the Training Operator finds the training container by this name
TRAINJOB_CONTAINER = "node"  # the container of the runtime's "node" replicated job
TRAINJOB_REPLICATED_JOB = "node"
PYTORCHJOB_PORT = 23456  # the operator's default master port
PATCH_MANAGER = "flashdraft.launch"
APP_LABELS = {"app.kubernetes.io/name": "flashdraft", "app.kubernetes.io/component": "train"}
ELASTIC_MAX_RESTARTS = 3  # rendezvous restarts of an elastic PyTorchJob
IMAGE_USER = 1000  # the user of the project images (images/*/Dockerfile)


def training_command(spec: LaunchSpec) -> list[str]:
    # The image's own torchrun and console script (not this machine's interpreter, as in local.py), which
    # takes the rendezvous from the operator's PET_* variables; --no-python: run `flashdraft` itself.
    return ["torchrun", "--no-python", "flashdraft", *spec.command_args]


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
    if spec.launch.gpus_per_node > 0:
        limits[spec.launch.gpu_resource] = str(spec.launch.gpus_per_node)
    if spec.launch.cpu:
        requests["cpu"] = spec.launch.cpu
    if spec.launch.memory:
        requests["memory"] = limits["memory"] = spec.launch.memory
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
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.launch.shm_size}},
    ]
    mounts = [{"name": "scratch", "mountPath": SCRATCH}, {"name": "dshm", "mountPath": "/dev/shm"}]
    for i, pvc in enumerate(spec.pvcs):
        volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": pvc.claim}})
        mount = {"name": f"pvc-{i}", "mountPath": pvc.mount_path}
        if pvc.sub_path:
            mount["subPath"] = pvc.sub_path
        mounts.append(mount)
    return volumes, mounts


# The Pod Security Standards' "restricted" profile, for the pod and for its container.
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": IMAGE_USER, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod_scheduling(spec: LaunchSpec) -> dict:
    out: dict[str, Any] = {"securityContext": copy.deepcopy(POD_SECURITY)}
    if spec.launch.tolerations:
        out["tolerations"] = [dict(t) for t in spec.launch.tolerations]
    if spec.launch.node_selector:
        out["nodeSelector"] = dict(spec.launch.node_selector)
    if spec.launch.service_account:
        out["serviceAccountName"] = spec.launch.service_account
    if spec.launch.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in spec.launch.image_pull_secrets]
    return out


def _job(api_version: str, kind: str, spec: LaunchSpec, owner: dict | None, body: dict) -> dict:
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "labels": dict(APP_LABELS)}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": body}


def build_pytorchjob(spec: LaunchSpec, owner: dict | None = None) -> dict:
    """A PyTorchJob: one Master and `nodes - 1` Workers, each one node with `procs` processes."""
    volumes, mounts = _volumes(spec)
    container = {
        "name": PYTORCH_CONTAINER,
        "image": spec.image,
        "command": training_command(spec),
        "env": _env(spec),
        "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}],
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    template = {
        "metadata": {"labels": dict(APP_LABELS)},
        "spec": {"containers": [container], "volumes": volumes, **_pod_scheduling(spec)},
    }
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if spec.launch.nodes > 1:
        replicas["Worker"] = {
            "replicas": spec.launch.nodes - 1,
            "restartPolicy": "OnFailure",
            "template": copy.deepcopy(template),
        }
    # Pods are kept after the job ends so failed ones can be inspected; deleting the job removes them.
    # The cluster enforces the launcher's timeout too, so the job stops even if the launcher dies first.
    run_policy = {
        "backoffLimit": spec.launch.backoff_limit,
        "cleanPodPolicy": "None",
        "activeDeadlineSeconds": math.ceil(spec.launch.timeout_s),
    }
    job_spec: dict[str, Any] = {
        "runPolicy": run_policy,
        "nprocPerNode": str(spec.launch.procs),
        "pytorchReplicaSpecs": replicas,
    }
    if spec.launch.elastic_min_nodes is not None:
        job_spec["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "minReplicas": spec.launch.elastic_min_nodes,
            "maxReplicas": spec.launch.nodes,
            "maxRestarts": ELASTIC_MAX_RESTARTS,
        }
    return _job("kubeflow.org/v1", "PyTorchJob", spec, owner, job_spec)


def build_trainjob(spec: LaunchSpec, owner: dict | None = None) -> dict:
    """A TrainJob on our ClusterTrainingRuntime; pod-level settings go in as a runtime patch."""
    volumes, mounts = _volumes(spec)
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": training_command(spec),
        "env": _env(spec),
        "numNodes": spec.launch.nodes,
        "numProcPerNode": spec.launch.procs,
    }
    resources = _resources(spec)
    if resources:
        trainer["resourcesPerNode"] = resources
    pod_patch = {
        "containers": [
            {
                "name": TRAINJOB_CONTAINER,
                "volumeMounts": mounts,
                "securityContext": copy.deepcopy(CONTAINER_SECURITY),
            }
        ],
        "volumes": volumes,
        **_pod_scheduling(spec),
    }
    job_spec: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": spec.launch.runtime
        },
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
        "activeDeadlineSeconds": math.ceil(spec.launch.timeout_s),
    }
    return _job("trainer.kubeflow.org/v1alpha1", "TrainJob", spec, owner, job_spec)


def build_job(spec: LaunchSpec, owner: dict | None = None) -> dict:
    return build_pytorchjob(spec, owner) if spec.launch.backend == "pytorchjob" else build_trainjob(spec, owner)
