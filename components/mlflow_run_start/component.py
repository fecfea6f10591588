"""Component: open the pipeline run's MLflow parent run; every later step nests its own run under it."""

from kfp import dsl

from components.images import RUNTIME_IMAGE


@dsl.component(base_image=RUNTIME_IMAGE, install_kfp_package=False)
def mlflow_run_start(
    run_key: str,
    run_name: str,
    mlflow_tracking_uri: str,
    mlflow_experiment: str = "flashdraft",
    target: str = "",
    recipe: str = "",
) -> str:
    """Open (or, when retried, find) the MLflow parent run tagged with `run_key`; returns its run id.

    Args:
        run_key: the KFP run id (`dsl.PIPELINE_JOB_ID_PLACEHOLDER`); `mlflow_run_end` finds the run by it.
        run_name: the MLflow run name (the KFP run name).
        mlflow_tracking_uri: where MLflow is; empty: `MLFLOW_TRACKING_URI` from the environment.
        mlflow_experiment: MLflow experiment for the parent and step runs.
        target, recipe: recorded as the parent run's params.
    """
    from flashdraft.tracking.pipeline_run import start_pipeline_run

    return start_pipeline_run(
        run_key,
        name=run_name,
        tags={"kfp.run_id": run_key, "kfp.run_name": run_name},
        params={"target": target, "recipe": recipe},
        tracking_uri=mlflow_tracking_uri or None,
        experiment=mlflow_experiment,
    )
