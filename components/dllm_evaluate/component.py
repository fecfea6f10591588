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
    import json
    import os

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id)
    from flashdraft.cli import main

    os.makedirs(report.path, exist_ok=True)
    output = os.path.join(report.path, "report.json")
    argv = ["dllm-evaluate", "--model", model.path, "--config", recipe, "--output", output,
            "--num-samples", str(num_samples), "--gen-length", str(gen_length), "--steps", str(steps)]
    for prompt in prompts:
        argv += ["--prompt", prompt]
    argv += [*overrides, f"data.train={os.path.join(dataset.path, 'train.jsonl')}"]
    if main(argv) != 0:
        raise RuntimeError("flashdraft dllm-evaluate failed; its error is in the log above")
    for key, value in json.load(open(output))["metrics"].items():
        metrics.log_metric(key, value)
