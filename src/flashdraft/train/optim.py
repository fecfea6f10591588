"""AdamW and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from flashdraft.config import TrainConfig


def build_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    # One fused kernel over all parameters on GPUs (the step is memory-bound: ~28 bytes per parameter).
    fused = params[0].device.type == "cuda"
    return torch.optim.AdamW(
        params, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay, fused=fused
    )


def lr_warmup_steps(train: TrainConfig, total_steps: int) -> int:
    if train.lr_warmup_steps is not None:
        return min(train.lr_warmup_steps, total_steps)
    return round(train.lr_warmup_ratio * total_steps)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup to 1 over `warmup` steps, then cosine to 0 at `total` (step is 0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    decay = max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / decay)))


def build_schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total))
