"""An experiment for issue 22: DFlash trained on the target's whole next-token distribution.

At one micro-batch a step our objective and the peer's compute the same loss and gradients given the same
anchors (RESULTS.md section 8), so at equal steps neither leads but by the training seed. This variant
changes one thing the peer's objective lacks: slot k of a block is scored against the target's
distribution for the token at anchor + k (its logits at position anchor + k - 1, on the true prefix)
instead of that token alone,

    loss = sum_k w_k * KL(p_target || p_draft) = sum_k w_k * sum_v p_target(v) * (log p_target(v) - log p_draft(v)),

the forward KL (the cross-entropy to soft labels less the target's entropy: the same gradient, and 0 for a
draft that matches the target). The anchors, masks, decay weights,
normaliser and the reported accuracies (argmax against the answer's tokens) are those of `dflash`. The
target now runs all its layers, not only those through the last tap: for SmolLM2-135M in the quality
runs that is 30 layers instead of 28 (the last tap is layer 27).

Registered as objective `distill` by `benchmarks/peer_train.py`. Moves to flashdraft's objective if it
lifts tau over several training seeds (quality_seeds_report.py); until then it is an experiment.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from flashdraft.objectives.dflash import DFlashObjective, DFlashPrepared
from flashdraft.objectives.flops import DecoderFlops
from flashdraft.target.frozen import capture_layer_outputs, concat_taps, decoder_layers


def soft_cross_entropy(hidden: torch.Tensor, teacher: torch.Tensor, head: torch.Tensor, weights: torch.Tensor,
                       chunk_size: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_i weights[i] * KL(softmax(teacher[i] @ head.T) || softmax(hidden[i] @ head.T)) in float32, and
    the draft's argmax. hidden, teacher [T, H]; head [V, H], frozen. `chunk_size` > 0 computes that many rows at a
    time and again in backward (checkpointed), so only one chunk's [rows x vocab] logits live at once."""
    if chunk_size <= 0:
        return _soft_chunk(hidden, teacher, head, weights)
    total = hidden.new_zeros((), dtype=torch.float32)
    preds = []
    for start in range(0, hidden.shape[0], chunk_size):
        end = start + chunk_size
        part, chunk_preds = checkpoint(_soft_chunk, hidden[start:end], teacher[start:end], head,
                                       weights[start:end], use_reentrant=False)
        total = total + part
        preds.append(chunk_preds)
    return total, torch.cat(preds) if preds else hidden.new_zeros(0, dtype=torch.long)


def _soft_chunk(hidden, teacher, head, weights):
    logits = (hidden @ head.t()).float()
    with torch.no_grad():
        log_p = F.log_softmax((teacher @ head.t()).float(), dim=-1)
    losses = (log_p.exp() * (log_p - F.log_softmax(logits, dim=-1))).sum(dim=-1)
    return (losses * weights.float()).sum(), logits.argmax(dim=-1).detach()


class DistillObjective(DFlashObjective):
    name = "distill"

    def bind(self, model: nn.Module, target) -> None:
        super().bind(model, target)
        self.target_flops = DecoderFlops(decoder_layers(target.model), self.target_config)

    @torch.no_grad()
    def target_states(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(tapped features [N, S, n_taps * H], final normed hidden states [N, S, H]) of one whole forward."""
        taps = self.draft_config.target_layer_ids
        with capture_layer_outputs(self.target.model, taps) as captured:
            out = self.target.model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                                  use_cache=False)
        return concat_taps(captured, taps), out.last_hidden_state

    def loss(self, model: nn.Module, prepared: DFlashPrepared) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        prepared = prepared.to(self.target.device)
        features, final = self.target_states(prepared.batch)
        hidden = self.draft_hidden(model, prepared, features)
        # Slot k is labelled with the token at anchor + k: the target predicts it from position anchor + k - 1.
        # Slot 0 is never supervised; the clamp only keeps its (unused) read, and those past the end, in range.
        n, seq_len, width = final.shape
        source = prepared.anchors[..., None] + torch.arange(self.block_size, device=final.device) - 1
        source = source.clamp(0, seq_len - 1).view(n, -1, 1).expand(-1, -1, width)
        teacher = final.gather(1, source).to(self.compute_dtype)  # [N, A*B, H]
        head, chunk = self.target.lm_head.weight.to(self.compute_dtype), self.config.objective.lm_head_chunk
        return self.scored(prepared, hidden,
                           lambda select, selected, labels, weights: soft_cross_entropy(selected, teacher[select],
                                                                                        head, weights, chunk))
