"""Shared fixtures: tiny random targets saved as HF folders (see tiny_models.py)."""

from __future__ import annotations

import pytest
import torch

from mlflow_helpers import running_mlflow_server
from tiny_models import save_tiny_target


@pytest.fixture(autouse=True)
def _few_threads():
    # CI has 2 cores shared with subprocesses; more threads only thrash.
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """Factory: tiny_target("qwen3" | "llama" | "nemotron_h") -> path of a saved random target."""
    made = {}

    def make(model_type: str = "qwen3"):
        if model_type not in made:
            made[model_type] = save_tiny_target(tmp_path_factory.mktemp(f"target-{model_type}"), model_type)
        return made[model_type]

    return make


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking + registry server (sqlite backend, proxied artifacts), started once for the
    session: each test keeps to experiment and model names of its own."""
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as url:
        yield url
