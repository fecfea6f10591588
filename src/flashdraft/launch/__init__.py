"""Where `flashdraft train` runs, as `config.launch.backend` says: torchrun on this machine (`local`), a
PyTorchJob (Training Operator v1) or a TrainJob (Kubeflow Trainer v2) on Kubernetes.

`launch_training(config)` is the one entry point (the `launch` stage, the pipeline's train step): it
starts the trainer with the config's training sections, waits for it and returns where its output
is. For the Kubernetes backends it builds the job, creates it, streams rank 0's log, explains failures
and cleans up; `job_manifest(config)` builds the same manifest without a cluster.

    arguments.py   the launched trainer's arguments: the recipe and the config's differences from it
    local.py       torchrun here; a PyTorchJob pod's re-exec under torchrun
    job_spec.py    LaunchSpec: the launch section resolved and validated before any API call
    jobs.py        LaunchSpec -> PyTorchJob / TrainJob manifest
    kube.py        credentials, namespace, the pipeline pod as owner, API errors as messages
    watch.py       create a job, follow it (logs.py) and explain its failures (diagnose.py), clean up
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from flashdraft.config import Config
from flashdraft.launch.job_spec import job_spec
from flashdraft.launch.jobs import build_job
from flashdraft.launch.local import train_here
from flashdraft.launch.watch import JobResult, run_job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchResult:
    backend: str
    output_dir: str  # the trainer's: checkpoints/, export/, summary.json, metrics.jsonl
    seconds: float
    job: JobResult | None = None  # the Kubernetes job; None for local


def job_manifest(config: Config) -> dict:
    """The PyTorchJob / TrainJob that `launch_training(config)` would create (without the owner pod)."""
    return build_job(job_spec(config))


def launch_training(config: Config, *, api_client=None) -> LaunchResult:
    """Train with `config` where `config.launch` says; return when training succeeded.

    Raises a UserError with the causes otherwise (watch.JobFailedError, JobStuckError, JobTimeoutError).
    `api_client`: a kubernetes ApiClient (default: in-cluster or kubeconfig credentials). Inside a
    pipeline pod the job is owned by that pod, so deleting the run deletes the job.
    """
    start = time.monotonic()
    if config.launch.backend == "local":
        return LaunchResult("local", train_here(config), time.monotonic() - start)
    from kubernetes import client

    from flashdraft.launch import kube

    spec = job_spec(config)
    api = api_client or kube.api_client()
    owner = kube.pipeline_pod_owner(client.CoreV1Api(api), spec.namespace)
    if owner is not None:
        log.info("the job is owned by pipeline pod %s", owner["name"])
    log.info("checkpoints and the exported draft go to %s", spec.output_dir)
    launch = config.launch
    job = run_job(api, build_job(spec, owner), timeout_s=launch.timeout_s, cleanup=launch.cleanup, poll_s=launch.poll_s)
    return LaunchResult(launch.backend, spec.output_dir, job.seconds, job)
