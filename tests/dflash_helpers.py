"""Configs and batches shared by the DFlash objective tests (CPU) and the GPU tests."""

from __future__ import annotations

import torch

from flashdraft.config import Config, from_dict
from flashdraft.data import Batch

BLOCK = 4


def make_config(target_path, **strategy) -> Config:
    return from_dict(
        Config,
        {
            "target": {"name_or_path": str(target_path)},
            "draft": {"num_layers": 2, "block_size": BLOCK, "target_layer_ids": [1, 3]},
            "objective": {"num_anchors": 6, "lm_head_chunk": 7, **strategy},
        },
    )


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
