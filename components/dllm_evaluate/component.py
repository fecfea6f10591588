"""Component: evaluate a trained diffusion LM (`flashdraft dllm-evaluate`): held-out masked-token loss and
accuracy, and a short generation sample."""

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def dllm_evaluate(
    model: dsl.Input[dsl.Model],
    dataset: dsl.Input[dsl.Dataset],
    recipe: str,
    report: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    overrides: list = [],
    prompts: list = [],
    num_samples: int = 2,
    gen_length: int = 32,
    steps: int = 16,
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
):
    """Measure `model` on the held-out split of `dataset` (the split training held out); `report` holds
    report.json (metrics and the generated samples).

    Args:
        recipe, overrides: the training recipe and overrides (the data split and mask token must match).
        prompts: generation prompts; empty: the first `num_samples` held-out conversations.
        gen_length, steps: tokens per generated answer and unmasking passes.
    """
    import os

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id)
    from flashdraft.config import load_config, with_values
    from flashdraft.stages import dllm_evaluate as stage

    values = {"target.name_or_path": model.path, "evaluate.output": os.path.join(report.path, "report.json"),
              "evaluate.prompts": prompts, "evaluate.dllm_samples": num_samples, "evaluate.dllm_gen_length": gen_length,
              "evaluate.dllm_steps": steps, "data.train": os.path.join(dataset.path, "train.jsonl")}
    results = stage.run(with_values(load_config(recipe or None, overrides), values))
    for key, value in results["metrics"].items():
        metrics.log_metric(key, value)
