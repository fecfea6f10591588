"""The DFlash block-sparse attention mask, as a FlexAttention BlockMask (GPU) or a dense boolean mask.

Layout of one sample: queries are A blocks of B slots, `[block 0 ; block 1 ; ...]` (A*B rows); keys are
the S context positions followed by the same A*B block slots. Block b (anchor a_b) sees
- context keys at positions STRICTLY before its anchor (j < a_b: the anchor's own features would reveal
  the token after it), and
- every slot of its own block (bidirectional), nothing of other blocks.
Unused (padding) blocks carry anchor 0, so they see only themselves and every row keeps a visible key.
Context padding sits at positions >= the sample's length > every anchor, so it is never visible.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

FLEX_BLOCK = 128  # create_block_mask's default BLOCK_SIZE: FlexAttention tiles keys and queries by it


def dflash_mask_mod(anchors: torch.Tensor, context_len: int, block_size: int):
    """mask_mod(b, h, q, kv) for FlexAttention; `anchors` is [N, A] (long, padding blocks = 0)."""

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        in_context = (kv_idx < context_len) & (kv_idx < anchors[b, block])
        own_block = (kv_idx >= context_len) & ((kv_idx - context_len) // block_size == block)
        return in_context | own_block

    return mask_mod


def dense_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """The same mask as a boolean [N, 1, A*B, S + A*B] tensor (True = may attend) for SDPA."""
    n, num_blocks = anchors.shape
    device = anchors.device
    q_block = torch.arange(num_blocks * block_size, device=device) // block_size  # [Q]
    ctx = torch.arange(context_len, device=device)
    sees_ctx = ctx[None, None, :] < anchors[:, q_block, None]  # [N, Q, S]
    kv_block = torch.arange(num_blocks * block_size, device=device) // block_size
    sees_block = (q_block[:, None] == kv_block[None, :]).expand(n, -1, -1)  # [N, Q, A*B]
    return torch.cat([sees_ctx, sees_block], dim=-1)[:, None]


def flex_block_mask(
    anchors: torch.Tensor, context_len: int, block_size: int, *, compile: bool | None = None
) -> BlockMask:
    """The mask as a FlexAttention BlockMask on the anchors' device.

    `compile` builds it with a compiled kernel (default on CUDA): the eager builder materialises the
    dense [Q, KV] mask per sample, which is what the block mask exists to avoid.
    """
    n, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    return create_block_mask(
        dflash_mask_mod(anchors, context_len, block_size),
        B=n,
        H=None,
        Q_LEN=q_len,
        KV_LEN=context_len + q_len,
        device=anchors.device,
        _compile=anchors.device.type == "cuda" if compile is None else compile,
    )
