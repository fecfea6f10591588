"""The pipeline's DAG run end to end by kfp's local runner against a real `mlflow server` on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("kfp")
pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from flashdraft import cli, orchestrate  # noqa: E402
from flashdraft.promote import promote_draft  # noqa: E402
from flashdraft.registry import PromotionPolicy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "pipelines" / "dflash_nano30b.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking + registry server (sqlite backend, proxied artifacts)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"mlflow server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, mlflow_server):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.delenv("FLASHDRAFT_PARENT_RUN_ID", raising=False)
    return tmp_path


def parent_runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = client.search_runs([found.experiment_id], filter_string="tags.`flashdraft.pipeline_run` != ''")
    return runs


def test_a_failing_step_fails_the_pipeline_marks_the_run_failed_and_moves_no_alias(in_tmp, mlflow_server, capfd):
    name, experiment = "dflash-failing", "pipeline-failure"
    # A champion exists before the run: a failed run must leave it alone.
    draft = in_tmp / "champion-draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    report = {"benchmarks": {"gsm8k": {"tau": 2.0, "speedup": 1.5, "lossless": 1.0}}}
    promote_draft(draft, report, model_name=name, policy=PromotionPolicy(), lineage={}, tracking_uri=mlflow_server)
    client = MlflowClient(mlflow_server)
    before = client.get_registered_model(name).aliases

    missing = in_tmp / "no-such-target"
    code = cli.main(["run", str(PIPELINE), "--local", f"target={missing}", f"model_name={name}",
                     f"mlflow_experiment={experiment}"])
    out, err = capfd.readouterr()
    assert code == 1
    assert "pipeline failed" in err and "FAILURE" in err
    assert f"target path '{missing}' does not exist" in out  # the step's own error, streamed
    (run,) = parent_runs(mlflow_server, experiment)
    assert run.info.status == "FAILED"
    assert "failed" in run.data.tags["flashdraft.error"]
    assert client.get_registered_model(name).aliases == before
    assert len(client.search_model_versions(f"name='{name}'")) == 1
