"""Component bodies called directly (`component.python_func`), against a real MLflow store: the parent
run's life cycle (open, retried open, close FINISHED/FAILED) and the promote step's outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("kfp")
pytest.importorskip("mlflow")

from kfp import dsl  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from components.mlflow_run_end.component import mlflow_run_end  # noqa: E402
from components.mlflow_run_start.component import mlflow_run_start  # noqa: E402
from components.promote.component import promote  # noqa: E402
from tiny_models import save_tiny_draft  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Component bodies set these in os.environ (in a pod, their own process); restore them after.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "e")
    monkeypatch.setenv("FLASHDRAFT_PARENT_RUN_ID", "")
    return uri


def status(state: str, error: str | None = None) -> dsl.PipelineTaskFinalStatus:
    return dsl.PipelineTaskFinalStatus(state=state, pipeline_job_resource_name="run-1", pipeline_task_name="exit",
                                       error_code=1 if error else None, error_message=error)


def test_parent_run_opens_once_and_closes_finished(store):
    start = dict(run_key="key-1", run_name="dflash-nano30b-1", mlflow_tracking_uri=store, mlflow_experiment="e",
                 target="org/t", recipe="r")
    run_id = mlflow_run_start.python_func(**start)
    assert mlflow_run_start.python_func(**start) == run_id  # a retried step finds its run
    client = MlflowClient(store)
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.params == {"target": "org/t", "recipe": "r"}
    assert run.data.tags["kfp.run_id"] == "key-1" and run.info.run_name == "dflash-nano30b-1"

    summary = json.loads(mlflow_run_end.python_func(run_key="key-1", status=status("SUCCEEDED"),
                                                    mlflow_tracking_uri=store, mlflow_experiment="e"))
    assert summary["run_id"] == run_id and summary["state"] == "SUCCEEDED"
    assert client.get_run(run_id).info.status == "FINISHED"


def test_parent_run_closes_failed_with_the_error(store):
    run_id = mlflow_run_start.python_func(run_key="key-2", run_name="n", mlflow_tracking_uri=store,
                                          mlflow_experiment="e")
    summary = json.loads(mlflow_run_end.python_func(run_key="key-2", status=status("FAILED", "Task train failed."),
                                                    mlflow_tracking_uri=store, mlflow_experiment="e"))
    assert summary["status"] == "FAILED"
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["flashdraft.error"] == "Task train failed."


def test_exit_step_without_a_parent_run_does_not_hide_the_real_error(store):
    out = json.loads(mlflow_run_end.python_func(run_key="never-opened", status=status("FAILED", "boom"),
                                                mlflow_tracking_uri=store, mlflow_experiment="e"))
    assert out == {"state": "FAILED"}


def test_promote_component_registers_and_reports(store, tmp_path):
    parent = mlflow_run_start.python_func(run_key="key-3", run_name="n", mlflow_tracking_uri=store,
                                          mlflow_experiment="e")
    draft = save_tiny_draft(tmp_path / "draft")
    report = tmp_path / "report"
    report.mkdir()
    bench = {"speculative": {"tau_pooled": 3.25}, "speedup": 2.5, "lossless": 1.0}
    (report / "report.json").write_text(json.dumps({"benchmarks": {"gsm8k": bench}}))
    decision = tmp_path / "decision.md"
    result = promote.python_func(
        draft=dsl.Model(uri=str(draft)), report=dsl.Artifact(uri=str(report)), model_name="m",
        decision=dsl.Markdown(uri=str(decision)), mlflow_tracking_uri=store, mlflow_experiment="e",
        parent_run_id=parent, target="org/t", recipe="r", data=["a.jsonl", "b.jsonl"],
    )
    assert (result.version, result.alias) == ("1", "champion")
    assert "m version 1 -> `@champion`" in decision.read_text()
    client = MlflowClient(store)
    assert client.get_model_version("m", "1").tags["data"] == "a.jsonl,b.jsonl"
    summary = json.loads(mlflow_run_end.python_func(run_key="key-3", status=status("SUCCEEDED"),
                                                    mlflow_tracking_uri=store, mlflow_experiment="e"))
    assert (summary["model_version"], summary["alias"], summary["tau"]) == ("1", "champion", "3.25")
    (child,) = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    assert child.data.tags["flashdraft.step"] == "promote"
