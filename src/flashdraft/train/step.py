"""One optimizer step's gradient accumulation over micro-batches and ranks (the trainer and the
training benchmark share it, so the benchmark times exactly the trainer's step)."""

from __future__ import annotations

import torch

from flashdraft.objectives import Objective, add_sums
from flashdraft.train.distributed import Distributed


def accumulate_gradients(objective: Objective, model: torch.nn.Module, prepared: list,
                         dist: Distributed) -> dict[str, torch.Tensor]:
    """Forward/backward over this rank's prepared micro-batches of one step; the metric sums (and the
    useful FLOPs, key "flops") over all ranks. The loss is normalised by the global `num_targets`."""
    count = float(dist.sum(torch.tensor(float(sum(p.num_targets for p in prepared)))))
    # FSDP averages gradients over ranks; the loss is a global sum / count, so undo the average.
    scale = dist.world / (count or 1.0)
    sums: dict[str, torch.Tensor] = {}
    flops = 0.0
    for p in prepared:
        loss_sum, counts = objective.loss(model, p)
        (loss_sum * scale).backward()
        add_sums(sums, counts)
        flops += objective.flops(p)
    sums["flops"] = torch.tensor(flops, dtype=torch.float64)
    return global_sums(sums, dist)


def global_sums(sums: dict[str, torch.Tensor], dist: Distributed) -> dict[str, torch.Tensor]:
    """Sum every tensor over ranks with one collective."""
    keys = sorted(sums)
    flat = torch.cat([sums[k].double().reshape(-1) for k in keys])
    flat = dist.sum(flat)
    out, offset = {}, 0
    for k in keys:
        n = sums[k].numel()
        out[k] = flat[offset : offset + n].reshape(sums[k].shape)
        offset += n
    return out
