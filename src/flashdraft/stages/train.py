"""`flashdraft train --config <recipe|yaml> [key=value ...]`: train a draft against a frozen target.

Runs as one process, under torchrun, or in a PyTorchJob pod (PET_* variables: re-launched under
torchrun). Writes to `train.output_dir`: checkpoints/step-N/ (resumed automatically), export/ (the draft
as an HF folder), metrics.jsonl, summary.json, config.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from flashdraft.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="recipe name (e.g. smollm2_135m) or YAML file; defaults: a tiny CPU job")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. train.max_steps=100 data.train=chats.jsonl")


def main(args: argparse.Namespace) -> int:
    from flashdraft.train.distributed import teardown, torchrun_command

    config = load_config(args.config, args.overrides)  # bad keys fail here, before any launch
    relaunch = torchrun_command(sys.argv[1:])
    if relaunch is not None:
        os.execv(relaunch[0], relaunch)

    from flashdraft.train.trainer import Trainer

    try:
        summary = Trainer(config, recipe=args.config).run()
    finally:
        teardown()
    if summary and int(os.environ.get("RANK", 0)) == 0:
        shown = {k: v for k, v in summary.items() if k != "config"}
        print(json.dumps(shown, indent=1, default=str))
    return 0
