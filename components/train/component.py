"""Component: train the draft against the frozen target (`flashdraft train`, by torchrun or a Kubernetes job)."""

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
    job_target: str = "",
    job_image: str = "",
    job_nodes: int = 1,
    job_data_mount: str = "/data",
    job_data_pvc: str = "flashdraft-data",
    job_key: str = "",
    hf_token_secret: str = "",
    tolerations: list = [],
    node_selector: dict = {},
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
):
    """Train from `init_draft` on the warmed-up `dataset`; `draft` is the exported HF draft folder.

    Args:
        target: the materialised target folder (from `target_warmup`), for `local`.
        recipe: training recipe (name or YAML); empty: the config defaults.
        overrides: extra `key=value` config overrides (e.g. `train.max_steps=100`).
        max_length, num_anchors: tokens per sample and anchors per sample (0: the recipe's).
        nproc_per_node: torchrun processes; GPUs per node for the Kubernetes launchers.
        launcher: `local` (torchrun in this step's pod), `pytorchjob` or `trainjob` (a job on the cluster).
        workspace: the run's shared volume (`dsl.WORKSPACE_PATH_PLACEHOLDER`): the target cache, and for
            `local` the checkpoints, so that a retried step resumes.
        job_*: for the Kubernetes launchers: the target as the job loads it (hub id), image, nodes, and the
            RWX claim mounted at `job_data_mount` in this pod and in the job (inputs, checkpoints, hub cache);
            `job_key` names the run's folder there.
        hf_token_secret, tolerations, node_selector: passed on to the job.
    """
    import json
    import os
    import shutil

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id, workspace)
    from flashdraft.launch.local import run_training

    settings = [f"data.max_length={max_length}"] if max_length else []
    settings += [f"objective.num_anchors={num_anchors}"] if num_anchors else []
    job = None
    if launcher == "local":
        work_dir = os.path.join(workspace, "train") if workspace else draft.path + ".work"
        inputs = [f"target.name_or_path={target}", f"draft.init_from={init_draft.path}",
                  f"data.train={os.path.join(dataset.path, 'train.jsonl')}"]
    else:  # the job's pods see only the claim: stage the inputs there
        work_dir = os.path.join(job_data_mount, "runs", job_key)
        staged = os.path.join(work_dir, "inputs")
        shutil.copytree(init_draft.path, os.path.join(staged, "draft"), dirs_exist_ok=True)
        shutil.copy(os.path.join(dataset.path, "train.jsonl"), staged)
        inputs = [f"target.name_or_path={job_target or target}", f"draft.init_from={staged}/draft",
                  f"data.train={staged}/train.jsonl"]
        job = {"image": job_image, "nodes": job_nodes, "pvcs": [f"{job_data_pvc}:{job_data_mount}"],
               "env": {"HF_HOME": os.path.join(job_data_mount, "cache", "hf")},
               "secret_env": [f"HF_TOKEN={hf_token_secret}:HF_TOKEN"] if hf_token_secret else [],
               "tolerations": tolerations, "node_selector": node_selector}
    run_training(launcher=launcher, recipe=recipe, overrides=[*inputs, *settings, *overrides],
                 output_dir=work_dir, nproc_per_node=nproc_per_node, job=job)
    shutil.copytree(os.path.join(work_dir, "export"), draft.path)
    summary = json.load(open(os.path.join(work_dir, "summary.json")))
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, value)
