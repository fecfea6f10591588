"""`flashdraft promote`: register a trained draft in the MLflow registry and move its alias by policy.

The draft folder is logged as artifacts of this step's MLflow run, registered as a model version with
its lineage and scores as tags, then `registry.should_promote` compares it with the current champion:
`champion` if it wins, `challenger` if not. Promoting the same draft again finds its version and
changes nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flashdraft.tracking import registry
from flashdraft.tracking import runs as tracking
from flashdraft.errors import UserError
from flashdraft.tracking.registry import Decision, PromotionPolicy, Scores

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


def read_report(path: Path) -> dict:
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
    draft: Path,
    report: Mapping[str, Any],
    *,
    model_name: str,
    policy: PromotionPolicy,
    lineage: Mapping[str, str],
    tracking_uri: str | None = None,
) -> PromotionResult:
    if not model_name:
        raise UserError("the registered model name is empty; pass --model-name NAME")
    candidate = benchmark_scores(report)
    registry.require_primary(candidate, policy)
    digest = registry.draft_digest(draft)
    tracking_uri = tracking_uri or tracking.default_tracking_uri()
    with tracking.step_run("promote", tracking_uri=tracking_uri) as run:
        client = registry.client(tracking_uri)
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
            decision = registry.should_promote(candidate, champion_scores, policy)
            alias = registry.apply_decision(client, model_name, version.version, decision)
        primary = candidate[policy.primary_benchmark]
        result = PromotionResult(
            model_name=model_name,
            version=str(version.version),
            alias=alias,
            promoted=decision.promote,
            reason=decision.reason,
            primary_benchmark=policy.primary_benchmark,
            tau=primary.tau,
            speedup=primary.speedup,
            new_version=new_version,
        )
        run.log_params({"policy": asdict(policy), "model_name": model_name})
        run.set_tags({"flashdraft.model_version": result.version, "flashdraft.alias": alias})
        run.log_dict(asdict(result), "promotion.json")
        metrics = {f"{policy.primary_benchmark}.tau": primary.tau}
        if primary.speedup is not None:
            metrics[f"{policy.primary_benchmark}.speedup"] = primary.speedup
        tracking.log_to_pipeline_run(
            {"model_name": model_name, "model_version": result.version, "alias": alias, "decision": decision.reason,
             "primary_benchmark": policy.primary_benchmark, "tau": primary.tau, "speedup": primary.speedup},
            metrics,
            tracking_uri=tracking_uri,
        )
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", required=True, type=Path, help="the exported draft folder (HF format)")
    parser.add_argument("--report", required=True, type=Path, help="report.json from `flashdraft evaluate`")
    parser.add_argument("--model-name", required=True, help="registered model name in the MLflow registry")
    parser.add_argument("--primary-benchmark", default=PromotionPolicy.primary_benchmark,
                        help="benchmark whose tau decides (default %(default)s)")
    parser.add_argument("--min-tau-gain", type=float, default=PromotionPolicy.min_tau_gain,
                        help="tau the candidate must beat the champion by (default %(default)s)")
    parser.add_argument("--min-lossless", type=float, default=PromotionPolicy.min_lossless,
                        help="lossless fraction every benchmark needs (default %(default)s)")
    parser.add_argument("--target", default="", help="lineage: the target id or path the draft was trained for")
    parser.add_argument("--target-revision", default="", help="lineage: the target's revision")
    parser.add_argument("--recipe", default="", help="lineage: the training recipe")
    parser.add_argument("--data", default="", help="lineage: the training data spec")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--output", type=Path, help="write the decision as JSON here")


def write_json_atomically(data: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def main(args: argparse.Namespace) -> int:
    if not 0.0 <= args.min_lossless <= 1.0:
        raise UserError(f"--min-lossless is a fraction in [0, 1], got {args.min_lossless}")
    if args.min_tau_gain < 0:
        raise UserError(f"--min-tau-gain must be >= 0, got {args.min_tau_gain}")
    policy = PromotionPolicy(
        primary_benchmark=args.primary_benchmark, min_tau_gain=args.min_tau_gain, min_lossless=args.min_lossless
    )
    lineage = {
        "target": args.target,
        "target.revision": args.target_revision,
        "recipe": args.recipe,
        "data": args.data,
    }
    result = promote_draft(
        args.draft,
        read_report(args.report),
        model_name=args.model_name,
        policy=policy,
        lineage={k: v for k, v in lineage.items() if v},
        tracking_uri=args.tracking_uri,
    )
    if args.output:
        write_json_atomically(asdict(result), args.output)
    print(f"{result.model_name} version {result.version} -> @{result.alias}: {result.reason}")
    return 0
