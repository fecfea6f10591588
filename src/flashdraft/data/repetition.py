"""Verbatim loops in generated answers.

A small target sampled at a low temperature often falls into a loop: it repeats a sentence or a list
item until the token limit cuts it off. A draft trained on such answers spends most of its supervision
on repeats rather than on the text the target writes before it loops. A token counts as
looped when the LOOP_WINDOW tokens ending at it already occurred, in the same order, earlier in the same
answer: ordinary prose repeats short phrases, but hardly ever 32 tokens verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence

LOOP_WINDOW = 32
# Above this share of looped answer tokens the warmup warns. Measured (benchmarks/RESULTS.md section 8,
# run 4): SmolLM2-135M-Instruct's answers to the same 31 prompts, 512 new tokens, are 45% looped at its
# card's T=0.2 / top-p 0.9 and 4% at T=0.8; ordinary answers that stop on their own, ~5%.
LOOPED_WARNING = 0.2


def repeat_distances(token_ids: Sequence[int], window: int = LOOP_WINDOW) -> list[int]:
    """For each token of one answer: how many tokens back the `window`-token run ending at it last occurred,
    0 where it did not occur before (the token is not looped)."""
    last: dict[tuple[int, ...], int] = {}
    distances = [0] * len(token_ids)
    for end in range(window, len(token_ids) + 1):
        run = tuple(token_ids[end - window:end])
        if run in last:
            distances[end - 1] = end - last[run]
        last[run] = end
    return distances


def looped_flags(token_ids: Sequence[int], window: int = LOOP_WINDOW) -> list[bool]:
    """For each token of one answer: does it end a `window`-token run that already occurred earlier in it?"""
    return [distance > 0 for distance in repeat_distances(token_ids, window)]


def looped_tokens(token_ids: Sequence[int], window: int = LOOP_WINDOW) -> int:
    """How many tokens of one answer end a `window`-token run that already occurred earlier in it."""
    return sum(looped_flags(token_ids, window))
