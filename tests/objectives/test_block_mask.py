"""The DFlash block mask: FlexAttention == dense == a plain Python reference, for 1, 3 and many blocks."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.nn.attention.flex_attention import create_mask

from flashdraft.model.modeling import _compiled_flex_attention
from flashdraft.objectives.block_mask import dense_mask, dflash_mask_mod, flex_block_mask

BLOCK = 4
CONTEXT = 40


def reference_mask(anchors: list[list[int]], valid: list[list[bool]], context: int, block: int) -> torch.Tensor:
    """Loops over every (sample, query, key): own block always; context keys strictly before the anchor
    of a used block."""
    n, num_blocks = len(anchors), len(anchors[0])
    out = torch.zeros(n, 1, num_blocks * block, context + num_blocks * block, dtype=torch.bool)
    for s in range(n):
        for q in range(num_blocks * block):
            b = q // block
            for kv in range(context + num_blocks * block):
                if kv < context:
                    out[s, 0, q, kv] = valid[s][b] and kv < anchors[s][b]
                else:
                    out[s, 0, q, kv] = (kv - context) // block == b
    return out


def make_anchors(num_blocks: int, lengths: list[int], seed: int) -> tuple[torch.Tensor, list[list[bool]]]:
    """Sorted random anchors < length - 1 (the last blocks run past the sample's end, as the training rule
    allows); sample 1 gets only half its blocks (padding blocks = 0)."""
    gen = torch.Generator().manual_seed(seed)
    anchors = torch.zeros(len(lengths), num_blocks, dtype=torch.long)
    valid = [[False] * num_blocks for _ in lengths]
    for s, length in enumerate(lengths):
        used = num_blocks if s == 0 else max(1, num_blocks // 2)
        picks = torch.randint(0, length - 1, (used,), generator=gen).sort().values
        anchors[s, :used] = picks
        valid[s][:used] = [True] * used
    return anchors, valid


@pytest.mark.parametrize("num_blocks", [1, 3, 37])
def test_flex_dense_and_reference_masks_agree(num_blocks):
    lengths = [CONTEXT, CONTEXT - 13]  # the second sample is right-padded
    anchors, valid = make_anchors(num_blocks, lengths, seed=num_blocks)
    expected = reference_mask(anchors.tolist(), valid, CONTEXT, BLOCK)
    dense = dense_mask(anchors, CONTEXT, BLOCK)
    assert torch.equal(dense, expected)
    q_len = num_blocks * BLOCK
    flex_dense = create_mask(dflash_mask_mod(anchors, CONTEXT, BLOCK), 2, 1, q_len, CONTEXT + q_len, device="cpu")
    assert torch.equal(flex_dense, expected)
    # Padding keys of sample 1 (positions >= its length) are never visible.
    assert not dense[1, :, :, lengths[1] : CONTEXT].any()
    # Every query row sees at least its own block, so attention is always defined.
    assert dense.sum(-1).min() >= BLOCK


@pytest.mark.parametrize("num_blocks", [1, 3, 37])
def test_flex_attention_equals_sdpa_with_dense_mask(num_blocks):
    # FlexAttention runs forward only on CPU (no backward there); this is the GPU path's numerics.
    torch.manual_seed(num_blocks)
    lengths = [CONTEXT, CONTEXT - 13]
    anchors, _ = make_anchors(num_blocks, lengths, seed=num_blocks)
    q_len = num_blocks * BLOCK
    q = torch.randn(2, 4, q_len, 16)
    k = torch.randn(2, 2, CONTEXT + q_len, 16)
    v = torch.randn(2, 2, CONTEXT + q_len, 16)
    block_mask = flex_block_mask(anchors, CONTEXT, BLOCK)
    flex = _compiled_flex_attention()(q, k, v, block_mask=block_mask, enable_gqa=True)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(anchors, CONTEXT, BLOCK), enable_gqa=True)
    torch.testing.assert_close(flex, sdpa, atol=2e-6, rtol=1e-5)


def test_anchor_sees_strictly_earlier_context():
    # One block anchored at 5: keys 0..4 visible, key 5 (the anchor's own features) is not.
    anchors = torch.tensor([[5]])
    mask = dense_mask(anchors, 8, 3)[0, 0]
    assert mask[:, :5].all() and not mask[:, 5:8].any() and mask[:, 8:].all()
