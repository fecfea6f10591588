"""An evaluate report small enough to write by hand, for the quality report scripts' tests."""

from __future__ import annotations


def report(steps: list[int], tokens: int = 60) -> dict:
    """An evaluate report with one benchmark: a prompt per entry of `steps`, `tokens` new tokens each."""
    per_prompt = [{"new_tokens": tokens, "verify_steps": s, "tau": tokens / s} for s in steps]
    histogram = {"1": sum(steps), "2": 0}  # only the shares of steps accepting >= k tokens read it
    spec = {"tau_pooled": tokens * len(steps) / sum(steps), "tau_mean_of_requests": 1.0, "ms_per_step": 2.0,
            "accept_length_histogram": histogram}
    return {"benchmarks": {"gsm8k": {"num_prompts": len(steps), "speculative": spec, "speedup": 0.5,
                                     "autoregressive": {"ms_per_step": 1.0}, "lossless": 1.0,
                                     "per_prompt": per_prompt}}}
