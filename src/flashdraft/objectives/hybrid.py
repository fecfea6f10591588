"""Hybrid objective: autoregressive CE plus alpha times the MDLM diffusion loss, on the same LM.

Two forwards per micro-batch over the same samples:
- diffusion: supervised tokens masked as in `mdlm` and the corrupted sequence read bidirectionally.
  `objective.masking=uniform`: one t per sample (exactly mdlm's corruption); `block`: the sample is cut
  into blocks of `objective.mask_block_size` positions (from position 0) and each block draws its own t,
  so one sequence mixes nearly clean and nearly fully masked spans. p = (1 - eps) t + eps per position.
- autoregressive: the clean sequence under a causal mask; position i-1 predicts token i.

Normalisation. S = the supervised tokens at positions >= 1 (position 0 has nothing before it to be
predicted from, so it is left out of BOTH terms), |S| summed over all micro-steps and ranks by the trainer:

    loss = alpha * [sum over masked i in S of CE_diffusion(i) / p_i] / |S|  +  [sum over i in S of CE_ar(i)] / |S|

i.e. alpha times the mdlm loss plus the mean next-token CE, both per supervised token.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from flashdraft.config import Config
from flashdraft.data import Batch
from flashdraft.objectives.flops import lm_forward_flops
from flashdraft.objectives.mdlm import MaskedPrepared, MDLMObjective


class HybridObjective(MDLMObjective):
    name = "hybrid"
    bidirectional = False  # used both ways: the export keeps the model's own attention

    def __init__(self, config: Config, model_config, mask_token_id: int):
        super().__init__(config, model_config, mask_token_id)
        self.alpha = config.objective.alpha
        self.block = config.objective.mask_block_size if config.objective.masking == "block" else None

    @classmethod
    def plan(cls, config: Config, target_config, tokenizer) -> HybridObjective:
        # Causal models are fine here: the autoregressive term keeps what they already do.
        return cls(config, target_config, cls.check(config, target_config, tokenizer))

    def supervised(self, batch: Batch) -> torch.Tensor:
        supervised = batch.loss_mask.bool().clone()
        supervised[:, 0] = False
        return supervised

    def mask_probabilities(self, length: int, gen: torch.Generator) -> torch.Tensor:
        if self.block is None:
            return super().mask_probabilities(length, gen)
        blocks = -(-length // self.block)
        t = torch.rand(blocks, generator=gen, dtype=torch.float64)
        return ((1 - self.eps) * t + self.eps).float().repeat_interleave(self.block)[:length]

    def loss(self, model: nn.Module, prepared: MaskedPrepared) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        prepared = prepared.to(self.device)
        batch = prepared.batch
        diffusion, ce_sum, right = self.diffusion_terms(model, prepared)

        logits = self.logits(model, batch.input_ids, batch.attention_mask, causal=True)
        targets = prepared.supervised[:, 1:]
        labels = batch.input_ids[:, 1:][targets]
        predicted = logits[:, :-1][targets]
        ar = F.cross_entropy(predicted.float(), labels, reduction="sum")
        ar_right = (predicted.argmax(dim=-1) == labels).sum()

        loss_sum = self.alpha * diffusion + ar
        return loss_sum, {
            "loss_sum": loss_sum.detach().float(),
            "diffusion_sum": diffusion.detach().float(),
            "ar_sum": ar.detach().float(),
            "ar_correct": ar_right.float(),
            "targets": prepared.supervised.sum().float(),
            "tokens": batch.attention_mask.sum().float(),
            "masked": prepared.masked.sum().float(),
            "masked_ce_sum": ce_sum.float(),
            "masked_correct": right.float(),
        }

    def summarise(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        out = super().summarise(sums)
        targets = max(float(sums["targets"]), 1.0)
        out.update(
            diffusion_loss=float(sums["diffusion_sum"]) / targets,
            ar_loss=float(sums["ar_sum"]) / targets,
            ar_accuracy=float(sums["ar_correct"]) / targets,
        )
        return out

    def flops(self, prepared: MaskedPrepared) -> float:
        lengths = prepared.batch.attention_mask.sum(dim=1)
        return 3 * sum(lm_forward_flops(self.layer_flops, self.model_config, lengths, causal=causal)
                       for causal in (False, True))
