"""The MLflow server as manifests/ deploys it (the basic-auth app with the shipped basic_auth.ini), run for
real on loopback: anonymous clients are refused, the pipeline's credentials work, and a user without a
grant cannot move @champion."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
import yaml

from mlflow_helpers import running_mlflow_server

pytest.importorskip("flask_wtf", reason="the basic-auth app needs mlflow[auth]")
ADMIN_PASSWORD = "a-long-test-password-1234"


def shipped_auth_config(tmp_path) -> str:
    """basic_auth.ini from the manifests' ConfigMap, its user store moved into tmp_path."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "manifests" / "base" / "mlflow.yaml").read_text()
    (config_map,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "ConfigMap"]
    ini = config_map["data"]["basic_auth.ini"].replace("sqlite:////mlflow/basic_auth.db",
                                                      f"sqlite:///{tmp_path / 'basic_auth.db'}")
    path = tmp_path / "basic_auth.ini"
    path.write_text(ini)
    return str(path)


@pytest.mark.slow
def test_the_deployed_server_needs_a_login(tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    env = {"MLFLOW_AUTH_CONFIG_PATH": shipped_auth_config(tmp_path), "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-session-key"}
    with running_mlflow_server(tmp_path, ["--app-name", "basic-auth"], env) as url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
        assert refused.value.code == 401

        # The pipeline's pods log in through MLFLOW_TRACKING_USERNAME / _PASSWORD (flashdraft-mlflow-auth).
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
        admin = MlflowClient(url)
        admin.create_registered_model("draft")
        run = admin.create_run(admin.create_experiment("e"))
        version = admin.create_model_version("draft", source=f"{run.info.artifact_uri}/draft", run_id=run.info.run_id)
        admin.set_registered_model_alias("draft", "champion", version.version)

        # Another user, with no grant: default_permission = NO_PERMISSIONS.
        from mlflow.server.auth.client import AuthServiceClient

        AuthServiceClient(url).create_user("someone", "another-long-password-5678")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "another-long-password-5678")
        with pytest.raises(MlflowException, match="[Pp]ermission"):
            MlflowClient(url).set_registered_model_alias("draft", "champion", version.version)
