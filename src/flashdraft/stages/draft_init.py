"""`flashdraft draft-init`: a freshly initialised DFlash draft for a target, written as an HF folder.

Reads only the target's config and tokenizer (never its weights).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from flashdraft.config import DraftConfig, from_dict, load_config
from flashdraft.errors import UserError
from flashdraft.model.config import DFlashDraftConfig, default_target_layer_ids
from flashdraft.model.mask_token import resolve_mask_token
from flashdraft.model.modeling import DFlashDraftModel
from flashdraft.target.source import load_target_config, load_tokenizer, resolve_source
from flashdraft.tracking.runs import step_run

log = logging.getLogger(__name__)


def _rope_theta(target_config) -> float:
    params = getattr(target_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(target_config, "rope_theta", None) or 1e6)


def build_draft_config(draft: DraftConfig, target_config, tokenizer) -> DFlashDraftConfig:
    """The draft's config: shapes from `draft`, unset ones and hidden size/vocab from the target."""
    hidden = target_config.hidden_size
    if draft.hidden_size is not None and draft.hidden_size != hidden:
        raise UserError(
            f"draft hidden size {draft.hidden_size} != target hidden size {hidden}: the draft reads the "
            "target's embeddings and feeds its LM head, so they must match; drop draft.hidden_size"
        )
    if draft.block_size < 2:
        raise UserError(f"block size must be >= 2 (anchor + at least one drafted token), got {draft.block_size}")
    if draft.num_layers < 1:
        raise UserError(f"draft.num_layers must be >= 1, got {draft.num_layers}")
    n_target = target_config.num_hidden_layers
    layer_ids = draft.target_layer_ids
    if layer_ids is None:
        layer_ids = default_target_layer_ids(n_target, draft.num_taps or draft.num_layers)
    elif not layer_ids:
        raise UserError("target_layer_ids is empty; give at least one layer id or leave it out")
    bad = [i for i in layer_ids if not 0 <= i < n_target]
    if bad:
        raise UserError(
            f"target layer ids {bad} are out of range: the target has {n_target} decoder layers (0..{n_target - 1})"
        )
    if n_target - 1 in layer_ids:
        log.warning("tapping the target's last layer %d: captured by hook before the final norm", n_target - 1)

    heads = draft.num_attention_heads or target_config.num_attention_heads
    head_dim = draft.head_dim or getattr(target_config, "head_dim", None) or hidden // heads
    mask = resolve_mask_token(tokenizer, target_config, draft.mask_token_id)
    log.info("mask token %d (%s)", mask.token_id, mask.reason)
    return DFlashDraftConfig(
        hidden_size=hidden,
        vocab_size=target_config.vocab_size,
        num_hidden_layers=draft.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=draft.num_key_value_heads
        or getattr(target_config, "num_key_value_heads", None)
        or heads,
        head_dim=head_dim,
        intermediate_size=draft.intermediate_size or target_config.intermediate_size,
        rms_norm_eps=draft.rms_norm_eps
        or getattr(target_config, "rms_norm_eps", None)
        or getattr(target_config, "layer_norm_epsilon", 1e-6),
        max_position_embeddings=draft.max_position_embeddings or target_config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": draft.rope_theta or _rope_theta(target_config)},
        num_target_layers=n_target,
        dflash_config={
            "mask_token_id": mask.token_id,
            "target_layer_ids": list(layer_ids),
            "block_size": draft.block_size,
        },
        block_size=draft.block_size,
    )


def model_card(config: DFlashDraftConfig, target: str, recipe: str | None, n_params: int) -> str:
    return f"""---
library_name: transformers
tags: [dflash, speculative-decoding, flashdraft]
---
# DFlash draft for `{target}`

A block-diffusion speculative-decoding draft in the z-lab DFlash format (loads in vLLM, SGLang and
the `dflash` reference package). It has no embedding and no LM head: it borrows the target's.

| | |
| --- | --- |
| target | `{target}` ({config.num_target_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}) |
| recipe | {recipe or "none (shapes from the target)"} |
| draft layers | {config.num_hidden_layers} ({n_params / 1e6:.1f}M parameters) |
| target layer ids | {config.target_layer_ids} |
| mask token id | {config.mask_token_id} |
| block size | {config.block_size} |

Made by `flashdraft draft-init`; weights are freshly initialised until trained (`flashdraft train`).
"""


def write_atomically(model: DFlashDraftModel, output: Path, card: str) -> None:
    """save_pretrained into a temp folder beside `output`, then rename: no half-written draft."""
    output = output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        (tmp / "README.md").write_text(card)
        if output.exists():
            shutil.rmtree(output)
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def init_draft(
    target: str,
    output: Path,
    draft: DraftConfig,
    *,
    recipe: str | None = None,
    trust_remote_code: bool = False,
) -> DFlashDraftModel:
    source = resolve_source(target)
    target_config = load_target_config(source, trust_remote_code=trust_remote_code)
    tokenizer = load_tokenizer(source, trust_remote_code=trust_remote_code)
    config = build_draft_config(draft, target_config, tokenizer)
    torch.manual_seed(draft.seed)
    model = DFlashDraftModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    write_atomically(model, output, model_card(config, target, recipe, n_params))
    log.info("wrote a %d-layer draft (%.1fM params) to %s", config.num_hidden_layers, n_params / 1e6, output)
    return model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="hub id, local HF folder, .gguf file or packaged:smollm2")
    parser.add_argument("--output", required=True, type=Path, help="folder to write the draft into")
    parser.add_argument("--recipe", help="recipe name (e.g. nemotron_nano30b) or YAML; its `draft` section")
    parser.add_argument("--num-layers", type=int, help="draft decoder layers")
    parser.add_argument("--num-taps", type=int, help="target layers to tap (default rule spreads them)")
    parser.add_argument("--target-layer-ids", type=lambda s: [int(x) for x in s.split(",")],
                        help="explicit taps, comma separated, 0-based decoder layer outputs (e.g. 1,13,25)")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--mask-token-id", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the target's own model code")


def main(args: argparse.Namespace) -> int:
    draft = load_config(args.recipe).draft if args.recipe else DraftConfig()
    given = {
        "num_layers": args.num_layers,
        "num_taps": args.num_taps,
        "target_layer_ids": args.target_layer_ids,
        "block_size": args.block_size,
        "mask_token_id": args.mask_token_id,
        "seed": args.seed,
    }
    fields = {**vars(draft), **{k: v for k, v in given.items() if v is not None}}
    draft = from_dict(DraftConfig, fields, "draft")
    with step_run("draft-init") as tracked:
        model = init_draft(args.target, args.output, draft, recipe=args.recipe,
                           trust_remote_code=args.trust_remote_code)
        tracked.log_params({"target": args.target, "recipe": args.recipe or "", "seed": draft.seed,
                            "draft": model.config.to_diff_dict()})
        tracked.log_artifact(args.output / "README.md")
    print(f"draft written to {args.output}")
    return 0
