"""The pipeline's DAG run end to end by kfp's local runner against a real `mlflow server` on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("kfp")
pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from flashdraft import cli  # noqa: E402
from mlflow_helpers import parent_runs  # noqa: E402
from tiny_models import save_tiny_draft  # noqa: E402
from flashdraft.config import PromoteConfig  # noqa: E402
from flashdraft.tracking.promotion import promote_draft  # noqa: E402
from flashdraft.tracking.runs import step_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipelines" / "dflash_nano30b.py"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, mlflow_server):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.delenv("FLASHDRAFT_PARENT_RUN_ID", raising=False)
    return tmp_path


@pytest.mark.slow
def test_a_failing_step_fails_the_pipeline_marks_the_run_failed_and_moves_no_alias(
    in_tmp, mlflow_server, tiny_target, capfd
):
    name, experiment = "dflash-failing", "pipeline-failure"
    # A champion exists before the run: a failed run must leave it alone.
    draft = save_tiny_draft(in_tmp / "champion-draft")
    report = {"benchmarks": {"gsm8k": {"speculative": {"tau_pooled": 2.0}, "speedup": 1.5, "lossless": 1.0}}}
    with step_run("promote", tracking_uri=mlflow_server) as run:
        promote_draft(run, PromoteConfig(draft=str(draft), model_name=name), report, lineage={})
    client = MlflowClient(mlflow_server)
    before = client.get_registered_model(name).aliases

    # Draft-init, warmup and prepare-data succeed; training fails (FlexAttention on a machine without CUDA).
    items = [i for i in TINY_RUN if not i.startswith("overrides=")]
    broken = [*TINY, "objective.attention=flex"]
    code = cli.main(["run", str(PIPELINE), "--local", f"target={tiny_target('qwen3')}", f"model_name={name}",
                     f"mlflow_experiment={experiment}", f"overrides={json.dumps(broken)}",
                     *items])
    out, err = capfd.readouterr()
    assert code == 1
    assert "pipeline failed" in err and "Inner task failed" in err and "train" in err
    assert "objective.attention=flex needs a CUDA device" in out + err  # the step's own error, streamed
    (run,) = parent_runs(mlflow_server, experiment)
    assert run.info.status == "FAILED"
    assert "failed" in run.data.tags["flashdraft.error"]
    children = client.search_runs([run.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    assert "warmup" in {c.data.tags.get("flashdraft.step") for c in children}  # it got that far
    assert client.get_registered_model(name).aliases == before
    assert len(client.search_model_versions(f"name='{name}'")) == 1


TINY = ["warmup.num_samples=8", "warmup.max_new_tokens=40", "data.max_length=128", "objective.num_anchors=4",
        "train.max_steps=3", "evaluate.benchmarks=[gsm8k, chat]", "evaluate.num_prompts=2", "evaluate.max_new_tokens=16"]
TINY_RUN = ["recipe=", "prompts=[packaged:chitchat]", "gpus=2", f"overrides={json.dumps(TINY)}"]


@pytest.mark.slow
def test_the_local_dag_trains_evaluates_registers_and_promotes(in_tmp, mlflow_server, tiny_target, capfd):
    name, experiment = "dflash-tiny", "pipeline-e2e"
    target = str(tiny_target("qwen3"))
    # A speedup measured on a shared CPU is timing: a 3-step draft once came out faster than plain decoding
    # while other processes slowed the plain loop. A gate no 16-token block can pass makes the decision below
    # the policy's, whatever the timing.
    code = cli.main(["run", str(PIPELINE), "--local", f"target={target}", f"model_name={name}",
                     f"mlflow_experiment={experiment}", "min_speedup=100", *TINY_RUN])
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-4000:]
    # Every step ran, in this order (draft-init and warmup have no edge between them).
    order = [line.split("'")[1] for line in (out + err).splitlines() if "Executing task" in line]
    order = [step.replace("\x1b[96m", "").replace("\x1b[0m", "") for step in order]
    assert order.index("train") > max(order.index("draft-init"), order.index("target-warmup"))
    assert order[-3:] == ["evaluate", "promote", "mlflow-run-end"]

    client = MlflowClient(mlflow_server)
    (version,) = client.search_model_versions(f"name='{name}'")
    assert version.version == "1"
    tags = version.tags
    assert tags["target"] == target and tags["data"] == "packaged:chitchat"
    assert len(tags["flashdraft.commit"]) >= 7 and len(tags["flashdraft.draft_sha256"]) == 64
    for bench in ("gsm8k", "chat"):
        assert float(tags[f"tau.{bench}"]) >= 1.0
        assert tags[f"lossless.{bench}"] == "1"  # float32 on CPU: speculative == plain greedy
        assert f"speedup.{bench}" in tags
    assert len(tags["flashdraft.weights_sha256"]) == 64
    # The first model, lossless, but below the speedup gate: registered, never champion (promote.min_speedup),
    # and the reason says so.
    assert {k: str(v) for k, v in client.get_registered_model(name).aliases.items()} == {"challenger": "1"}
    assert "below promote.min_speedup 100.000x" in tags["flashdraft.decision"]
    # The registered source is the trained draft, byte for byte what the train step exported.
    import mlflow.artifacts

    from flashdraft.tracking.registry import draft_digest

    local = Path(mlflow.artifacts.download_artifacts(version.source, dst_path=str(in_tmp / "dl"),
                                                     tracking_uri=mlflow_server))
    assert draft_digest(local) == tags["flashdraft.draft_sha256"]
    assert (local / "config.json").is_file() and (local / "model.safetensors").is_file()

    # One parent run per pipeline run, FINISHED, with a nested run per tracked step.
    (parent,) = parent_runs(mlflow_server, experiment)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["kfp.run_id"] == parent.data.tags["flashdraft.pipeline_run"]
    assert parent.data.tags["flashdraft.summary.alias"] == "challenger"
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    steps = {run.data.tags.get("flashdraft.step") for run in children}
    assert {"draft-init", "warmup", "train", "evaluate", "promote"} <= steps
    assert all(run.info.status == "FINISHED" for run in children)

    # The closing summary the user sees.
    assert f"registered {name} version 1 -> @challenger" in out and "below promote.min_speedup" in out
    assert "gsm8k tau" in out and "speedup" in out
    assert f"MLflow UI: open {mlflow_server}" in out
