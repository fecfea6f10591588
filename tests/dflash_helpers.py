"""Configs, batches, objectives and drafts shared by the DFlash objective tests (CPU) and the GPU tests."""

from __future__ import annotations

from pathlib import Path

import torch

from flashdraft.config import Config, from_dict, load_config
from flashdraft.data import Batch
from flashdraft.objectives import get_objective
from flashdraft.stages import draft_init
from flashdraft.target.source import load_target_config, load_tokenizer
from flashdraft.train.models import load_models

BLOCK = 4
DRAFT = {"num_layers": 2, "block_size": BLOCK, "target_layer_ids": [1, 3]}


def make_config(target_path, **objective) -> Config:
    return from_dict(
        Config,
        {
            "target": {"name_or_path": str(target_path)},
            "draft": DRAFT,
            "objective": {"num_anchors": 6, "lm_head_chunk": 7, **objective},
        },
    )


def make_objective(target_path, device: torch.device = torch.device("cpu"), **objective):
    """A dflash objective bound to its target and draft on `device`, as the trainer makes them, with the
    draft's weights perturbed (a fresh draft has zero-ish norms; random ones make gradients informative)."""
    config = make_config(target_path, **objective)
    planned = get_objective("dflash").plan(config, load_target_config(str(target_path)),
                                           load_tokenizer(str(target_path)))
    planned.use_device(device)
    draft = load_models(config, planned, device).model
    torch.manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return planned, draft


def bound_like(cls, ours, draft, target_path):
    """An objective of class `cls` (a variant of dflash) planned from `ours`' config and bound to the same
    target and draft on the CPU."""
    other = cls.plan(ours.config, load_target_config(str(target_path)), load_tokenizer(str(target_path)))
    other.use_device(torch.device("cpu"))
    other.bind(draft, ours.target)
    return other


def write_draft(target_path, output: Path, **draft) -> Path:
    """`flashdraft draft-init` for `target_path` into `output` (draft section: DRAFT updated by `draft`)."""
    values = {"target.name_or_path": str(target_path), "draft.output_dir": str(output),
              **{f"draft.{k}": v for k, v in {**DRAFT, **draft}.items()}}
    return draft_init.run(load_config(None, values=values)).path


def make_batch(lengths=(30, 19), seed=0, prompt=6) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    seq = max(lengths)
    ids = torch.randint(4, 260, (len(lengths), seq), generator=gen)
    attn = torch.zeros(len(lengths), seq, dtype=torch.long)
    loss_mask = torch.zeros(len(lengths), seq, dtype=torch.bool)
    for row, length in enumerate(lengths):
        attn[row, :length] = 1
        loss_mask[row, prompt:length] = True
        loss_mask[row, prompt + 9] = False  # an unsupervised token inside the response
        ids[row, length:] = 0
    return Batch(ids, attn, loss_mask, torch.arange(len(lengths)) + 100)
