"""Real MLflow servers on loopback for tests, and the pipeline parent runs of an experiment."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_mlflow_server(root: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`mlflow server` (sqlite backend, proxied artifacts under `root`) on a free loopback port; yields its URL."""
    port = free_port()
    full_env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    with open(root / "server.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", *args],
            env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"mlflow server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def parent_runs(uri: str, experiment: str):
    from mlflow import MlflowClient  # here, so that test runs on machines without MLflow (the GPU's) collect

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = client.search_runs([found.experiment_id], filter_string="tags.`flashdraft.pipeline_run` != ''")
    return runs
