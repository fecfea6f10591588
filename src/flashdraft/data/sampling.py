"""How tokens are chosen: one settings type for the warmup's regeneration and the evaluation's decoding,
the token choice itself (temperature, top-k, top-p on the device), the target's own recommendation (its
generation_config), and the same settings spelled for vLLM."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from flashdraft.errors import UserError


@dataclass(frozen=True)
class Sampling:
    """temperature 0 = greedy; top_p 1.0 and top_k 0 switch those filters off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UserError(f"top-k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# Top-p looks at this many of the likeliest tokens first: where they hold top_p of the mass (every row of a
# batch), the nucleus lies among them and the vocabulary is not sorted. At the regeneration's T=0.2 they
# always do; sorting SmolLM2's 49,152 logits of 1,024 rows took 7.7 ms of a 30 ms decode step (one H100,
# benchmarks/RESULTS.md section 8).
TOP_P_CANDIDATES = 64


def sampling_probs(logits: torch.Tensor, params: Sampling) -> torch.Tensor:
    """[..., V] logits -> float32 probabilities after temperature, top-k and top-p."""
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1:
        candidates = min(TOP_P_CANDIDATES, probs.shape[-1])
        ranked, order = probs.topk(candidates, dim=-1)  # descending, as a full sort's first entries
        # Over a vocabulary of at most `candidates` tokens the ranking is already the full sort.
        if candidates < probs.shape[-1] and not bool((ranked.sum(dim=-1) >= params.top_p).all()):
            ranked, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays). Where the candidates
        # hold top_p, every later token has at least that much mass before it: the full sort would drop it too.
        drop = ranked.cumsum(dim=-1) - ranked >= params.top_p
        probs = torch.zeros_like(probs).scatter(-1, order, ranked.masked_fill(drop, 0.0))
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


def target_sampling(
    generation_config,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
) -> Sampling:
    """The target's recommended sampling (its generation_config), with explicit values taking precedence."""
    sampled = bool(getattr(generation_config, "do_sample", False))
    if temperature is None:
        temperature = (getattr(generation_config, "temperature", None) or 1.0) if sampled else 0.0
    if top_p is None:
        top_p = (getattr(generation_config, "top_p", None) or 1.0) if sampled else 1.0
    if top_k is None:
        top_k = (getattr(generation_config, "top_k", None) or 0) if sampled else 0
    return Sampling(float(temperature), float(top_p), int(top_k))


def vllm_sampling(sampling: Sampling, *, max_tokens: int, stop_ids: Iterable[int], seed: int):
    """vLLM's `SamplingParams` for `sampling` (imports vllm)."""
    from vllm import SamplingParams

    # top_p / top_k only when on: vLLM versions disagree on how "off" is spelled.
    filters = {} if sampling.greedy else {
        **({"top_p": sampling.top_p} if sampling.top_p < 1 else {}),
        **({"top_k": sampling.top_k} if sampling.top_k > 0 else {}),
    }
    return SamplingParams(temperature=sampling.temperature, max_tokens=max_tokens, stop_token_ids=sorted(stop_ids),
                          seed=seed, **filters)
