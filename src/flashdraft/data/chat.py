"""Chat conversations -> token ids + a loss mask that is True exactly on the assistant's tokens.

Works for any chat template, also those without `{% generation %}` markers: the conversation is rendered
prefix by prefix. For the i-th message, if it is the assistant's, its rendered text is what the template
adds between `messages[:i]` + the generation prompt and `messages[:i+1]` (the turn's end marker
included, so the draft learns to stop). Those character spans are located in the full rendering, the
full text is tokenised once with offsets, and a token is supervised when it starts inside a span.
"""

from __future__ import annotations

import os

from flashdraft.errors import UserError


def _render(tokenizer, messages: list[dict], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character spans of its assistant turns."""
    text = _render(tokenizer, messages)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation_prompt=True) if i else ""
        upto = _render(tokenizer, messages[: i + 1])
        common = len(os.path.commonprefix([before, upto]))
        if text.startswith(upto):
            span = (common, len(upto))
        else:
            # The template rewrote this turn once later ones follow (e.g. it drops old reasoning):
            # supervise the longest tail of its rendering found after the previous turn, if that tail
            # reaches into the content (a bare end-of-turn marker could be any turn's).
            piece = upto[common:]
            tail = _longest_tail_in(piece, text, cursor)
            if tail <= len(piece) - len(message["content"].lstrip()):
                continue
            start = text.find(piece[-tail:], cursor)
            span = (start, start + tail)
        if span[1] > span[0]:
            spans.append(span)
            cursor = span[1]
    return text, spans


def _longest_tail_in(piece: str, text: str, start: int) -> int:
    """The length of the longest suffix of `piece` that occurs in text[start:] (suffix containment is
    monotone in the length, so binary search)."""
    low, high = 0, len(piece)
    while low < high:
        mid = (low + high + 1) // 2
        if text.find(piece[-mid:], start) >= 0:
            low = mid
        else:
            high = mid - 1
    return low


def tokenize_chat(tokenizer, messages: list[dict], max_length: int) -> tuple[list[int], list[bool]]:
    """Token ids (at most `max_length`, the start kept) and the assistant-token loss mask."""
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_length]
    mask = []
    span_index = 0
    for start, _end in encoded["offset_mapping"][: len(ids)]:
        while span_index < len(spans) and start >= spans[span_index][1]:
            span_index += 1
        mask.append(span_index < len(spans) and spans[span_index][0] <= start)
    return ids, mask


def check_tokenizer(tokenizer) -> None:
    """Fail early on tokenizers this module cannot use."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "the target's tokenizer has no chat template, so assistant turns cannot be located; use an "
            "instruct/chat target or a tokenizer folder that has one"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(
            "the target's tokenizer is a slow (Python) tokenizer without character offsets; install "
            "`tokenizers` and use a folder with tokenizer.json"
        )
