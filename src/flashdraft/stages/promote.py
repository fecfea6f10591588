"""`flashdraft promote`: register a trained draft in the MLflow registry and move its alias by policy.

The lineage tags of the version come from the config: the target (`target.name_or_path`,
`target.revision`), the recipe (`--config`, or `--recipe` to record a name without loading it) and the
training data (`data.train`). Tracking always happens here: `tracking.uri`, else MLFLOW_TRACKING_URI,
else ./mlflow.db.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace

from flashdraft.config import Config
from flashdraft.files import check_output_file, write_json
from flashdraft.stages.args import Flag, add_config_arguments, config_from_args, require
from flashdraft.tracking.promotion import PromotionResult, promote_draft, read_report
from flashdraft.tracking.runs import default_tracking_uri, step_run

FLAGS = [
    Flag("--draft", "promote.draft", "the exported draft folder (HF format)"),
    Flag("--report", "promote.report", "report.json from `flashdraft evaluate`"),
    Flag("--model-name", "promote.model_name", "registered model name in the MLflow registry"),
    Flag("--primary-benchmark", "promote.primary_benchmark", "benchmark whose tau decides"),
    Flag("--min-tau-gain", "promote.min_tau_gain", "tau the candidate must beat the champion by", {"type": float}),
    Flag("--min-lossless", "promote.min_lossless", "lossless fraction every benchmark needs", {"type": float}),
    Flag("--min-speedup", "promote.min_speedup", "speedup over plain decoding the primary benchmark needs to be "
         "champion", {"type": float}),
    Flag("--target", "target.name_or_path", "lineage: the target id or path the draft was trained for"),
    Flag("--target-revision", "target.revision", "lineage: the target's revision"),
    Flag("--data", "data.train", "lineage: the training data specs", {"nargs": "+", "metavar": "SPEC"}),
    Flag("--tracking-uri", "tracking.uri", "MLflow tracking URI (default: MLFLOW_TRACKING_URI, else ./mlflow.db)"),
    Flag("--output", "promote.output", "write the decision as JSON here"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FLAGS)
    parser.add_argument("--recipe", help="lineage: the training recipe's name (recorded only; --config loads one)")


def lineage(config: Config) -> dict[str, str]:
    """The version's lineage tags; unset ones are left out."""
    data = config.data.train if isinstance(config.data.train, str) else ",".join(config.data.train)
    values = {"target": config.target.name_or_path, "target.revision": config.target.revision,
              "recipe": config.recipe, "data": data}
    return {key: value for key, value in values.items() if value}


def run(config: Config) -> PromotionResult:
    """Register `config.promote.draft` with the scores of `config.promote.report` and move its alias."""
    promote = config.promote
    require(promote.draft, "promote.draft", "--draft")
    require(promote.model_name, "promote.model_name", "--model-name")
    report = read_report(require(promote.report, "promote.report", "--report"))
    if promote.output:
        check_output_file(promote.output, "--output")
    uri = config.tracking.uri or default_tracking_uri()
    with step_run("promote", tracking_uri=uri, experiment=config.tracking.experiment) as tracker:
        tracker.log_config(config)
        result = promote_draft(tracker, promote, report, lineage=lineage(config))
    if promote.output:
        write_json(promote.output, asdict(result))
    return result


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.recipe:
        config = replace(config, recipe=args.recipe)
    result = run(config)
    print(f"{result.model_name} version {result.version} -> @{result.alias}: {result.reason}")
    return 0
