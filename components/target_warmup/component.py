"""Component: materialise and check the target, regenerate the training responses with it (`flashdraft warmup`)."""

from typing import NamedTuple

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def target_warmup(
    target: str,
    prompts: list,
    dataset: dsl.Output[dsl.Dataset],
    num_samples: int = 0,
    max_new_tokens: int = 0,
    workspace: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
) -> NamedTuple("Warmup", [("target_path", str), ("target_revision", str)]):
    """Regenerate the assistant turns of `prompts` with `target`; the dataset folder holds train.jsonl,
    manifest.json (the materialised target and its revision), summary.json and stats.json.

    Returns the materialised target's folder (on the workspace, for the later steps) and its revision.

    Args:
        target: hub id, HF folder, .gguf file or `packaged:smollm2`.
        prompts: dataset specs (`flashdraft.data.sources` syntax), one per list item.
        num_samples, max_new_tokens: 0 keeps the command's defaults.
        workspace: the run's shared volume (`dsl.WORKSPACE_PATH_PLACEHOLDER`); the target cache lives there.
    """
    import json
    import os
    from collections import namedtuple

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id, workspace)
    from flashdraft.cli import main

    argv = ["warmup", "--target", target, "--output", dataset.path, "--prompts", *prompts]
    if num_samples:
        argv += ["--num-samples", str(num_samples)]
    if max_new_tokens:
        argv += ["--max-new-tokens", str(max_new_tokens)]
    if main(argv) != 0:
        raise RuntimeError("flashdraft warmup failed; its error is in the log above")
    manifest = json.load(open(os.path.join(dataset.path, "manifest.json")))
    revision = manifest["target"].get("revision") or ""
    return namedtuple("Warmup", ["target_path", "target_revision"])(manifest["target_path"], revision)
