"""Who proposes the drafts: the DFlash draft model (or any object with the same `propose`).

The decoding loop only calls `reset(max_len)` once per sequence and then
`propose(anchor, start, context, valid) -> logits [1, B-1, V]` once per step, where the block is
[anchor, MASK x (B-1)] at positions start..start+B-1 and `context` holds the target's tapped features
of the tokens verified since the last call: positions start-valid.. (only the first `valid` rows are
real; a fixed-shape step passes the whole previous block). A different proposer (e.g. an oracle in
the tests) plugs into the same loop.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from flashdraft.model.modeling import DFlashDraftModel


class Proposer(Protocol):
    block_size: int

    def reset(self, max_len: int) -> None: ...

    def propose(
        self, anchor: torch.Tensor, start: torch.Tensor, context: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor: ...


class ContextKV:
    """Preallocated draft KV cache (duck-types transformers' `Cache.update`): writes at `length`.

    Holds the context keys/values of every verified token; a draft forward also writes its block's
    keys after them, which the next step overwrites (the length is set back to the context end).
    """

    def __init__(self, num_layers: int, max_len: int):
        self.max_len = max_len
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *_, **__):
        if self.keys[layer_idx] is None:
            shape = (keys.shape[0], keys.shape[1], self.max_len, keys.shape[3])
            self.keys[layer_idx] = keys.new_zeros(shape)
            self.values[layer_idx] = values.new_zeros(shape)
        index = self.length + torch.arange(keys.shape[2], device=keys.device)
        self.keys[layer_idx].index_copy_(2, index, keys)
        self.values[layer_idx].index_copy_(2, index, values)
        return self.keys[layer_idx], self.values[layer_idx]


class DraftProposer:
    """DFlash draft + the target's embedding and LM head (both frozen, borrowed)."""

    def __init__(
        self, draft: DFlashDraftModel, embedding: nn.Module, lm_head: nn.Module, block_size: int | None = None
    ):
        self.draft = draft.eval()
        self.embedding = embedding
        self.lm_head = lm_head
        self.block_size = int(block_size or draft.block_size)
        self.device = embedding.weight.device
        self._masks = torch.full(
            (1, self.block_size - 1), draft.mask_token_id, dtype=torch.long, device=self.device
        )
        self._slots = torch.arange(self.block_size, device=self.device)
        self.kv: ContextKV | None = None

    def cache_slots(self, max_len: int) -> int:
        """The draft's key/value cache length for sequences of `max_len` tokens: the context of every
        token plus one block past the end."""
        return max_len + self.block_size

    def reset(self, max_len: int) -> None:
        size = self.cache_slots(max_len)
        if self.kv is None or self.kv.max_len < size:
            self.kv = ContextKV(self.draft.config.num_hidden_layers, size)
            self.kv.length = torch.zeros((), dtype=torch.long, device=self.device)
            self._key_positions = torch.arange(size, device=self.device)
        # Same buffers for every sequence: captured CUDA graphs keep pointing at them.
        self.kv.length.zero_()

    @torch.no_grad()
    def propose(
        self, anchor: torch.Tensor, start: torch.Tensor, context: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        ctx_len = context.shape[1]
        ctx_start = start - valid
        self.kv.length.copy_(ctx_start)
        block = torch.cat([anchor.view(1, 1), self._masks], dim=1)
        positions = torch.cat([ctx_start + torch.arange(ctx_len, device=self.device), start + self._slots])
        keys = self._key_positions
        block_keys = ctx_start + ctx_len
        # Queries see every real context key (< start) and their own block, bidirectionally.
        visible = (keys < start) | ((keys >= block_keys) & (keys < block_keys + self.block_size))
        hidden = self.draft(
            position_ids=positions[None],
            noise_embedding=self.embedding(block),
            target_hidden=context,
            attention_mask=visible[None, None, None, :],
            past_key_values=self.kv,
        )
        self.kv.length.copy_(start)
        return self.lm_head(hidden[:, 1:]).float()
