"""The target's attention in the compiled one-token decoding step as one flex-attention call a layer.

In a compiled batch-1 step, sdpa over the static cache with the runner's boolean mask is cuDNN's kernel, a
reduction and the fused kernels that prepare its inputs: up to ~0.7 ms of a Qwen3-8B step's ~5.9 ms of
kernels on one H200. flex attention reads the mask inside its kernel (inductor's split-KV decoding kernel
for short queries, each key/value head read once for its group of query heads). Measured there in one run
(bf16, batch 1, fused projections, compiled layers, CUDA graphs; benchmarks/RESULTS.md section 7): plain
step 5.71 -> 5.38 ms.

Only the one-token step: in a speculative loop's block verify on CUDA (torch 2.11, float32 with IEEE dots,
fused projections, compiled layers, CUDA graphs) it changed the greedy output from the first verify on,
while the same kernel on the same shapes alone, and every path on the CPU, gives sdpa's numbers
(RESULTS.md section 7, eighteenth session). The verify step keeps sdpa until that is understood.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# Keys per block of the kernel's block lists. Every block of the cache is listed as partial, so the mask
# decides what each query sees.
BLOCK = 128


class FlexDecodeAttention:
    """While entered, transformers' "sdpa" attention function, that of every model in the process (so enter
    it around the decoding steps only), runs flex attention in calls that torch.compile traces with a boolean
    mask, one query token and `slots` keys: the one-token step of `CompiledLayers` over a runner's static
    cache. Every other call (a prompt's eager prefill, where uncompiled flex attention is a slow reference;
    a block verify, see above) takes transformers' sdpa. On exit the function registered before is back."""

    def __init__(self, slots: int, device: torch.device):
        self.slots = slots
        # Built before anything compiles: dynamo guards on what a traced function reads, so lists built
        # while tracing would compile every layer again.
        self._counts, self._indices = _all_blocks(slots, device)
        self._previous = None

    def _attention(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
        """transformers' attention-function signature: query [B, H, 1, D], key/value [B, H_kv, slots, D],
        a boolean mask [B or 1, 1, 1, >= slots] -> ([B, 1, H, D], None)."""
        length, slots = query.shape[2], key.shape[2]
        # sdpa's extras (a position bias; softcap, which it refuses) stay with sdpa.
        extras = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
        if (not torch.compiler.is_compiling() or attention_mask is None or attention_mask.dtype != torch.bool
                or length != 1 or slots != self.slots or dropout > 0 or extras):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        mask = attention_mask[:, 0, :, :slots]
        per_row = mask.shape[0] > 1

        def visible(b, h, q_idx, kv_idx):
            # The last block reaches past the cache: flex attention hides those keys itself, but the mask is
            # read there too, so clamp the read.
            row = mask[b] if per_row else mask[0]
            return row[q_idx, torch.clamp(kv_idx, max=slots - 1)]

        block_mask = BlockMask.from_kv_blocks(self._counts, self._indices, BLOCK_SIZE=BLOCK, mask_mod=visible,
                                              seq_lengths=(1, slots), compute_q_blocks=False)
        out = flex_attention(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None

    def __enter__(self) -> FlexDecodeAttention:
        self._previous = AttentionInterface()["sdpa"]
        AttentionInterface.register("sdpa", self._attention)
        return self

    def __exit__(self, *_: object) -> None:
        AttentionInterface.register("sdpa", self._previous)


def _all_blocks(slots: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(block counts [1, 1, 1], block indices [1, 1, 1, key blocks]): every key block for the one query
    block, shared by all rows and heads."""
    kv_blocks = -(-slots // BLOCK)
    counts = torch.full((1, 1, 1), kv_blocks, dtype=torch.int32, device=device)
    return counts, torch.arange(kv_blocks, dtype=torch.int32, device=device).view(1, 1, 1, -1)
