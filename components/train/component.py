"""Component: train the draft against the frozen target (`flashdraft train` under torchrun)."""

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def train(
    target: str,
    recipe: str,
    init_draft: dsl.Input[dsl.Model],
    dataset: dsl.Input[dsl.Dataset],
    draft: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    overrides: list = [],
    max_length: int = 0,
    num_anchors: int = 0,
    nproc_per_node: int = 1,
    launcher: str = "local",
    workspace: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
):
    """Train from `init_draft` on the warmed-up `dataset`; `draft` is the exported HF draft folder.

    Args:
        target: the target the dataset was generated with.
        recipe: training recipe (name or YAML).
        overrides: extra `key=value` config overrides (e.g. `train.max_steps=100`).
        max_length, num_anchors: tokens per sample and anchors per sample (0: the recipe's).
        nproc_per_node: torchrun processes (GPUs) on this node.
        launcher: `local`: torchrun in this step's pod.
        workspace: the run's shared volume (`dsl.WORKSPACE_PATH_PLACEHOLDER`): the target cache, and the
            checkpoints, so that a retried step resumes.
    """
    import json
    import os
    import shutil

    if launcher != "local":
        raise ValueError(f"launcher {launcher!r} is not available; use 'local'")
    for name, value in (("MLFLOW_TRACKING_URI", mlflow_tracking_uri), ("MLFLOW_EXPERIMENT_NAME", mlflow_experiment),
                        ("FLASHDRAFT_PARENT_RUN_ID", parent_run_id)):
        if value:
            os.environ[name] = value
    if workspace:  # the target cache on the run's shared volume: downloaded once, read by every step
        os.environ["FLASHDRAFT_CACHE"] = os.path.join(workspace, "cache")
        os.environ["HF_HOME"] = os.path.join(workspace, "cache", "hf")
    from flashdraft.torchrun import run_torchrun

    work_dir = os.path.join(workspace, "train") if workspace else draft.path + ".work"
    argv = ["train", "--config", recipe, f"target.name_or_path={target}", f"draft.init_from={init_draft.path}",
            f"data.train={os.path.join(dataset.path, 'train.jsonl')}", f"train.output_dir={work_dir}"]
    if max_length:
        argv.append(f"data.max_length={max_length}")
    if num_anchors:
        argv.append(f"strategy.num_anchors={num_anchors}")
    argv += overrides
    run_torchrun(argv, nproc_per_node)
    shutil.copytree(os.path.join(work_dir, "export"), draft.path)
    summary = json.load(open(os.path.join(work_dir, "summary.json")))
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, value)
