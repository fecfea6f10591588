"""Credentials in a tracking URI never reach a file, a param, a log line or a job manifest; an unreachable
or malformed tracking URI fails within seconds with a clear error, before any work."""

from __future__ import annotations

import json
import logging
import time

import pytest

from flashdraft.cli import main
from flashdraft.config import load_config, redact, to_yaml
from flashdraft.errors import UserError
from flashdraft.tracking.runs import step_run
from mlflow_helpers import free_port
from train_helpers import alphabet_chats, tiny_train_args

SECRET = "hunter2-secret"
URI = f"http://flashdraft:{SECRET}@127.0.0.1:5000"


def test_redaction_keeps_the_user_and_host():
    assert redact(URI) == "http://flashdraft:***@127.0.0.1:5000"
    assert redact("see https://a:b@h/x and postgresql://u:p@db/m") == "see https://a:***@h/x and postgresql://u:***@db/m"
    assert redact("http://host:5000/path") == "http://host:5000/path"


def test_the_written_and_logged_config_holds_no_password():
    config = load_config(None, values={"tracking.uri": URI})
    assert config.tracking.uri == URI  # in memory the client still has what it needs
    assert SECRET not in to_yaml(config) and "flashdraft:***@" in to_yaml(config)


def test_a_training_run_writes_and_logs_no_password(tiny_target, tmp_path, monkeypatch, caplog):
    """A real run against a real (local) store whose URI is given with a password-bearing alias: the
    files it writes and everything it logs hold the redacted form only."""
    caplog.set_level(logging.INFO)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=8)
    out = tmp_path / "out"
    # The password rides in another URL-valued setting the run records (the data spec of a hub mirror).
    args = tiny_train_args(tiny_target("qwen3"), data, out, **{"train.max_steps": 1, "target.cache_dir":
                                                                f"https://mirror:{SECRET}@example.org/cache"})
    assert main(["train", *args]) == 0
    written = "".join(p.read_text() for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".yaml", ".jsonl"))
    assert "mirror:***@example.org" in written and SECRET not in written
    assert SECRET not in caplog.text
    from mlflow import MlflowClient

    client = MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert SECRET not in json.dumps(run.data.params) and "mirror:***@" in run.data.params["target.cache_dir"]


def test_a_job_manifest_never_carries_a_password(monkeypatch):
    from flashdraft.launch import job_manifest

    config = load_config(None, values={"launch.backend": "pytorchjob", "launch.image": "r/t:1",
                                       "launch.namespace": "ns", "tracking.uri": URI})
    with pytest.raises(UserError, match="tracking.uri holds a password.*Secret"):
        job_manifest(config)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", URI)
    with pytest.raises(UserError, match="MLFLOW_TRACKING_URI holds a password"):
        job_manifest(load_config(None, values={"launch.backend": "pytorchjob", "launch.image": "r/t:1",
                                               "launch.namespace": "ns"}))


@pytest.mark.parametrize("uri", ["mlflow.example.com", "htp://host:5000", "http:/host", "sqlite://", "nope:"])
def test_a_malformed_tracking_uri_is_refused_at_load(uri):
    with pytest.raises(UserError, match="is not a tracking URI MLflow can use"):
        load_config(None, values={"tracking.uri": uri})


def test_an_unreachable_server_fails_within_seconds():
    uri = f"http://user:{SECRET}@127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(UserError) as err, step_run("train", tracking_uri=uri):
        pass
    assert time.monotonic() - started < 30
    assert "cannot reach the MLflow server at http://user:***@127.0.0.1" in str(err.value) and SECRET not in str(err.value)
