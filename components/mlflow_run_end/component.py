"""Component: the pipeline's exit step; closes the MLflow parent run FINISHED or FAILED."""

from kfp import dsl

from components.images import RUNTIME_IMAGE


@dsl.component(base_image=RUNTIME_IMAGE, install_kfp_package=False)
def mlflow_run_end(
    run_key: str,
    status: dsl.PipelineTaskFinalStatus,
    mlflow_tracking_uri: str,
    mlflow_experiment: str = "flashdraft",
) -> str:
    """Mark the parent run tagged `run_key` FINISHED or FAILED (with the error); returns its summary as JSON.

    Runs under `dsl.ExitHandler`, so it runs whether the pipeline succeeded or not and takes no input
    from other steps (a KFP rule): it finds the run by `run_key`.
    """
    import json

    from flashdraft.tracking.pipeline_run import end_pipeline_run

    failed = status.state != "SUCCEEDED"
    summary = end_pipeline_run(
        run_key,
        succeeded=not failed,
        error=(status.error_message or status.state) if failed else None,
        tracking_uri=mlflow_tracking_uri or None,
        experiment=mlflow_experiment,
    )
    return json.dumps({"state": status.state, **summary}, sort_keys=True)
