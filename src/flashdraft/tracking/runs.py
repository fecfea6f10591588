"""The MLflow run of one step, and where a step's process finds its tracking server.

Tracking is on when a tracking URI is set (`MLFLOW_TRACKING_URI`, or `tracking_uri=` here). A step run
nests under the pipeline's parent run (`pipeline_run.py`) when `FLASHDRAFT_PARENT_RUN_ID` is set, so one
pipeline run is one MLflow parent run with a child per step. Only rank 0 should open runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from flashdraft.config import check_tracking_uri, flatten, redact, redacted, to_dict
from flashdraft.errors import UserError

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "FLASHDRAFT_PARENT_RUN_ID"
DEFAULT_EXPERIMENT = "flashdraft"
# MLflow's own defaults retry an unreachable server for minutes; a step should fail within 30 s instead
# (the user's own settings of these variables win).
FAST_FAILURE = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "7", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
HEALTH_TIMEOUT_S = 10


def use_step_environment(
    tracking_uri: str = "", experiment: str = "", parent_run_id: str = "", workspace: str = ""
) -> None:
    """Point this process at a pipeline step's MLflow run and target cache; empty arguments change nothing.

    Component bodies call this before importing anything that reads the environment at import time
    (huggingface_hub reads `HF_HOME` then).
    """
    for name, value in (
        ("MLFLOW_TRACKING_URI", tracking_uri),
        ("MLFLOW_EXPERIMENT_NAME", experiment),
        (PARENT_RUN_ENV, parent_run_id),
    ):
        if value:
            os.environ[name] = value
    if workspace:  # the target cache on the run's shared volume: downloaded once, read by every step
        os.environ["FLASHDRAFT_CACHE"] = os.path.join(workspace, "cache")
        os.environ["HF_HOME"] = os.path.join(workspace, "cache", "hf")


def tracking_enabled(tracking_uri: str | None = None) -> bool:
    return bool(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))


def check_tracking(tracking_uri: str | None = None) -> None:
    """Fail now, before heavy work, when tracking is on and its URI is bad or its server is down."""
    if tracking_enabled(tracking_uri):
        reachable(tracking_uri or os.environ["MLFLOW_TRACKING_URI"])


def reachable(uri: str) -> str:
    """`uri` checked: a usable tracking URI, and for a server, one that answers within seconds; a
    UserError otherwise (never minutes of retries). Sets MLflow's request limits for the process."""
    for name, value in FAST_FAILURE.items():
        os.environ.setdefault(name, value)
    where = "the tracking URI (tracking.uri or MLFLOW_TRACKING_URI)"
    check_tracking_uri(uri, where)
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.parse
        import urllib.request

        parts = urllib.parse.urlsplit(uri)
        health = urllib.parse.urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else ""),
                                          parts.path.rstrip("/") + "/health", "", ""))
        try:  # /health answers without a login, also behind MLflow's basic-auth app
            urllib.request.urlopen(health, timeout=HEALTH_TIMEOUT_S).close()
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise UserError(f"cannot reach the MLflow server at {redact(uri)} ({reason}); check {where}, the "
                            "server, and the network between them") from None
    return uri


class StepRun:
    """One MLflow run of a step; every method is a no-op when tracking is off."""

    def __init__(self, run_id: str | None, tracking_uri: str | None = None):
        self.run_id = run_id
        self.tracking_uri = tracking_uri

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.active:
            import mlflow

            # MLflow caps a param value at 6000 characters.
            flat = {k: redact(str(v))[:6000] for k, v in flatten(params).items()}
            mlflow.log_params(flat, run_id=self.run_id)

    def log_config(self, config: Any) -> None:
        """The resolved config: flattened as params, whole as config.json."""
        resolved = to_dict(config)
        self.log_params(resolved)
        self.log_dict(resolved, "config.json")

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.active:
            return
        import mlflow

        mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step, run_id=self.run_id)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        if self.active:
            import mlflow

            mlflow.log_dict(redacted(dict(data)), artifact_file, run_id=self.run_id)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if not self.active:
            return
        import mlflow

        path = Path(path)
        if path.is_dir():
            mlflow.log_artifacts(str(path), artifact_path, run_id=self.run_id)
        else:
            mlflow.log_artifact(str(path), artifact_path, run_id=self.run_id)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.active:
            from mlflow import MlflowClient

            client = MlflowClient(self.tracking_uri)
            for key, value in tags.items():
                client.set_tag(self.run_id, key, str(value))


@contextlib.contextmanager
def step_run(
    name: str,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    enabled: bool = True,
) -> Iterator[StepRun]:
    """An MLflow run for one step (nested under the pipeline's run if there is one).

    The run ends FINISHED, or FAILED when the block raises.
    """
    if not enabled or not tracking_enabled(tracking_uri):
        yield StepRun(None)
        return
    uri = reachable(tracking_uri or os.environ["MLFLOW_TRACKING_URI"])
    import mlflow

    # Always set: an earlier set_tracking_uri in this process would otherwise win over the environment.
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT)
    parent = os.environ.get(PARENT_RUN_ENV)
    tags = {"flashdraft.step": name}
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = mlflow.start_run(run_name=name, tags=tags)
    log.info("MLflow run %s (%s) at %s", run.info.run_id, name, redact(mlflow.get_tracking_uri()))
    try:
        yield StepRun(run.info.run_id, mlflow.get_tracking_uri())
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run(status="FINISHED")


def default_tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI`, else MLflow's own default store: sqlite `mlflow.db` in the working folder."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
