"""`flashdraft dllm-evaluate`: evaluate a diffusion LM (an mdlm / hybrid export) on a held-out split.

    flashdraft dllm-evaluate --config llada2_sft --model runs/train/export --output report.json [key=value ...]

Held-out masked-token loss and accuracy, and a short generation sample (decoding/diffusion.py). The
report (JSON) is written atomically and logged to MLflow (a `dllm_evaluate` run) when tracking is on.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flashdraft.config import Config
from flashdraft.errors import UserError
from flashdraft.files import check_output_file
from flashdraft.stages.args import Flag, add_config_arguments, config_from_args, require
from flashdraft.tracking.runs import step_run

FLAGS = [
    Flag("--model", "target.name_or_path", "HF folder of the trained diffusion LM (a train export)"),
    Flag("--output", "evaluate.output", "report JSON path"),
    Flag("--prompt", "evaluate.prompts", "generation prompt (repeatable); default: the first held-out conversations",
         {"action": "append", "metavar": "PROMPT"}),
    Flag("--num-samples", "evaluate.dllm_samples", "held-out prompts to answer (without --prompt)", {"type": int}),
    Flag("--gen-length", "evaluate.dllm_gen_length", "tokens per generated answer", {"type": int}),
    Flag("--steps", "evaluate.dllm_steps", "unmasking passes per answer", {"type": int}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FLAGS)


def run(config: Config) -> dict[str, Any]:
    """The report: `metrics` (masked-token loss, accuracy...), `samples`, `generation` settings."""
    from flashdraft.decoding.diffusion import evaluate_diffusion_lm

    output = check_output_file(require(config.evaluate.output, "evaluate.output", "--output"), "--output")
    model = config.target.name_or_path
    if not (Path(model) / "config.json").is_file():
        raise UserError(f"--model (target.name_or_path) {model!r} is not a model folder (no config.json); "
                        "give a train export")
    with step_run("dllm_evaluate", tracking_uri=config.tracking.uri, experiment=config.tracking.experiment) as tracked:
        tracked.log_config(config)
        report = evaluate_diffusion_lm(config, output)
        tracked.log_metrics({f"eval_{k}": v for k, v in report["metrics"].items()})
        tracked.log_dict(report, "dllm_report.json")
    return report


def main(args: argparse.Namespace) -> int:
    report = run(config_from_args(args))
    print("masked-token eval: " + ", ".join(f"{k} {v:.4g}" for k, v in report["metrics"].items()))
    return 0
