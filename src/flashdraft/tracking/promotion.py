"""Promotion of an evaluated draft: its scores from the `flashdraft evaluate` report, a registry version
with lineage and scores as tags, then the alias `registry.should_promote` gives it.

The draft folder is logged as artifacts of the step's MLflow run and registered from there. Promoting
the same draft again finds its version and changes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flashdraft.config import PromoteConfig
from flashdraft.errors import UserError
from flashdraft.tracking import registry
from flashdraft.tracking.pipeline_run import log_to_pipeline_run
from flashdraft.tracking.registry import Decision, Scores
from flashdraft.tracking.runs import StepRun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromotionResult:
    model_name: str
    version: str
    alias: str
    promoted: bool
    reason: str
    primary_benchmark: str
    tau: float
    speedup: float | None
    new_version: bool


def read_report(path: str | Path) -> dict:
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError as err:
        raise UserError(f"evaluation report {path} does not exist; give the report `flashdraft evaluate` wrote") from err
    except json.JSONDecodeError as err:
        raise UserError(f"evaluation report {path} is not JSON ({err}); give the report `flashdraft evaluate` wrote") from err
    if not isinstance(report, dict):
        raise UserError(f"evaluation report {path} must be a JSON object, not {type(report).__name__}")
    return report


def benchmark_scores(report: Mapping[str, Any]) -> dict[str, Scores]:
    """Per-benchmark scores from a `flashdraft evaluate` report: tau pooled over all verify steps (the
    way vLLM / SGLang count acceptance length), lossless fraction (None when sampled), speedup."""
    benchmarks = report.get("benchmarks")
    if not isinstance(benchmarks, Mapping) or not benchmarks:
        raise UserError("the evaluation report has no `benchmarks` section; give the report `flashdraft evaluate` wrote")
    out = {}
    for name, result in benchmarks.items():
        try:
            tau = result["speculative"]["tau_pooled"]
            lossless, speedup = result["lossless"], result.get("speedup")
            out[name] = Scores(
                tau=float(tau),
                lossless=float(lossless) if lossless is not None else None,
                speedup=float(speedup) if speedup is not None else None,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(
                f"benchmark {name!r} in the evaluation report lacks speculative.tau_pooled / lossless ({err!r}); "
                "give the report `flashdraft evaluate` wrote"
            ) from err
    return out


def promote_draft(
    run: StepRun,
    promote: PromoteConfig,
    report: Mapping[str, Any],
    *,
    lineage: Mapping[str, str],
) -> PromotionResult:
    """Register `promote.draft` as a version of `promote.model_name` inside `run` (a tracked step run, whose
    tracking URI holds the registry) and give it the alias the policy in `promote` decides."""
    if not promote.model_name:
        raise UserError("the registered model name is empty; set promote.model_name (--model-name NAME)")
    if not promote.draft:
        raise UserError("no draft to promote; set promote.draft (--draft DIR) to the folder `flashdraft train` "
                        "exported")
    if not run.active:
        raise UserError("promotion needs an MLflow tracking URI (tracking.uri or MLFLOW_TRACKING_URI)")
    draft, model_name = Path(promote.draft), promote.model_name
    candidate = benchmark_scores(report)
    registry.require_primary(candidate, promote)
    digest = registry.draft_digest(draft)
    client = registry.client(run.tracking_uri)
    version = registry.find_version(client, model_name, digest)
    new_version = version is None
    if new_version:
        run.log_artifact(draft, registry.DRAFT_ARTIFACT_PATH)
        run.log_dict(dict(report), "evaluation/report.json")
        tags = {**lineage, "flashdraft.commit": registry.source_commit(), **registry.scores_to_tags(candidate)}
        version = registry.register_draft(client, model_name, run_id=run.run_id, digest=digest, tags=tags)
    else:
        log.info("this draft is already %s version %s", model_name, version.version)
    champion = registry.champion_version(client, model_name)
    if champion is not None and champion.version == version.version:
        decision, alias = Decision(True, "already the champion"), registry.CHAMPION
    else:
        champion_scores = registry.scores_from_tags(champion.tags) if champion is not None else None
        decision = registry.should_promote(candidate, champion_scores, promote)
        alias = registry.apply_decision(client, model_name, version.version, decision)
    primary = candidate[promote.primary_benchmark]
    result = PromotionResult(
        model_name=model_name,
        version=str(version.version),
        alias=alias,
        promoted=decision.promote,
        reason=decision.reason,
        primary_benchmark=promote.primary_benchmark,
        tau=primary.tau,
        speedup=primary.speedup,
        new_version=new_version,
    )
    run.set_tags({"flashdraft.model_version": result.version, "flashdraft.alias": alias})
    run.log_dict(asdict(result), "promotion.json")
    metrics = {f"{promote.primary_benchmark}.tau": primary.tau}
    if primary.speedup is not None:
        metrics[f"{promote.primary_benchmark}.speedup"] = primary.speedup
    log_to_pipeline_run(
        {"model_name": model_name, "model_version": result.version, "alias": alias, "decision": decision.reason,
         "primary_benchmark": promote.primary_benchmark, "tau": primary.tau, "speedup": primary.speedup},
        metrics,
        tracking_uri=run.tracking_uri,
    )
    return result
