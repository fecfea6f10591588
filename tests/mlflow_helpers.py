"""A free loopback port and the MLflow pipeline parent runs of an experiment, for tests against a real server."""

from __future__ import annotations

import socket

from mlflow import MlflowClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parent_runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = client.search_runs([found.experiment_id], filter_string="tags.`flashdraft.pipeline_run` != ''")
    return runs
