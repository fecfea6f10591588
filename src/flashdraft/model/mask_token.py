"""Choosing the MASK token of the draft's blocks: a real embedding row that no text uses.

Order: an explicit id > the tokenizer's own mask token > a spare embedding row past the tokenizer
(the Qwen3 convention: 151669) > a reserved special token (`<SPECIAL_18>`, `<|reserved_..|>`) > another
special token that the chat template does not use > an error. Never pad or eos: a draft trained with
those as MASK learns nothing useful and acceptance stays near 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flashdraft.errors import UserError

_RESERVED = re.compile(r"reserved|^<special_\d+>$|^<\|special_\d+\|>$|unused", re.IGNORECASE)


@dataclass(frozen=True)
class MaskChoice:
    token_id: int
    reason: str


def _forbidden_ids(tokenizer, config) -> set[int]:
    ids: set[int] = set()
    for source in (tokenizer, config):
        for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(v for v in value if isinstance(v, int))
    return ids


def check_mask_token(token_id: int, tokenizer, config) -> None:
    vocab = config.vocab_size
    if not 0 <= token_id < vocab:
        raise UserError(
            f"mask token id {token_id} is outside the target's embedding (vocab {vocab}); "
            f"choose an id in [0, {vocab})"
        )
    if token_id in _forbidden_ids(tokenizer, config):
        raise UserError(
            f"mask token id {token_id} is the target's pad/eos/bos token; a draft trained with it as "
            "MASK does not learn. Choose an unused reserved token (or leave --mask-token-id out)"
        )


def resolve_mask_token(tokenizer, config, explicit: int | None = None) -> MaskChoice:
    """Pick the MASK id for a target (see module docstring for the order)."""
    if explicit is not None:
        check_mask_token(explicit, tokenizer, config)
        return MaskChoice(explicit, "given explicitly")
    forbidden = _forbidden_ids(tokenizer, config)
    vocab = config.vocab_size
    if tokenizer is not None:
        own = getattr(tokenizer, "mask_token_id", None)
        if own is not None and 0 <= own < vocab and own not in forbidden:
            return MaskChoice(own, f"the tokenizer's mask token {tokenizer.mask_token!r}")
        if len(tokenizer) < vocab:
            return MaskChoice(len(tokenizer), "the first embedding row past the tokenizer's vocabulary")
        template = getattr(tokenizer, "chat_template", None) or ""
        template = template if isinstance(template, str) else " ".join(template.values())
        specials = sorted(
            (token_id, token.content)
            for token_id, token in tokenizer.added_tokens_decoder.items()
            if token.special and token_id < vocab and token_id not in forbidden
        )
        reserved = [(i, text) for i, text in specials if _RESERVED.search(text)]
        if reserved:
            token_id, text = reserved[0]
            return MaskChoice(token_id, f"reserved special token {text!r}")
        unused = [(i, text) for i, text in specials if text not in template]
        if unused:
            token_id, text = unused[-1]
            return MaskChoice(token_id, f"special token {text!r}, unused by the chat template")
    raise UserError(
        "cannot find an unused token row to use as MASK in this target (no mask token, no spare "
        "embedding rows, no reserved special tokens); pass --mask-token-id with an id the text never uses"
    )
