"""Component: speculative decoding vs plain decoding on benchmarks (`flashdraft evaluate`)."""

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate(
    draft: dsl.Input[dsl.Model],
    target: str,
    report: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    benchmarks: str = "gsm8k,humaneval,chat",
    num_prompts: int = 0,
    max_new_tokens: int = 0,
    workspace: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
):
    """Measure tau, speedup and losslessness of `draft` on `target`; `report` holds report.json and plots.

    Args:
        benchmarks: comma-separated benchmark names or files.
        num_prompts, max_new_tokens: 0 keeps the command's defaults.
    """
    import json
    import os

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id, workspace)
    from flashdraft.cli import main

    os.makedirs(report.path, exist_ok=True)
    argv = ["evaluate", "--draft", draft.path, "--target", target, "--bench", *benchmarks.split(","),
            "--output", os.path.join(report.path, "report.json")]
    if num_prompts:
        argv += ["--num-prompts", str(num_prompts)]
    if max_new_tokens:
        argv += ["--max-new-tokens", str(max_new_tokens)]
    if main(argv) != 0:
        raise RuntimeError("flashdraft evaluate failed; its error is in the log above")
    results = json.load(open(os.path.join(report.path, "report.json")))["benchmarks"]
    for bench, result in results.items():
        values = {"tau": result["speculative"]["tau_pooled"], "speedup": result["speedup"],
                  "lossless": result["lossless"]}
        for key, value in values.items():
            if value is not None:
                metrics.log_metric(f"{bench}.{key}", value)
