"""Where training runs on Kubernetes: a PyTorchJob (Training Operator v1) or a TrainJob (Kubeflow Trainer v2).

`launch_training(...)` is what the pipeline's train step and `flashdraft launch` call: it builds the
job, creates it, streams rank 0's log, explains failures and cleans up. `job_manifest(...)` builds
the same manifest without a cluster (`flashdraft launch --dry-run`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import uuid
from collections.abc import Sequence

from flashdraft.errors import UserError
from flashdraft.launch.jobs import build_job, check_train_arguments, train_arguments
from flashdraft.launch.job_spec import LaunchSpec, PVCMount, SecretEnv
from flashdraft.launch.watch import (
    JobFailedError,
    JobResult,
    JobStuckError,
    JobTimeoutError,
    run_job,
)

__all__ = [
    "JobFailedError",
    "JobResult",
    "JobStuckError",
    "JobTimeoutError",
    "LaunchSpec",
    "PVCMount",
    "SecretEnv",
    "job_manifest",
    "launch_training",
    "make_spec",
]
log = logging.getLogger(__name__)

# Tracking settings of the launching step that the job's trainer needs to log into the same MLflow
# run tree (FLASHDRAFT_PARENT_RUN_ID is tracking.py's parent-run variable).
PROPAGATED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "FLASHDRAFT_PARENT_RUN_ID")
_SPEC_FIELDS = {f.name for f in dataclasses.fields(LaunchSpec)}


def make_spec(
    *,
    launcher: str,
    image: str,
    recipe: str | None = None,
    overrides: Sequence[str] = (),
    nodes: int = 1,
    gpus_per_node: int = 1,
    pvcs: Sequence[str | PVCMount] = (),
    secret_env: Sequence[str | SecretEnv] = (),
    namespace: str | None = None,
    name: str | None = None,
    **options,
) -> LaunchSpec:
    """A validated LaunchSpec; `options` are further LaunchSpec fields (env, tolerations, node_selector, ...)."""
    unknown = sorted(set(options) - _SPEC_FIELDS)
    if unknown:
        raise UserError(f"unknown launch option(s) {', '.join(unknown)}; valid: {', '.join(sorted(_SPEC_FIELDS))}")
    if namespace is None:
        from flashdraft.launch.kube import default_namespace

        namespace = default_namespace()
    env = {k: os.environ[k] for k in PROPAGATED_ENV if os.environ.get(k)}
    env.update(options.pop("env", {}))
    spec = LaunchSpec(
        backend=launcher,
        image=image,
        name=name or f"flashdraft-train-{uuid.uuid4().hex[:8]}",
        namespace=namespace,
        recipe=recipe,
        overrides=list(overrides),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        pvcs=[p if isinstance(p, PVCMount) else PVCMount.parse(p) for p in pvcs],
        secret_env=[s if isinstance(s, SecretEnv) else SecretEnv.parse(s) for s in secret_env],
        env=env,
        **options,
    )
    spec.validate()
    check_train_arguments(train_arguments(spec.recipe, spec.overrides, spec.resolved_output_dir))
    return spec


def job_manifest(spec: LaunchSpec, owner: dict | None = None) -> dict:
    return build_job(spec, owner)


def launch_training(
    *,
    launcher: str = "pytorchjob",
    timeout_s: float = 7 * 24 * 3600,
    cleanup: str = "on-success",
    poll_s: float = 10.0,
    api_client=None,
    **spec_args,
) -> JobResult:
    """Run one training job on the cluster and return when it succeeded; raise with the causes otherwise.

    spec_args go to `make_spec` (image, recipe, overrides, nodes, gpus_per_node, pvcs, secret_env,
    namespace, name, output_dir, env, tolerations, node_selector, ...). Inside a pipeline pod the job is
    owned by that pod, so deleting the run deletes the job.
    """
    from kubernetes import client

    from flashdraft.launch import kube

    # The cluster enforces the same limit, so the job stops even if this launcher dies first.
    spec_args.setdefault("active_deadline_s", math.ceil(timeout_s))
    spec = make_spec(launcher=launcher, **spec_args)
    api = api_client or kube.api_client()
    owner = kube.pipeline_pod_owner(client.CoreV1Api(api), spec.namespace)
    if owner is not None:
        log.info("the job is owned by pipeline pod %s", owner["name"])
    manifest = build_job(spec, owner)
    log.info("checkpoints and the exported draft go to %s (on PVC %s)", spec.resolved_output_dir, spec.pvcs[0].claim)
    result = run_job(api, manifest, timeout_s=timeout_s, cleanup=cleanup, poll_s=poll_s)
    return dataclasses.replace(result, output_dir=spec.resolved_output_dir)
