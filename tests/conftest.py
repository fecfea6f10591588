"""Shared fixtures: tiny random targets saved as HF folders (see tiny_models.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from mlflow_helpers import free_port
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
