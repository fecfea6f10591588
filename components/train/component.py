"""Component: train the draft against the frozen target (`flashdraft train`, by torchrun or a Kubernetes job)."""

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def train(
    target: str,
    recipe: str,
    init_draft: dsl.Input[dsl.Model],
    dataset: dsl.Input[dsl.Dataset],
    prepared: dsl.Input[dsl.Dataset],
    draft: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    overrides: list = [],
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
    """Train from `init_draft` on the warmed-up `dataset`, tokenised in `prepared`; `draft` is the exported
    HF draft folder.

    Args:
        target: the materialised target folder (from `target_warmup`), for `local`.
        recipe: training recipe (name or YAML); empty: the config defaults.
        overrides: `key=value` config overrides (e.g. `train.max_steps=100`, `data.max_length=2048`).
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
    from flashdraft.config import load_config, with_values
    from flashdraft.launch import launch_training

    values = {"launch.backend": launcher, "launch.gpus_per_node": nproc_per_node}
    if launcher == "local":
        values.update({"launch.output_dir": os.path.join(workspace, "train") if workspace else draft.path + ".work",
                       "target.name_or_path": target, "draft.init_from": init_draft.path,
                       "data.train": os.path.join(dataset.path, "train.jsonl"), "data.cache_dir": prepared.path})
    else:  # the job's pods see only the claim: stage the inputs there
        staged = os.path.join(job_data_mount, "runs", job_key, "inputs")
        shutil.copytree(init_draft.path, os.path.join(staged, "draft"), dirs_exist_ok=True)
        shutil.copytree(prepared.path, os.path.join(staged, "prepared"), dirs_exist_ok=True)
        shutil.copy2(os.path.join(dataset.path, "train.jsonl"), staged)
        values.update({
            "target.name_or_path": job_target or target, "draft.init_from": os.path.join(staged, "draft"),
            "data.train": os.path.join(staged, "train.jsonl"), "data.cache_dir": os.path.join(staged, "prepared"),
            "launch.output_dir": os.path.join(job_data_mount, "runs", job_key), "launch.image": job_image,
            "launch.nodes": job_nodes, "launch.pvcs": [f"{job_data_pvc}:{job_data_mount}"],
            "launch.env": {"HF_HOME": os.path.join(job_data_mount, "cache", "hf")},
            "launch.secret_env": [f"HF_TOKEN={hf_token_secret}:HF_TOKEN"] if hf_token_secret else [],
            "launch.tolerations": tolerations, "launch.node_selector": node_selector,
        })
    result = launch_training(with_values(load_config(recipe or None, overrides), values))
    shutil.copytree(os.path.join(result.output_dir, "export"), draft.path)
    # The trainer ran in other processes (torchrun or the job's pods): its summary is the file it wrote.
    with open(os.path.join(result.output_dir, "summary.json")) as handle:
        summary = json.load(handle)
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, value)
