"""Chat datasets: sources, tokenisation with loss masks, and response regeneration with the target.

`Batch` is what the data loader hands to a training objective; this module stays import-light (torch
only) so that benchmarks can build batches without `datasets`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    """Right-padded token rows of one micro-batch.

    input_ids, attention_mask (1 = real token), loss_mask (True = supervised token): [N, S];
    sample_ids: [N], each row's index in the dataset, which seeds per-sample randomness (anchors), so a
    sample gets the same draws however the global batch is split over ranks and micro-steps.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sample_ids: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())
