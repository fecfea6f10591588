"""`flashdraft draft-init`: a freshly initialised DFlash draft for a target, written as an HF folder.

    flashdraft draft-init --config RECIPE --target T --output DIR [--num-layers N ...] [key=value ...]

Reads only the target's config and tokenizer (never its weights).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from flashdraft.config import Config
from flashdraft.files import check_output_dir, holds_only
from flashdraft.model.build import build_draft_config, new_draft
from flashdraft.model.card import DraftCard
from flashdraft.model.export import export_draft
from flashdraft.stages.args import Flag, add_config_arguments, comma_ints, config_from_args, require
from flashdraft.target.source import load_target_config, load_tokenizer, source_of
from flashdraft.tracking.runs import step_run

FLAGS = [
    Flag("--target", "target.name_or_path", "hub id, HF folder, .gguf file or packaged:smollm2"),
    Flag("--output", "draft.output_dir", "folder to write the draft into"),
    Flag("--num-layers", "draft.num_layers", "draft decoder layers", {"type": int}),
    Flag("--num-taps", "draft.num_taps", "target layers to tap (default rule spreads them)", {"type": int}),
    Flag("--target-layer-ids", "draft.target_layer_ids",
         "explicit taps, comma separated, 0-based decoder layer outputs (e.g. 1,13,25)", {"type": comma_ints}),
    Flag("--block-size", "draft.block_size", "anchor + drafted tokens per block", {"type": int}),
    Flag("--mask-token-id", "draft.mask_token_id", "MASK token of the blocks (default: chosen from the target)",
         {"type": int}),
    Flag("--seed", "draft.seed", "initialisation seed", {"type": int}),
    Flag("--trust-remote-code", "target.trust_remote_code", "allow the target's own model code",
         {"action": "store_const", "const": True}),
]


@dataclass(frozen=True)
class DraftInitResult:
    path: Path  # the draft folder
    num_parameters: int
    config: dict  # the draft's config.json


# What an earlier draft-init (or a train export) leaves in its folder: it may be replaced.
DRAFT_FILES = ("config.json", "model.safetensors", "README.md", "generation_config.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FLAGS)
    parser.add_argument("--recipe", dest="config", metavar="RECIPE", help="the same as --config")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace what the output folder holds even when it is not an earlier draft")


def run(config: Config, *, overwrite: bool = False) -> DraftInitResult:
    """Build a fresh draft from `config.draft` for `config.target` and write it to draft.output_dir (a new
    or empty folder, or an earlier draft, which is replaced; anything else only with `overwrite`)."""
    output = check_output_dir(require(config.draft.output_dir, "draft.output_dir", "--output"), "draft-init",
                              overwrite=overwrite, produced=holds_only(*DRAFT_FILES))
    t = config.target
    with step_run("draft-init", tracking_uri=config.tracking.uri, experiment=config.tracking.experiment) as tracked:
        tracked.log_config(config)
        source = source_of(t)
        target_config = load_target_config(source, trust_remote_code=t.trust_remote_code)
        tokenizer = load_tokenizer(source, trust_remote_code=t.trust_remote_code)
        draft = new_draft(build_draft_config(config.draft, target_config, tokenizer), config.draft.seed)
        card = DraftCard.describe(draft, target=t.name_or_path, recipe=config.recipe)
        result = DraftInitResult(export_draft(draft, output, card), card.num_parameters, draft.config.to_diff_dict())
        tracked.log_params({"draft_config": result.config, "num_parameters": result.num_parameters})
        tracked.log_artifact(result.path / "README.md")
    return result


def main(args: argparse.Namespace) -> int:
    result = run(config_from_args(args), overwrite=args.overwrite)
    print(f"draft written to {result.path} ({result.num_parameters / 1e6:.1f}M parameters)")
    return 0
