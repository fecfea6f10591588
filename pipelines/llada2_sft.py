"""Supervised fine-tuning of the diffusion LM LLaDA2.1-mini with the MDLM objective, evaluated on held-out data.

    model (importer) ──┐
                       ├─► train (strategy mdlm) ─► dllm_evaluate     (inside an exit handler that closes
    dataset (importer) ┘                                                the MLflow parent run)

No warmup step: an SFT set already holds its answers, and regenerating them would need the diffusion
LM's own sampler. The model and the data come in as artifacts: `model_uri` is the HF folder of the LM to
fine-tune (s3://, gs://, minio:// or an oci:// modelcar; a local folder for --local), `dataset_uri` a
folder with `train.jsonl` (OpenAI `messages` rows). `target` is where the trainer reads the config and
tokenizer (the hub id, or the same folder). Evaluation uses the rows training held out
(`data.eval_samples` of the recipe or the overrides).

`PROFILES["local"]` runs the same DAG on one small machine on a tiny random model:
`flashdraft run pipelines/llada2_sft.py --local target=DIR model_uri=DIR dataset_uri=DIR`.
Compile: `python pipelines/compile_all.py` (or `kfp dsl compile --py pipelines/llada2_sft.py ...`).
"""

import sys
from pathlib import Path

from kfp import dsl, kubernetes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `components`

from components.dllm_evaluate.component import dllm_evaluate  # noqa: E402
from components.mlflow_run_end.component import mlflow_run_end  # noqa: E402
from components.mlflow_run_start.component import mlflow_run_start  # noqa: E402
from components.train.component import train  # noqa: E402

GPU = "nvidia.com/gpu"

# The local profile: a tiny random model on 2 CPU processes, a few steps; pass target, model_uri and
# dataset_uri (a folder with the model, a folder with train.jsonl).
PROFILES = {
    "local": {
        "recipe": "llada2_sft",
        "train_overrides": [
            "target.dtype=float32", "target.trust_remote_code=false", "data.eval_samples=4", "data.max_length=64",
            "data.pad_to_multiple=1", "train.micro_batch_size=2", "train.grad_accum_steps=1", "train.max_steps=4",
            "train.lr=1.0e-3", "train.checkpoint_every=2", "train.log_every=1", "train.eval_every=0",
        ],
        "gpus": 2,
        "eval_num_samples": 1,
        "eval_gen_length": 8,
        "eval_steps": 4,
    },
}


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


def _on_gpu_nodes(task, gpus, node_selector, tolerations):
    task.set_accelerator_type(GPU).set_accelerator_limit(gpus)
    kubernetes.add_node_selector_json(task, node_selector)
    kubernetes.add_toleration_json(task, tolerations)
    return task


@dsl.pipeline(name="llada2-sft")
def llada2_sft(
    model_uri: str,
    dataset_uri: str,
    target: str = "inclusionAI/LLaDA2.1-mini",
    recipe: str = "llada2_sft",
    train_overrides: list = [],
    gpus: int = 8,
    eval_prompts: list = [],
    eval_num_samples: int = 2,
    eval_gen_length: int = 64,
    eval_steps: int = 32,
    mlflow_tracking_uri: str = "http://flashdraft-mlflow:5000",
    mlflow_experiment: str = "flashdraft",
    node_selector: dict = {},
    tolerations: list = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
    hf_token_secret: str = "flashdraft-hf-token",
    mlflow_secret: str = "flashdraft-mlflow-auth",
) -> str:
    """Fine-tune a diffusion LM with the MDLM objective and evaluate it; returns the MLflow parent run's
    summary as JSON.

    Args:
        model_uri: the LM to fine-tune, an HF folder as an artifact URI (local path for --local).
        dataset_uri: folder with train.jsonl (chat `messages` rows).
        target: config and tokenizer source for the trainer (hub id or folder).
        recipe: flashdraft recipe (llada2_sft: mask id 156895, lr 2e-5, seq 1024, global batch 32, 5 epochs).
        train_overrides: extra `key=value` config overrides, also given to the evaluation (same split).
        gpus: torchrun processes (GPUs) for training; evaluation uses one.
        eval_prompts, eval_num_samples, eval_gen_length, eval_steps: the generation sample.
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

        model = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False)
        data = dsl.importer(artifact_uri=dataset_uri, artifact_class=dsl.Dataset, reimport=False)

        # The trained module is the LM itself: train starts from `model` (draft.init_from).
        trained = train(
            target=target, recipe=recipe, init_draft=model.output, dataset=data.output, overrides=train_overrides,
            nproc_per_node=gpus, launcher="local", **tracking,
        )
        kubernetes.empty_dir_mount(trained, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
        _on_gpu_nodes(_with_secrets(trained, hf_token_secret, mlflow_secret), gpus, node_selector, tolerations)

        evaluated = dllm_evaluate(
            model=trained.outputs["draft"], dataset=data.output, recipe=recipe, overrides=train_overrides,
            prompts=eval_prompts, num_samples=eval_num_samples, gen_length=eval_gen_length, steps=eval_steps,
            **tracking,
        ).set_caching_options(False)
        _on_gpu_nodes(_with_secrets(evaluated, hf_token_secret, mlflow_secret), 1, node_selector, tolerations)
    return run_end.output
