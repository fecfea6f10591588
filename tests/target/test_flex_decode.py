"""Flex attention in the compiled decoding steps (evaluate's fast path on sdpa targets): sdpa's numbers for
any mask, evaluate's greedy output token for token with no sdpa left in the compiled steps, no
recompilation when the fast path is entered again, and transformers' own function back on exit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from decoding_helpers import NEW, PROMPT_LEN, OracleProposer, compiled_attention, eager_sdpa_calls, loops, qwen3_case
from flashdraft.decoding.decoding import generate
from flashdraft.decoding.harness import flex_decode_for
from flashdraft.target.compiled_layers import CompiledLayers
from flashdraft.target.flex_decode import FlexDecodeAttention, flex_decodes
from flashdraft.target.frozen import decoder_layers
from flashdraft.target.fused_projections import FusedProjections


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class _Attention(nn.Module):
    is_causal = True

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize("length", [1, 5])
@pytest.mark.parametrize("rows,mask_rows", [(1, 1), (2, 2), (2, 1)])
@pytest.mark.parametrize("heads", [4, 6])
def test_flex_decode_gives_sdpas_attention_for_any_mask(rows, mask_rows, length, heads):
    """Compiled (CPU inductor, float32): the same output as transformers' sdpa function for random masks over
    a cache whose length is no multiple of the kernel's block (the last block reaches past it), grouped
    heads (two a key/value head, as inductor groups them; three, folded into the query rows), one mask per
    row or one for all rows, one query token or a verify's block, the query a transposed view as
    transformers passes it."""
    torch._dynamo.reset()
    slots = 200
    gen = torch.Generator().manual_seed(rows + mask_rows + length + heads)
    query = torch.randn(rows, length, heads, 16, generator=gen).transpose(1, 2)
    key, value = torch.randn(2, rows, 2, slots, 16, generator=gen)
    mask = torch.rand(mask_rows, 1, length, slots + 7, generator=gen) < 0.3  # runner masks may be longer
    mask[..., 0] = True  # every query sees a key
    flex = FlexDecodeAttention({slots}, torch.device("cpu"))
    module = _Attention(heads // 2)

    def attend(q, k, v, m):
        return flex._attention(module, q, k, v, m, scaling=0.25)[0]

    expected = sdpa_attention_forward(module, query, key, value, mask[..., :slots], scaling=0.25)[0]
    out, ops = compiled_attention(lambda: torch.compile(attend, fullgraph=True)(query, key, value, mask))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert ops == {"flex_attention"}


def test_a_group_too_large_to_fold_keeps_sdpa():
    """Three query heads a key/value head and a 50-token verify: 150 folded rows, more than one query block,
    so the compiled call is sdpa's (the same numbers), and `flex_decodes` says so for that block."""
    torch._dynamo.reset()
    slots, length = 64, 50
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(1, length, 6, 16, generator=gen).transpose(1, 2)
    key, value = torch.randn(2, 1, 2, slots, 16, generator=gen)
    mask = torch.rand(1, 1, length, slots, generator=gen) < 0.5
    mask[..., 0] = True
    flex, module = FlexDecodeAttention({slots}, torch.device("cpu")), _Attention(3)
    out, ops = compiled_attention(lambda: torch.compile(
        lambda q, k, v, m: flex._attention(module, q, k, v, m)[0], fullgraph=True)(query, key, value, mask))
    torch.testing.assert_close(out, sdpa_attention_forward(module, query, key, value, mask)[0])
    assert ops == {"scaled_dot_product"}
    config = SimpleNamespace(num_attention_heads=6, num_key_value_heads=2)
    assert not flex_decodes(config, length) and flex_decodes(config, 16)
    assert flex_decodes(SimpleNamespace(num_attention_heads=8, num_key_value_heads=2), length)


