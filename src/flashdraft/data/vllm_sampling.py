"""vLLM `SamplingParams` from flashdraft's sampling settings (the warmup's and the evaluation's)."""

from __future__ import annotations

from collections.abc import Iterable


def vllm_sampling(settings, *, max_tokens: int, stop_ids: Iterable[int], seed: int):
    """`settings`: temperature, top_p, top_k and greedy, as in `data.regenerate.Sampling` or
    `spec.sampling.SamplingParams`."""
    from vllm import SamplingParams

    # top_p / top_k only when on: vLLM versions disagree on how "off" is spelled.
    filters = {} if settings.greedy else {
        **({"top_p": settings.top_p} if settings.top_p < 1 else {}),
        **({"top_k": settings.top_k} if settings.top_k > 0 else {}),
    }
    return SamplingParams(temperature=settings.temperature, max_tokens=max_tokens, stop_token_ids=sorted(stop_ids),
                          seed=seed, **filters)
