"""The peer's DFlash objective inside flashdraft's trainer: SpecForge 0.2.0's `OnlineDFlashModel`.

For the side-by-side quality run (issue 22) both drafts must see the same batches in the same order,
with the same draft architecture and size, optimizer, learning-rate schedule and number of steps. So the
peer runs in our trainer (data order, FSDP2, AdamW, schedule, checkpoints, z-lab export all shared) and
only the objective is SpecForge's: its anchor sampling (any position whose token and next token are
supervised, blocks may run past the answer's end), its noise embedding, its attention mask, its
decay-weighted cross-entropy normalised by the sum of the weights (its decay the one SpecForge suggests for
the block size, whatever our recipe's), one mean per micro-batch (its trainer then averages micro-batches
and ranks). Our draft module is the z-lab architecture SpecForge's
draft also implements, so the peer trains the same module and exports the same format.

Registered with flashdraft as objective `specforge` by `benchmarks/peer_train.py`; needs
`pip install --no-deps specforge==0.2.0`. Reference code is driven, not copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from flashdraft.data import Batch
from flashdraft.objectives.dflash import DFlashObjective, DFlashPrepared, decay_gamma, sample_seed


@dataclass
class PeerPrepared:
    batch: Batch
    seed: int  # the peer draws its anchors on the device: seeded per step and batch, reproducible
    ours: DFlashPrepared  # our anchors for this batch: FLOP accounting only

    @property
    def num_targets(self) -> int:
        # One unit per micro-batch: the step's loss is the mean of the micro-batches' weighted means,
        # as SpecForge's trainer takes it.
        return 1


class _Computed(nn.Module):
    """A frozen function of the target's weights, as the module the wrapper expects."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class SpecForgeObjective(DFlashObjective):
    name = "specforge"

    def bind(self, model: nn.Module, target) -> None:
        super().bind(model, target)
        self._wrapper = None  # built on the first loss, around the (possibly sharded) module it is given

    def wrapper(self, model: nn.Module):
        from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel

        if self._wrapper is None or self._wrapper.draft_model is not model:
            model.sliding_window = None  # full attention in every draft layer (what the wrapper asks)
            head, embedding, dtype = self.target.lm_head, self.target.embedding, self.compute_dtype
            # In the draft's compute dtype, as ours does it (a bf16 target beside an fp32 CPU draft).
            self._wrapper = OnlineDFlashModel(
                model, _Computed(lambda hidden: F.linear(hidden, head.weight.to(dtype))),
                _Computed(lambda ids: embedding(ids).to(dtype)), mask_token_id=self.draft_config.mask_token_id,
                block_size=self.block_size, attention_backend="flex_attention" if self.use_flex else "sdpa",
                num_anchors=self.num_anchors,
                # SpecForge's suggested decay for the block size (its --loss-decay-gamma help: 7 at B = 16,
                # 5 at 10, 4 at 8; the paper's rule), not objective.gamma: our recipe's decay is part of
                # what the comparison measures, so the peer keeps the setting its users are told to use.
                loss_decay_gamma=decay_gamma(self.block_size),
            )
        return self._wrapper

    def prepare(self, batch: Batch, step: int) -> PeerPrepared:
        return PeerPrepared(batch, sample_seed(self.config.train.seed, step, int(batch.sample_ids[0])),
                            super().prepare(batch, step))

    def loss(self, model: nn.Module, prepared: PeerPrepared) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        device = self.target.device
        batch = prepared.batch.to(device)
        features = self.target.context_features(batch.input_ids, self.draft_config.target_layer_ids,
                                                batch.attention_mask).to(self.compute_dtype)
        torch.manual_seed(prepared.seed)
        _, _, metrics = self.wrapper(model)(batch.input_ids, features, batch.loss_mask.float())
        loss_num, loss_den = metrics["loss_terms"]
        correct, tried = metrics["ratio_metrics"]["acc"]
        mean = loss_num / loss_den.clamp(min=1e-6)
        return mean, {
            "loss_sum": mean.detach().float(),
            "targets": torch.ones((), device=device),
            "tokens": batch.attention_mask.sum().float(),
            "correct": correct.float(),
            "valid": tried.float(),
        }

    def summarise(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """loss (the mean of the micro-batches' weighted means) and accuracy over supervised slots."""
        return {"loss": float(sums["loss_sum"]) / max(float(sums["targets"]), 1.0),
                "accuracy": float(sums["correct"]) / max(float(sums["valid"]), 1.0)}

    def flops(self, prepared: PeerPrepared) -> float:
        return super().flops(prepared.ours)
