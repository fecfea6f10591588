"""Component: a freshly initialised DFlash draft for a target (`flashdraft draft-init`)."""

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def draft_init(
    target: str,
    draft: dsl.Output[dsl.Model],
    recipe: str = "",
    overrides: list = [],
    workspace: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
):
    """Write a fresh draft (HF folder, z-lab DFlash format) shaped for `target`; reads only its config and tokenizer.

    Args:
        target: hub id, HF folder, .gguf file or `packaged:smollm2`.
        draft: the draft folder.
        recipe: recipe name or YAML whose `draft` section shapes the draft (empty: shapes from the target).
        overrides: `key=value` config overrides (any section; this step reads draft, target, tracking).
        workspace: the run's shared volume (`dsl.WORKSPACE_PATH_PLACEHOLDER`); the target cache lives there.
    """
    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id, workspace)
    from flashdraft.config import load_config, with_values
    from flashdraft.stages import draft_init as stage

    config = load_config(recipe or None, overrides)
    stage.run(with_values(config, {"target.name_or_path": target, "draft.output_dir": draft.path}))