def test_fast_path_with_flex_decode_decodes_like_eager_and_compiles_once(monkeypatch):
    """evaluate's fast path on an sdpa target (fused projections, flex attention, compiled layers), on the
    CPU in float32: transformers' eager greedy output in the plain and the speculative loop (partial accepts
    too); flex attention compiled into the one-token step and the block verify (a step that fell back to
    sdpa would time the wrong kernel without a word); eager sdpa only in the three prompts'
    prefills and the draft's first context; entering again compiles nothing new; transformers' function back."""
    torch._dynamo.reset()
    sdpa_calls = eager_sdpa_calls(monkeypatch)
    block = 5
    target, draft, ids, reference, max_len = qwen3_case(block)
    plain_runner, spec_runner, proposer = loops(target, draft, max_len)
    fast_path = [FusedProjections(target), flex_decode_for(max_len, proposer, torch.device("cpu")),
                 CompiledLayers([*decoder_layers(target), *draft.layers], lengths={1, block})]
    layers = len(decoder_layers(target))
    oracle = OracleProposer(reference, block, target.config.vocab_size, noise=0.3)
    for entry in range(2):
        sdpa_calls.clear()
        graphs = counters["stats"]["unique_graphs"]
        with fast_path[0], fast_path[1], fast_path[2]:
            plain, plain_ops = compiled_attention(lambda: generate(plain_runner, ids, max_new_tokens=NEW))
            spec, spec_ops = compiled_attention(
                lambda: generate(spec_runner, ids, proposer=proposer, max_new_tokens=NEW))
            noisy = generate(spec_runner, ids, proposer=oracle, max_new_tokens=NEW)
        assert plain.tokens == reference[:NEW] and spec.tokens == reference[:NEW]
        assert noisy.tokens == reference[:NEW] and any(0 < a < block - 1 for a in noisy.accepted)
        # Compiled on the first entry only, the draft's attention as flex attention too.
        assert (plain_ops, spec_ops) == (({"flex_attention"},) * 2 if entry == 0 else (set(), set()))
        # The three prefills and, after the second, the draft's first context (the prompt's, eager: a new
        # length).
        assert sdpa_calls == [PROMPT_LEN] * 2 * layers + [block] * len(draft.layers) + [PROMPT_LEN] * layers
        if entry:
            assert counters["stats"]["unique_graphs"] == graphs
        assert AttentionInterface()["sdpa"] is sdpa_attention_forward


class _Recorded:
    """A proposer that keeps every block of draft logits it hands out."""

    def __init__(self, proposer):
        self.proposer, self.block_size, self.logits = proposer, proposer.block_size, []

    def reset(self, max_len: int) -> None:
        self.proposer.reset(max_len)

    def propose(self, *args) -> torch.Tensor:
        self.logits.append(self.proposer.propose(*args).clone())
        return self.logits[-1]


@pytest.mark.parametrize("heads", [4, 6])
def test_the_drafts_compiled_attention_is_flex_with_eager_drafts(heads):
    """The draft's attention takes the fast path's function too: in its compiled steps (a block of queries,
    one key vector for all, over the draft's longer cache) it is flex attention, for two query heads a
    key/value head and for three (folded), and every block of draft logits is the eager draft's. Lossless
    decoding would not show a wrong draft, hence the logits."""
    torch._dynamo.reset()
    block = 5
    target, draft, ids, _, max_len = qwen3_case(block, heads=heads)
    _, spec_runner, proposer = loops(target, draft, max_len)
    eager = _Recorded(proposer)
    expected = generate(spec_runner, ids, proposer=eager, max_new_tokens=NEW)
    fast = _Recorded(proposer)
    with (flex_decode_for(max_len, proposer, torch.device("cpu")),
          CompiledLayers(draft.layers, lengths={block})):
        got, ops = compiled_attention(lambda: generate(spec_runner, ids, proposer=fast, max_new_tokens=NEW))
    assert ops == {"flex_attention"} and got.tokens == expected.tokens and len(fast.logits) > 3
    for want, have in zip(eager.logits, fast.logits, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
