"""Promotion of an evaluated draft: its scores from the `flashdraft evaluate` report, a registry version
with lineage and scores as tags, then the alias `registry.should_promote` gives it.

The draft folder is logged as artifacts of the step's MLflow run and registered from there. Promoting
the same draft again finds its version and changes nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flashdraft.config import PromoteConfig
from flashdraft.errors import UserError
from flashdraft.tracking import registry
from flashdraft.tracking.pipeline_run import log_to_pipeline_run
from flashdraft.model.check import check_draft
from flashdraft.tracking.registry import Decision, Scores
from flashdraft.tracking.runs import StepRun

log = logging.getLogger(__name__)

CRASH_ENV = "FLASHDRAFT_CRASH_IN_PROMOTE"


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
    except FileNotFoundError:
        raise UserError(f"evaluation report {path} does not exist; give the report `flashdraft evaluate` wrote") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"evaluation report {path} is not JSON ({err}); give the report `flashdraft evaluate` "
                        "wrote") from None
    except OSError as err:
        raise UserError(f"cannot read evaluation report {path} ({err.strerror or err}); give the report file "
                        "`flashdraft evaluate` wrote") from None
    if not isinstance(report, dict):
        raise UserError(f"evaluation report {path} must be a JSON object, not {type(report).__name__}")
    return report


def _number(value: Any, what: str, low: float, high: float = math.inf, *, strictly_above: bool = False) -> float:
    """A finite JSON number in range; anything else (NaN, "Infinity", a string, a bool) is refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strictly_above else value >= low) and value <= high
    if not ok:
        bounds = f"{'>' if strictly_above else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
        raise UserError(f"the evaluation report's {what} is {value!r}: expected a finite number {bounds}; give the "
                        "report `flashdraft evaluate` wrote")
    return float(value)


def benchmark_scores(report: Mapping[str, Any], block_size: int) -> dict[str, Scores]:
    """Per-benchmark scores from a `flashdraft evaluate` report, each checked: tau pooled over all verify
    steps (the way vLLM / SGLang count acceptance length, 1 <= tau <= the draft's block size), the
    lossless fraction (in [0, 1]; None when sampled) and the speedup (> 0)."""
    benchmarks = report.get("benchmarks")
    if not isinstance(benchmarks, Mapping) or not benchmarks:
        raise UserError("the evaluation report has no `benchmarks` section; give the report `flashdraft evaluate` wrote")
    out = {}
    for name, result in benchmarks.items():
        try:
            tau, lossless, speedup = result["speculative"]["tau_pooled"], result["lossless"], result.get("speedup")
        except (KeyError, TypeError) as err:
            raise UserError(
                f"benchmark {name!r} in the evaluation report lacks speculative.tau_pooled / lossless ({err!r}); "
                "give the report `flashdraft evaluate` wrote"
            ) from err
        out[name] = Scores(
            tau=_number(tau, f"{name} tau", 1.0, block_size),
            lossless=None if lossless is None else _number(lossless, f"{name} lossless fraction", 0.0, 1.0),
            speedup=None if speedup is None else _number(speedup, f"{name} speedup", 0.0, strictly_above=True),
        )
    return out


def _crash_point(name: str) -> None:
    """Fault injection for tests: FLASHDRAFT_CRASH_IN_PROMOTE=<name> kills the process here, like a lost pod."""
    if os.environ.get(CRASH_ENV) == name:
        os._exit(17)


def end_dead_runs(client, run: StepRun, digest: str) -> None:
    """Mark KILLED the promote runs of this draft left RUNNING by a promotion that died (this one aside)."""
    experiment = client.get_run(run.run_id).info.experiment_id
    stale = client.search_runs([experiment], filter_string=f"tags.`{registry.DIGEST_TAG}` = '{digest}' "
                               "and tags.`flashdraft.step` = 'promote' and attributes.status = 'RUNNING'")
    for dead in stale:
        if dead.info.run_id != run.run_id:
            log.warning("marking promote run %s KILLED: its process died before it finished", dead.info.run_id)
            client.set_terminated(dead.info.run_id, status="KILLED")


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
    checked = check_draft(draft, "promote.draft")  # before anything is registered: a whole, loadable draft
    candidate = benchmark_scores(report, checked.config.block_size)
    registry.require_primary(candidate, promote)
    digest = registry.draft_digest(draft)
    run.set_tags({registry.DIGEST_TAG: digest})
    client = registry.client(run.tracking_uri)
    end_dead_runs(client, run, digest)
    version = registry.find_version(client, model_name, digest)
    new_version = version is None
    scores = {**registry.scores_to_tags(candidate), registry.WEIGHTS_TAG: checked.weights_sha256}
    if new_version:
        run.log_artifact(draft, registry.DRAFT_ARTIFACT_PATH)
        run.log_dict(dict(report), "evaluation/report.json")
        _crash_point("after_artifacts")
        tags = {**lineage, "flashdraft.commit": registry.source_commit(), **scores}
        version = registry.register_draft(client, model_name, run_id=run.run_id, digest=digest, tags=tags)
        _crash_point("after_register")
    else:
        log.info("this draft is already %s version %s", model_name, version.version)
    # From reading the champion to moving the alias, no other promotion of this model runs.
    with registry.promotion_lock(client, model_name):
        champion = registry.champion_version(client, model_name)
        if champion is not None and champion.version == version.version:
            # Re-promoted: decided on its new report against the policy alone.
            decision = registry.should_promote(candidate, None, promote)
            if decision.promote:  # it stays champion, for the reason it became one
                decision = Decision(True, champion.tags.get("flashdraft.decision", "already the champion"))
        else:
            champion_scores = registry.scores_from_tags(champion.tags) if champion is not None else None
            decision = registry.should_promote(candidate, champion_scores, promote)
        alias = registry.apply_decision(client, model_name, version.version, decision, scores)
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
