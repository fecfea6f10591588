"""Kubernetes and MLflow wiring the pipelines share: Secrets as env, GPU scheduling, non-root pods, the
parent run."""

import contextlib
from collections.abc import Iterator

from kfp import dsl, kubernetes

from components.mlflow_run_end.component import mlflow_run_end
from components.mlflow_run_start.component import mlflow_run_start

GPU = "nvidia.com/gpu"


# The project images' user (images/*/Dockerfile): pipeline pods run as it, never as root.
IMAGE_USER = 1000


def secured(task, hf_token_secret, mlflow_secret):
    """HF_TOKEN and MLflow credentials from Secrets, if they exist (missing Secrets or keys are skipped); and
    the pod runs as the images' non-root user (KFP's compiler adds the rest of the "restricted" profile:
    no privilege escalation, all capabilities dropped, the RuntimeDefault seccomp profile)."""
    kubernetes.set_security_context(task, run_as_user=IMAGE_USER, run_as_non_root=True)
    kubernetes.use_secret_as_env(task, secret_name=hf_token_secret, secret_key_to_env={"HF_TOKEN": "HF_TOKEN"},
                                 optional=True)
    kubernetes.use_secret_as_env(
        task,
        secret_name=mlflow_secret,
        secret_key_to_env={"MLFLOW_TRACKING_USERNAME": "MLFLOW_TRACKING_USERNAME",
                           "MLFLOW_TRACKING_PASSWORD": "MLFLOW_TRACKING_PASSWORD",
                           "MLFLOW_TRACKING_TOKEN": "MLFLOW_TRACKING_TOKEN"},
        optional=True,
    )
    return task


def on_gpu_nodes(task, gpus, node_selector, tolerations):
    task.set_accelerator_type(GPU).set_accelerator_limit(gpus)
    kubernetes.add_node_selector_json(task, node_selector)
    kubernetes.add_toleration_json(task, tolerations)
    return task


@contextlib.contextmanager
def under_mlflow_parent_run(
    *, target, recipe, mlflow_tracking_uri, mlflow_experiment, hf_token_secret, mlflow_secret
) -> Iterator[tuple]:
    """The steps of the `with` block run inside an exit handler: a first step opens the MLflow parent
    run, the exit step closes it FINISHED or FAILED whatever happened.

    Yields the exit task (the pipeline returns its output, the run's summary) and the tracking arguments
    every tracked step takes, so that its run nests under the parent.
    """
    run_end = mlflow_run_end(
        run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER, mlflow_tracking_uri=mlflow_tracking_uri,
        mlflow_experiment=mlflow_experiment,
    ).set_caching_options(False)
    secured(run_end, hf_token_secret, mlflow_secret)
    with dsl.ExitHandler(run_end, name="flashdraft"):
        run_start = mlflow_run_start(
            run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER, run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
            mlflow_tracking_uri=mlflow_tracking_uri, mlflow_experiment=mlflow_experiment, target=target,
            recipe=recipe,
        ).set_caching_options(False)
        secured(run_start, hf_token_secret, mlflow_secret)
        yield run_end, dict(mlflow_tracking_uri=mlflow_tracking_uri, mlflow_experiment=mlflow_experiment,
                            parent_run_id=run_start.output)
