"""The LLaDA2 SFT pipeline: compiles to the checked-in YAML with the intended DAG, and runs end to end with
kfp's local runner on a tiny random bidirectional model against a real `mlflow server`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kfp")
pytest.importorskip("mlflow")

from kfp import compiler  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from flashdraft import cli  # noqa: E402
from flashdraft.stages import run as run_stage  # noqa: E402
from mlflow_helpers import parent_runs  # noqa: E402
from diffusion_helpers import MASK_ID, save_model  # noqa: E402
from train_helpers import alphabet_chats  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipelines" / "llada2_sft.py"
sys.path.insert(0, str(ROOT))

from pipelines.compile_all import same_spec  # noqa: E402


def test_compiled_yaml_is_current_and_wired(tmp_path):
    from components.dllm_evaluate.component import dllm_evaluate

    _, pipeline = run_stage.load_pipeline(PIPELINE)
    fresh = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(pipeline, str(fresh))
    assert same_spec(PIPELINE.with_suffix(".yaml"), fresh), "run python pipelines/compile_all.py"
    component = tmp_path / "component.yaml"
    compiler.Compiler().compile(dllm_evaluate, str(component))
    assert same_spec(ROOT / "components" / "dllm_evaluate" / "component.yaml", component)

    spec, platform = yaml.safe_load_all(fresh.read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["recipe"]["defaultValue"] == "llada2_sft"
    assert params["target"]["defaultValue"] == "inclusionAI/LLaDA2.1-mini"
    assert "defaultValue" not in params["model_uri"] and "defaultValue" not in params["dataset_uri"]
    tasks = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert set(tasks["train"]["dependentTasks"]) >= {"importer", "importer-2", "mlflow-run-start"}
    assert "train" in tasks["dllm-evaluate"]["dependentTasks"]
    assert tasks["dllm-evaluate"]["cachingOptions"] == {}  # never cached
    containers = spec["deploymentSpec"]["executors"]
    assert containers["exec-train"]["container"]["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-train"]["emptyDirMounts"][0]["mountPath"] == "/dev/shm"


def test_recipe_holds_the_llada2_settings():
    from flashdraft.config import load_config

    config = load_config("llada2_sft")
    assert config.target.name_or_path == "inclusionAI/LLaDA2.1-mini" and config.target.trust_remote_code
    assert (config.objective.name, config.objective.mask_token_id) == ("mdlm", 156895)
    assert config.train.lr == 2e-5 and config.data.max_length == 1024 and config.train.epochs == 5
    assert config.train.micro_batch_size * config.train.grad_accum_steps * 8 == 32  # global batch on 8 GPUs


@pytest.mark.slow
def test_runs_locally_end_to_end_with_mlflow(tmp_path, monkeypatch, mlflow_server, capfd):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.delenv("FLASHDRAFT_PARENT_RUN_ID", raising=False)
    model = save_model(tmp_path / "model", bidirectional=True)
    (tmp_path / "data").mkdir()
    alphabet_chats(tmp_path / "data" / "train.jsonl", rows=16, length=24)
    module, _ = run_stage.load_pipeline(PIPELINE)
    overrides = [*module.PROFILES["local"]["overrides"], f"objective.mask_token_id={MASK_ID}"]
    experiment = "llada2-local"

    code = cli.main(["run", str(PIPELINE), "--local", f"target={model}", f"model_uri={model}",
                     f"dataset_uri={tmp_path / 'data'}", f"overrides={json.dumps(overrides)}",
                     f"mlflow_experiment={experiment}"])
    out, err = capfd.readouterr()
    try:
        assert code == 0
        check_run(mlflow_server, experiment)
    except (AssertionError, KeyError, ValueError) as failure:
        raise AssertionError(f"{failure!r}\n--- pipeline log (tail) ---\n{(out + err)[-6000:]}") from failure


def check_run(tracking_uri: str, experiment: str) -> None:
    (parent,) = parent_runs(tracking_uri, experiment)
    assert parent.info.status == "FINISHED"
    client = MlflowClient(tracking_uri)
    steps = {run.info.run_name: run for run in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    assert {"train", "dllm_evaluate"} <= set(steps), steps.keys()
    train, evaluation = steps["train"].data.metrics, steps["dllm_evaluate"].data.metrics
    assert train["supervised_tokens"] > 0 and 0 < train["mask_rate"] < 1
    # The evaluation step measures the split training held out, corrupted the same way: same numbers
    # as the trainer's own final evaluation, from the exported model.
    assert evaluation["eval_supervised_tokens"] == train["final_eval_supervised_tokens"]
    assert evaluation["eval_mask_rate"] == train["final_eval_mask_rate"]
    assert evaluation["eval_loss"] == pytest.approx(train["final_eval_loss"], rel=1e-4)
    # Two processes vs one reduce in another order: allow one argmax flip among the masked tokens.
    masked = evaluation["eval_mask_rate"] * evaluation["eval_supervised_tokens"]
    assert abs(evaluation["eval_masked_accuracy"] - train["final_eval_masked_accuracy"]) <= 1 / masked + 1e-9
    (report,) = Path("flashdraft-runs").rglob("report.json")
    samples = json.loads(report.read_text())["samples"]
    assert samples and samples[0]["prompt"].endswith("assistant\n"), samples
