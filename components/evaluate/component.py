"""Component: speculative decoding vs plain decoding on benchmarks (`flashdraft evaluate`)."""

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate(
    draft: dsl.Input[dsl.Model],
    target: str,
    report: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    recipe: str = "",
    overrides: list = [],
    workspace: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
):
    """Measure tau, speedup and losslessness of `draft` on `target`; `report` holds report.json and plots.

    Args:
        recipe: recipe name or YAML; its `evaluate` section sets the benchmarks and decoding settings.
        overrides: `key=value` config overrides (e.g. `evaluate.benchmarks=[gsm8k, chat]`, `evaluate.num_prompts=80`).
    """
    import os

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id, workspace)
    from flashdraft.config import load_config, with_values
    from flashdraft.stages import evaluate as stage

    values = {"evaluate.draft": draft.path, "target.name_or_path": target,
              "evaluate.output": os.path.join(report.path, "report.json")}
    results = stage.run(with_values(load_config(recipe or None, overrides), values))
    for name, value in stage.headline_metrics(results).items():
        metrics.log_metric(name, value)
