"""How tokens are chosen: one settings type for the warmup's regeneration and the evaluation's decoding,
the target's own recommendation (its generation_config), and the same settings spelled for vLLM."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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
