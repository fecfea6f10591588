"""Verbatim loops in generated answers.

A small target sampled at a low temperature often falls into a loop: it repeats a sentence or a list
item until the token limit cuts it off. A draft trained on such answers spends its training on copying
loops, and its teacher-forced tau on them says little about decoding ordinary text. A token counts as
looped when the LOOP_WINDOW tokens ending at it already occurred, in the same order, earlier in the same
answer: ordinary prose repeats short phrases, but hardly ever 32 tokens verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence

LOOP_WINDOW = 32
# Above this share of looped answer tokens the warmup warns (an illustrative reading: SmolLM2-135M at
# T=0.2, top-p 0.9 loops on 59% of its answer tokens, at the Nemotron recipe's T=0.8 far fewer).
LOOPED_WARNING = 0.2


def looped_tokens(token_ids: Sequence[int], window: int = LOOP_WINDOW) -> int:
    """How many tokens of one answer end a `window`-token run that already occurred earlier in it."""
    seen: set[tuple[int, ...]] = set()
    looped = 0
    for end in range(window, len(token_ids) + 1):
        run = tuple(token_ids[end - window:end])
        if run in seen:
            looped += 1
        else:
            seen.add(run)
    return looped
