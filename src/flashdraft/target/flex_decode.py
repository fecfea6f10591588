"""The attention of the compiled decoding steps, the target's and the draft's, as one flex-attention call a layer.

In a compiled batch-1 step, sdpa over the static cache with the runner's boolean mask is cuDNN's kernel, a
reduction and the fused kernels that prepare its inputs: up to ~0.7 ms of a Qwen3-8B step's ~5.9 ms of
kernels on one H200. flex attention reads the mask inside its kernel (inductor's split-KV decoding kernel
for short queries, each key/value head read once for its group of query heads). Measured there in one run
(bf16, batch 1, fused projections, compiled layers, CUDA graphs; benchmarks/RESULTS.md section 7,
nineteenth session): plain step 5.72 -> 5.26 ms, draft + verify 8.29 -> 7.50 ms.

The query goes in contiguous. transformers hands it over as a transposed view of [B, q, H, D]; inside a
compiled layer on CUDA (torch 2.11) a block verify's flex call over that layout changed the greedy output
from the first verify on, although the same call on the same inputs alone, and every path on the CPU, gives
sdpa's numbers; with the copy the loop decodes the eager output (the same section).

Inductor runs flex attention as that decoding kernel only where the query heads a key/value head serves are
a power of two; other groupings get its main kernel, one block per query head, never measured faster than
sdpa for decoding (SmolLM2-135M, 9 query heads over 3, bf16, one H100: 15.2 ms a plain step against 3.1 ms
in float32 with eager attention, section 8). For those groupings each key/value head's query heads are
folded into the query rows (a verify of q tokens over a group of g heads: one head of g * q rows, all
reading the same keys), which the decoding kernel serves as plain multi-head attention. Worth it: sdpa's
cuDNN kernel for a masked 16-token verify took 55 us a layer there, against 5 us for one token. The draft's
16 queries over its own cache went the same way (cuDNN's 30 us a layer -> flex's ~23 us with its reductions;
the draft + verify step 2.32 -> 2.24 ms side by side on one H100, section 8).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# Keys per block of the kernel's block lists. Every block of the cache is listed as partial, so the mask
# decides what each query sees.
BLOCK = 128


def flex_decodes(config, block: int) -> bool:
    """Whether `FlexDecodeAttention` runs this target's one-token and `block`-token verify attention as
    inductor's split-KV flex decoding kernel: query heads per key/value head a power of two (torch's
    `_use_flex_decoding`, which reads a group as one block's rows), or few enough to fold a verify's
    queries of the whole group into one query block."""
    groups = _groups(config.num_attention_heads, getattr(config, "num_key_value_heads", None))
    return groups > 0 and (_power_of_two(groups) or groups * block <= BLOCK)


def _groups(heads: int, kv_heads: int | None) -> int:
    return heads // (kv_heads or heads)


def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


class FlexDecodeAttention:
    """While entered, transformers' "sdpa" attention function, that of every model in the process (so enter
    it around the decoding steps only), runs flex attention in calls that torch.compile traces with a boolean
    mask, keys of one of the cache sizes `slots` and at most BLOCK query rows (tokens, times the heads of a
    group where those fold): the fixed-shape steps of `CompiledLayers` over the runners' static caches (one
    token, a block verify) and the draft's (its block's queries; the draft's attention takes this function
    too). Every other call (a prompt's eager prefill, where uncompiled flex attention is a slow reference)
    takes transformers' sdpa. On exit the function that was registered before is back."""

    def __init__(self, slots: Collection[int], device: torch.device):
        # Built before anything compiles: dynamo guards on what a traced function reads, so lists built
        # while tracing would compile every layer again.
        self._blocks = {size: _all_blocks(size, device) for size in slots}
        self._previous = None

    def _attention(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
        """transformers' attention-function signature: query [B, H, q, D], key/value [B, H_kv, slots, D],
        a boolean mask [B or 1, 1, q, >= slots] -> ([B, q, H, D], None)."""
        length, slots = query.shape[2], key.shape[2]
        groups = _groups(query.shape[1], key.shape[1])
        fold = not _power_of_two(groups)
        # sdpa's extras (a position bias; softcap, which it refuses) stay with sdpa.
        extras = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
        if (not torch.compiler.is_compiling() or attention_mask is None or attention_mask.dtype != torch.bool
                or (groups if fold else 1) * length > BLOCK or slots not in self._blocks or dropout > 0 or extras):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        mask = attention_mask[:, 0, :, :slots]
        # The draft's mask is one key vector for its whole block; the target's has one for each query.
        per_row, per_query = mask.shape[0] > 1, mask.shape[1] > 1
        batch, heads, _, dim = query.shape
        # Folded: query head h reads key/value head h // groups (transformers' repeat_kv), so the heads of
        # one group are adjacent and become rows g * length + t of that key/value head, t the token.
        rows = groups * length if fold else length
        query = query.reshape(batch, key.shape[1], rows, dim) if fold else query.contiguous()

        def visible(b, h, q_idx, kv_idx):
            # The last block reaches past the cache: flex attention hides those keys itself, but the mask is
            # read there too, so clamp the read.
            row = mask[b] if per_row else mask[0]
            token = (q_idx % length if fold else q_idx) if per_query else 0
            return row[token, torch.clamp(kv_idx, max=slots - 1)]

        counts, indices = self._blocks[slots]
        block_mask = BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=BLOCK, mask_mod=visible,
                                              seq_lengths=(rows, slots), compute_q_blocks=False)
        out = flex_attention(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=not fold)
        return out.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None

    def __enter__(self) -> FlexDecodeAttention:
        self._previous = AttentionInterface()["sdpa"]
        AttentionInterface.register("sdpa", self._attention)
        return self

    def __exit__(self, *_: object) -> None:
        AttentionInterface.register("sdpa", self._previous)


def _all_blocks(slots: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(block counts [1, 1, 1], block indices [1, 1, 1, key blocks]): every key block for the one query
    block (queries of at most BLOCK tokens), shared by all rows and heads."""
    kv_blocks = -(-slots // BLOCK)
    counts = torch.full((1, 1, 1), kv_blocks, dtype=torch.int32, device=device)
    return counts, torch.arange(kv_blocks, dtype=torch.int32, device=device).view(1, 1, 1, -1)
