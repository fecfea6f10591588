"""The MLflow parent run of one pipeline run: opened by its first step, closed by its exit step.

The exit step cannot take inputs from other steps (a KFP rule), so both find the run by a key tag: the
KFP run id on a cluster, a fresh id per local run. Each step's own run nests under it (`runs.step_run`
reads `FLASHDRAFT_PARENT_RUN_ID`), and steps record their headline results on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from flashdraft.config import flatten
from flashdraft.tracking.runs import DEFAULT_EXPERIMENT, PARENT_RUN_ENV, default_tracking_uri, tracking_enabled

log = logging.getLogger(__name__)

PIPELINE_KEY_TAG = "flashdraft.pipeline_run"
SUMMARY_TAG_PREFIX = "flashdraft.summary."


def _client(tracking_uri: str | None):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())


def _find_pipeline_run(client, experiment_name: str, key: str):
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{PIPELINE_KEY_TAG}` = '{key}'", max_results=1
    )
    return runs[0] if runs else None


def start_pipeline_run(
    key: str,
    *,
    name: str,
    tags: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
) -> str:
    """Open the parent run of one pipeline run (left RUNNING for its steps) and return its id.

    A retried first step finds the run it opened before instead of opening a second one.
    """
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    existing = _find_pipeline_run(client, experiment, key)
    if existing is not None:
        return existing.info.run_id
    found = client.get_experiment_by_name(experiment)
    try:
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    except MlflowException:  # another process created it first
        experiment_id = client.get_experiment_by_name(experiment).experiment_id
    all_tags = {PIPELINE_KEY_TAG: key, **{k: str(v) for k, v in (tags or {}).items()}}
    run = client.create_run(experiment_id, run_name=name, tags=all_tags)
    for k, v in flatten(params or {}).items():
        client.log_param(run.info.run_id, k, str(v)[:6000])
    log.info("MLflow pipeline run %s (%s) at %s", run.info.run_id, name, client.tracking_uri)
    return run.info.run_id


def log_to_pipeline_run(
    summary: Mapping[str, Any], metrics: Mapping[str, float] | None = None, tracking_uri: str | None = None
) -> None:
    """Record a step's headline results on the parent run (no-op outside a pipeline)."""
    parent = os.environ.get(PARENT_RUN_ENV)
    if not parent or not tracking_enabled(tracking_uri):
        return
    client = _client(tracking_uri)
    for key, value in summary.items():
        client.set_tag(parent, SUMMARY_TAG_PREFIX + key, str(value))
    for key, value in (metrics or {}).items():
        client.log_metric(parent, key, float(value))


def end_pipeline_run(
    key: str,
    *,
    succeeded: bool,
    error: str | None = None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
) -> dict[str, Any]:
    """Close the parent run FINISHED or FAILED; returns its summary (run id, headline results).

    Finding no run (the first step failed before opening it) is logged, not raised: this runs in an exit
    step, and the pipeline's own error is the one that matters.
    """
    client = _client(tracking_uri)
    experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    run = _find_pipeline_run(client, experiment, key)
    if run is None:
        log.warning("no MLflow pipeline run tagged %s=%s in experiment %r", PIPELINE_KEY_TAG, key, experiment)
        return {}
    run_id = run.info.run_id
    if error:
        client.set_tag(run_id, "flashdraft.error", error[:5000])
    client.set_terminated(run_id, status="FINISHED" if succeeded else "FAILED")
    summary = {k[len(SUMMARY_TAG_PREFIX) :]: v for k, v in run.data.tags.items() if k.startswith(SUMMARY_TAG_PREFIX)}
    return {
        "run_id": run_id,
        "status": "FINISHED" if succeeded else "FAILED",
        "tracking_uri": client.tracking_uri,
        "experiment_id": run.info.experiment_id,
        **summary,
    }
