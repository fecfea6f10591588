"""Fixtures of the tracking tests."""

import pytest


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh sqlite tracking store and registry as MLFLOW_TRACKING_URI, run from its folder."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("FLASHDRAFT_PARENT_RUN_ID", raising=False)
    return uri
