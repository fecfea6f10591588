"""Grouped-query attention without copying the cache gives transformers' sdpa attention, and a model
switched to it decodes as before."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flashdraft.target.grouped_attention import NAME, grouped_sdpa, register


@pytest.mark.parametrize("queries", [1, 5])
@pytest.mark.parametrize("additive", [False, True])
def test_grouped_attention_equals_repeated_heads(queries, additive):
    """float32, 8 query heads over 2 key/value heads, a per-row mask with padding and unfilled slots:
    the same output as transformers' sdpa path, which repeats the key/value heads."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    batch, heads, kv_heads, dim, slots = 3, 8, 2, 16, 24
    module = nn.Module()
    module.num_key_value_groups, module.is_causal = heads // kv_heads, True
    query = torch.randn(batch, heads, queries, dim)
    key, value = torch.randn(batch, kv_heads, slots, dim), torch.randn(batch, kv_heads, slots, dim)
    visible = torch.rand(batch, 1, queries, slots) < 0.7
    visible[..., 0] = True  # every row sees something
    mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min) if additive else visible
    ours, _ = grouped_sdpa(module, query, key, value, mask, scaling=dim ** -0.5)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim ** -0.5)
    assert ours.shape == (batch, queries, heads, dim)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    # Query head h reads key/value head h // 4: a change in value head 1 moves heads 4..7 only.
    value[:, 1] += 1.0
    moved, _ = grouped_sdpa(module, query, key, value, mask, scaling=dim ** -0.5)
    assert torch.equal(moved[:, :, :4], ours[:, :, :4]) and not torch.allclose(moved[:, :, 4:], ours[:, :, 4:])


def test_a_model_switched_to_grouped_attention_gives_the_same_logits(tiny_target):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target("qwen3"), dtype=torch.float32).eval()
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    ids = torch.randint(4, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0  # left padding: a 4-D mask reaches the attention
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation(register())
        assert model.config._attn_implementation == NAME
        grouped = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(grouped[1], reference[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped[0, 3:], reference[0, 3:], rtol=1e-5, atol=1e-5)
