"""Flex attention in the compiled decoding steps (evaluate's fast path on sdpa targets): sdpa's numbers for
any mask, evaluate's greedy output token for token with no sdpa left in a compiled step, no recompilation
when the fast path is entered again, and transformers' own function back on exit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from decoding_helpers import NEW, OracleProposer, loops, qwen3_case
from flashdraft.decoding.decoding import generate
from flashdraft.target import flex_decode
from flashdraft.target.compiled_layers import CompiledLayers
from flashdraft.target.flex_decode import FlexDecodeAttention
from flashdraft.target.frozen import decoder_layers
from flashdraft.target.fused_projections import FusedProjections


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class _Attention(nn.Module):
    num_key_value_groups = 2
    is_causal = True


@pytest.mark.parametrize("length,rows,mask_rows", [(1, 1, 1), (5, 2, 2), (5, 2, 1)])
def test_flex_decode_gives_sdpas_attention_for_any_mask(rows, mask_rows, length):
    """Compiled (CPU inductor, float32): the same output as transformers' sdpa function for random masks over
    a cache whose length is no multiple of the kernel's block (the last block reaches past it), grouped
    heads, one mask per row or one for all rows."""
    torch._dynamo.reset()
    slots = 200
    gen = torch.Generator().manual_seed(length + rows)
    query = torch.randn(rows, 4, length, 16, generator=gen)
    key, value = torch.randn(2, rows, 2, slots, 16, generator=gen)
    mask = torch.rand(mask_rows, 1, length, slots + 7, generator=gen) < 0.3  # runner masks may be longer
    mask[..., 0] = True  # every query sees a key
    flex = FlexDecodeAttention({length}, slots, torch.device("cpu"))
    module = _Attention()

    def attend(q, k, v, m):
        return flex._attention(module, q, k, v, m, scaling=0.25)[0]

    expected = sdpa_attention_forward(module, query, key, value, mask[..., :slots], scaling=0.25)[0]
    torch.testing.assert_close(torch.compile(attend, fullgraph=True)(query, key, value, mask), expected,
                               rtol=1e-5, atol=1e-5)


def test_fast_path_with_flex_decode_decodes_like_eager_and_compiles_once(monkeypatch):
    """evaluate's fast path on an sdpa target (fused projections, flex attention, compiled layers), on the
    CPU in float32: transformers' eager greedy output in the plain and the speculative loop (partial accepts
    too); sdpa only in the two prompts' eager prefills (a compiled step that fell back to it would time the
    wrong kernel without a word); entering again compiles nothing new; transformers' function back on exit."""
    torch._dynamo.reset()
    sdpa_calls = []

    def counted_sdpa(*args, **kwargs):
        sdpa_calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    monkeypatch.setattr(flex_decode, "sdpa_attention_forward", counted_sdpa)
    block = 5
    target, draft, ids, reference, max_len = qwen3_case(block)
    plain_runner, spec_runner, proposer = loops(target, draft, max_len)
    fast_path = [FusedProjections(target), FlexDecodeAttention({1, block}, max_len, torch.device("cpu")),
                 CompiledLayers([*decoder_layers(target), *draft.layers], lengths={1, block})]
    layers = len(decoder_layers(target))
    oracle = OracleProposer(reference, block, target.config.vocab_size, noise=0.3)
    for entry in range(2):
        sdpa_calls.clear()
        graphs = counters["stats"]["unique_graphs"]
        with fast_path[0], fast_path[1], fast_path[2]:
            assert generate(plain_runner, ids, max_new_tokens=NEW).tokens == reference[:NEW]
            assert generate(spec_runner, ids, proposer=proposer, max_new_tokens=NEW).tokens == reference[:NEW]
            noisy = generate(spec_runner, ids, proposer=oracle, max_new_tokens=NEW)
        assert noisy.tokens == reference[:NEW] and any(0 < a < block - 1 for a in noisy.accepted)
        assert len(sdpa_calls) == 3 * layers  # the three prefills
        if entry:
            assert counters["stats"]["unique_graphs"] == graphs
        assert AttentionInterface()["sdpa"] is sdpa_attention_forward
