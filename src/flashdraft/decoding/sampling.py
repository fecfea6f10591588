"""Token choice and the acceptance rule of speculative decoding (batch 1, on the device).

Greedy (temperature 0): the drafts are accepted while they equal the target's argmax; the target's
token at the first mismatch is the bonus. Sampling: standard speculative sampling (Leviathan et al.
2023, Chen et al. 2023): draft x_k ~ q_k is kept with probability min(1, p_k(x_k) / q_k(x_k)); at the
first rejection the bonus is drawn from norm(max(p_k - q_k, 0)), and after a full accept from the
target's next distribution. The output then follows the target's (filtered) sampling distribution
exactly, whatever the draft.
"""

from __future__ import annotations

import torch

from flashdraft.data.sampling import Sampling


def sampling_probs(logits: torch.Tensor, params: Sampling) -> torch.Tensor:
    """[..., V] logits -> float32 probabilities after temperature, top-k and top-p."""
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of [..., V] probabilities."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def choose(
    logits: torch.Tensor, params: Sampling, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens for [..., V] logits and, when sampling, the distribution they were drawn from."""
    if params.greedy:
        return logits.argmax(dim=-1), None
    probs = sampling_probs(logits, params)
    return sample(probs, generator), probs


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
