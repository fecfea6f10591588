"""The acceptance rule of speculative decoding (batch 1, on the device); token choice is
`flashdraft.data.sampling`'s.

Greedy (temperature 0): the drafts are accepted while they equal the target's argmax; the target's
token at the first mismatch is the bonus. Sampling: standard speculative sampling (Leviathan et al.
2023, Chen et al. 2023): draft x_k ~ q_k is kept with probability min(1, p_k(x_k) / q_k(x_k)); at the
first rejection the bonus is drawn from norm(max(p_k - q_k, 0)), and after a full accept from the
target's next distribution. The output then follows the target's (filtered) sampling distribution
exactly, whatever the draft.
"""

from __future__ import annotations

import torch

from flashdraft.data.sampling import sample


def accept_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [k], target logits [k+1, V] -> (number of accepted drafts, bonus token), both 0-d."""
    posterior = target_logits.argmax(dim=-1)
    accepted = (drafts == posterior[:-1]).int().cumprod(dim=0).sum()
    return accepted, posterior[accepted]


def accept_sampled(
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [k] drawn from draft_probs [k, V]; target_probs [k+1, V] -> (accepted count, bonus)."""
    k = drafts.shape[0]
    p = target_probs[:k].gather(-1, drafts[:, None])[:, 0]
    q = draft_probs.gather(-1, drafts[:, None])[:, 0]
    u = torch.rand(k, generator=generator, device=drafts.device)
    # u < p/q without dividing; q > 0 because each draft was drawn from q.
    accepted = (u * q < p).int().cumprod(dim=0).sum()
    residual = torch.cat([(target_probs[:k] - draft_probs).clamp_min(0), target_probs[k:]])[accepted]
    total = residual.sum()
    # An all-zero residual means p == q on that slot, where rejection has probability 0; keep p then.
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny),
                           target_probs[accepted])
    return accepted, sample(residual, generator)
