"""`flashdraft train --config <recipe|yaml> [key=value ...]`: train a draft against a frozen target.

Runs as one process, under torchrun, or in a PyTorchJob pod (PET_* variables: re-launched under
torchrun). Writes to `train.output_dir`: checkpoints/step-N/ (resumed automatically), export/ (the draft
as an HF folder), metrics.jsonl, summary.json, config.yaml; rank 0 logs them to a `train` MLflow run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from flashdraft.config import Config
from flashdraft.stages.args import add_config_arguments, config_from_args
from flashdraft.tracking.runs import check_tracking, step_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="write into train.output_dir even when it holds files that are not a run's")


def run(config: Config, *, overwrite: bool = False) -> dict[str, Any]:
    """Train as this process's rank; the summary (`summary["export"]` is the exported draft folder)."""
    from flashdraft.train.distributed import teardown
    from flashdraft.train.trainer import Trainer

    check_tracking(config.tracking.uri)
    try:
        trainer = Trainer(config, overwrite=overwrite)  # checks, data, weights: bad input fails before a run opens
        t = config.tracking
        with step_run("train", tracking_uri=t.uri, experiment=t.experiment, enabled=trainer.dist.is_main) as tracked:
            tracked.log_config(config)
            tracked.set_tags({"target.hybrid": trainer.fast_path["hybrid"],
                              "target.fast_path": trainer.fast_path["fast_path"]})
            summary = trainer.run(on_metrics=lambda step, values: tracked.log_metrics(values, step=step))
            tracked.log_metrics({f"final_{k}": v for k, v in summary.items()
                                 if isinstance(v, (int, float)) and v is not None})
            tracked.log_artifact(trainer.out / "summary.json")
            tracked.log_artifact(trainer.out / "metrics.jsonl")
    finally:
        teardown()
    return summary


def main(args: argparse.Namespace) -> int:
    from flashdraft.launch.local import pet_relaunch_command

    config = config_from_args(args)  # bad keys fail here, before any launch
    relaunch = pet_relaunch_command(sys.argv[1:])
    if relaunch is not None:
        os.execv(relaunch[0], relaunch)

    summary = run(config, overwrite=args.overwrite)
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=1, default=str))
    return 0
