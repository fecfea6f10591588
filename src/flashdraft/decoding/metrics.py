"""Acceptance and speed numbers from decoded sequences, counted the way z-lab, SGLang and vLLM count.

tau of a verify step = tokens it emits (accepted drafts + the bonus, at most B). Reported both as the
mean over requests of each request's mean (z-lab) and pooled, total tokens / total steps (SGLang,
vLLM). Per-slot acceptance of draft slot k (1..B-1): the share of steps whose first k drafts were all
accepted, and the same conditioned on the first k-1 being accepted (the a_k of tau ~ 1 + sum prod a_j).
"""

from __future__ import annotations

from collections.abc import Sequence

from flashdraft.decoding.decoding import Generation


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def acceptance(generations: Sequence[Generation], block_size: int) -> dict:
    steps = [e for g in generations for e in g.emitted]
    accepted = [a for g in generations for a in g.accepted]
    per_request = [sum(g.emitted) / len(g.emitted) for g in generations if g.emitted]
    histogram = [0] * (block_size + 1)  # index = tokens emitted by a step (0 never happens)
    for e in steps:
        histogram[e] += 1
    reached = [sum(a >= k for a in accepted) for k in range(block_size)]  # reached[0] = all steps
    return {
        "tau_mean_of_requests": _mean(per_request),
        "tau_pooled": sum(steps) / len(steps) if steps else None,
        "verify_steps": len(steps),
        "accept_length_histogram": {str(k): histogram[k] for k in range(1, block_size + 1)},
        "slot_acceptance": [reached[k] / reached[0] if reached[0] else None for k in range(1, block_size)],
        "slot_acceptance_conditional": [
            reached[k] / reached[k - 1] if reached[k - 1] else None for k in range(1, block_size)
        ],
    }


def throughput(generations: Sequence[Generation]) -> dict:
    """Decode tokens per second over all requests (prefill excluded: its token and its time)."""
    tokens = sum(g.decode_tokens for g in generations)
    seconds = sum(g.decode_s for g in generations)
    return {
        "decode_tokens": tokens,
        "decode_seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "new_tokens": sum(len(g.tokens) for g in generations),
    }


def lossless_fraction(spec: Sequence[Generation], plain: Sequence[Generation]) -> float:
    """Share of prompts whose speculative output equals the plain greedy output, token for token."""
    same = sum(s.tokens == p.tokens for s, p in zip(spec, plain, strict=True))
    return same / len(spec)


def step_time(seconds: float, steps: int, floor_ms: float) -> dict:
    """Milliseconds a decoding step (a token for plain decoding, a draft + verify step for speculative
    decoding) and its ratio to the step's floor (memory_floor)."""
    ms = 1000 * seconds / steps if steps else None
    return {"ms_per_step": ms, "floor_ms_per_step": floor_ms, "vs_floor": ms / floor_ms if ms is not None else None}
