"""Supervised fine-tuning of the diffusion LM LLaDA2.1-mini with the MDLM objective, evaluated on held-out data.

    model (importer) ─────────────────┐
                                      ├─► train (objective mdlm) ─► dllm_evaluate   (inside an exit handler
    dataset (importer) ─► prepare-data ┘                                              that closes the MLflow
                                                                                      parent run)

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `components`, `pipelines`

from components.dllm_evaluate.component import dllm_evaluate  # noqa: E402
from components.prepare_data.component import prepare_data  # noqa: E402
from components.train.component import train  # noqa: E402
from pipelines.wiring import GPU, on_gpu_nodes, under_mlflow_parent_run, secured  # noqa: E402

# The local profile: a tiny random model on 2 CPU processes, a few steps; pass target, model_uri and
# dataset_uri (a folder with the model, a folder with train.jsonl).
PROFILES = {
    "local": {
        "recipe": "llada2_sft",
        "overrides": [
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


@dsl.pipeline(name="llada2-sft")
def llada2_sft(
    model_uri: str,
    dataset_uri: str,
    target: str = "inclusionAI/LLaDA2.1-mini",
    recipe: str = "llada2_sft",
    overrides: list = [],
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
        overrides: extra `key=value` config overrides, also given to the evaluation (same split).
        gpus: torchrun processes (GPUs) for training; evaluation uses one.
        eval_prompts, eval_num_samples, eval_gen_length, eval_steps: the generation sample.
        mlflow_tracking_uri, mlflow_experiment: MLflow server and experiment.
        node_selector, tolerations: scheduling of the GPU steps.
        hf_token_secret, mlflow_secret: Secrets with HF_TOKEN and MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN
            (optional: missing Secrets or keys are skipped).
    """
    with under_mlflow_parent_run(target=target, recipe=recipe, mlflow_tracking_uri=mlflow_tracking_uri,
                                 mlflow_experiment=mlflow_experiment, hf_token_secret=hf_token_secret,
                                 mlflow_secret=mlflow_secret) as (run_end, tracking):
        model = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False)
        data = dsl.importer(artifact_uri=dataset_uri, artifact_class=dsl.Dataset, reimport=False)

        prepared = prepare_data(target=target, recipe=recipe, dataset=data.output, overrides=overrides,
                                **tracking)
        secured(prepared, hf_token_secret, mlflow_secret)
        # The trained module is the LM itself: train starts from `model` (draft.init_from).
        trained = train(
            target=target, recipe=recipe, init_draft=model.output, dataset=data.output,
            prepared=prepared.outputs["prepared"], overrides=overrides, nproc_per_node=gpus, launcher="local",
            **tracking,
        )
        kubernetes.empty_dir_mount(trained, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
        on_gpu_nodes(secured(trained, hf_token_secret, mlflow_secret), gpus, node_selector, tolerations)

        evaluated = dllm_evaluate(
            model=trained.outputs["draft"], dataset=data.output, recipe=recipe, overrides=overrides,
            prompts=eval_prompts, num_samples=eval_num_samples, gen_length=eval_gen_length, steps=eval_steps,
            **tracking,
        ).set_caching_options(False)
        on_gpu_nodes(secured(evaluated, hf_token_secret, mlflow_secret), 1, node_selector, tolerations)
    return run_end.output
