"""Exports as HF folders (save_pretrained + README.md), written atomically: a DFlash draft, or a diffusion
LM trained in full (mdlm / hybrid) with its tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from flashdraft.files import atomic_dir
from flashdraft.model.card import DraftCard, FineTuneCard
from flashdraft.model.config import DFlashDraftConfig
from flashdraft.model.modeling import DFlashDraftModel


def _write(path: str | Path, model: nn.Module, card: str, tokenizer=None) -> Path:
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(card)
    return Path(path)


def export_draft(draft: DFlashDraftModel, path: str | Path, card: DraftCard) -> Path:
    """The draft as an HF folder in the z-lab format."""
    return _write(path, draft, card.render())


def draft_from_state(config: DFlashDraftConfig, state_dict: dict[str, torch.Tensor],
                     dtype: torch.dtype) -> DFlashDraftModel:
    draft = DFlashDraftModel(config)
    draft.load_state_dict(state_dict)
    return draft.to(dtype)


def lm_from_state(model_config, state_dict: dict[str, torch.Tensor], *, dtype: torch.dtype,
                  trust_remote_code: bool = False) -> nn.Module:
    """The LM of `model_config` holding `state_dict` (tied weights tied again), in `dtype`."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config, trust_remote_code=trust_remote_code)
    model.load_state_dict(state_dict, strict=False, assign=True)
    model.tie_weights()
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"export: the trained state has no values for {missing[:5]}")
    return model.to(dtype)


def export_lm(model: nn.Module, tokenizer, path: str | Path, card: FineTuneCard, *, bidirectional: bool) -> Path:
    """The LM with its tokenizer as an HF folder. `bidirectional`: marked is_causal=False, so that plain
    transformers runs it the way it was trained."""
    model.config.use_cache = True
    if bidirectional:
        model.config.is_causal = False
    return _write(path, model, card.render(), tokenizer)
