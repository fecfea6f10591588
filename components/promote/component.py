"""Component: register the trained draft in MLflow and move `champion` / `challenger` by policy."""

from typing import NamedTuple

from kfp import dsl

from components.images import RUNTIME_IMAGE


@dsl.component(base_image=RUNTIME_IMAGE, install_kfp_package=False)
def promote(
    draft: dsl.Input[dsl.Model],
    report: dsl.Input[dsl.Artifact],
    model_name: str,
    decision: dsl.Output[dsl.Markdown],
    mlflow_tracking_uri: str,
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
    primary_benchmark: str = "gsm8k",
    min_tau_gain: float = 0.05,
    min_lossless: float = 1.0,
    min_speedup: float = 1.0,
    target: str = "",
    target_revision: str = "",
    recipe: str = "",
    data: list = [],
) -> NamedTuple("Promotion", [("version", str), ("alias", str)]):
    """`flashdraft promote`: a model version with lineage tags, then `champion` if it beats the champion.

    Args:
        draft: the exported draft folder (from `train`).
        report: the evaluation folder holding report.json (from `evaluate`).
        model_name: registered model name.
        decision: Markdown with the decision and its reason.
        primary_benchmark, min_tau_gain, min_lossless, min_speedup: the promotion policy.
        target, target_revision, recipe, data (dataset specs): lineage tags on the version.
    """
    import os
    from collections import namedtuple
    from dataclasses import replace

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id)
    from flashdraft.config import load_config
    from flashdraft.stages import promote as stage

    values = {"promote.draft": draft.path, "promote.report": os.path.join(report.path, "report.json"),
              "promote.model_name": model_name, "promote.primary_benchmark": primary_benchmark,
              "promote.min_tau_gain": min_tau_gain, "promote.min_lossless": min_lossless,
              "promote.min_speedup": min_speedup,
              "target.revision": target_revision or None, **({"target.name_or_path": target} if target else {}),
              **({"data.train": data} if data else {})}
    # The recipe is lineage here (the policy comes in as inputs): its name is recorded, not loaded.
    result = stage.run(replace(load_config(None, values=values), recipe=recipe or None))
    with open(decision.path, "w") as f:
        f.write(f"## {result.model_name} version {result.version} -> `@{result.alias}`\n\n"
                f"{result.reason}\n\n| {result.primary_benchmark} | value |\n| --- | --- |\n"
                f"| tau | {result.tau:.3f} |\n| speedup | {result.speedup} |\n")
    return namedtuple("Promotion", ["version", "alias"])(result.version, result.alias)
