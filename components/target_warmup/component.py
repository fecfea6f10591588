"""Component: materialise and check the target, regenerate the training responses with it (`flashdraft warmup`)."""

from typing import NamedTuple

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def target_warmup(
    target: str,
    prompts: list,
    dataset: dsl.Output[dsl.Dataset],
    recipe: str = "",
    overrides: list = [],
    workspace: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
) -> NamedTuple("Warmup", [("target_path", str), ("target_revision", str)]):
    """Regenerate the assistant turns of `prompts` with `target`; the dataset folder holds train.jsonl,
    manifest.json (the materialised target and its revision), summary.json, stats.json and config.yaml.

    Returns the materialised target's folder (on the workspace, for the later steps) and its revision.

    Args:
        target: hub id, HF folder, .gguf file or `packaged:smollm2`.
        prompts: dataset specs (`flashdraft.data.sources` syntax), one per list item.
        recipe: recipe name or YAML; its `warmup` section sets lengths, sampling, turns and the backend.
        overrides: `key=value` config overrides (e.g. `warmup.num_samples=1000`, `warmup.max_new_tokens=2048`).
        workspace: the run's shared volume (`dsl.WORKSPACE_PATH_PLACEHOLDER`); the target cache lives there.
    """
    from collections import namedtuple

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id, workspace)
    from flashdraft.config import load_config, with_values
    from flashdraft.stages import warmup as stage

    values = {"target.name_or_path": target, "warmup.prompts": prompts, "warmup.output_dir": dataset.path}
    result = stage.run(with_values(load_config(recipe or None, overrides), values))
    return namedtuple("Warmup", ["target_path", "target_revision"])(str(result.target_path), result.revision or "")
