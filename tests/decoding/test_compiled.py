"""Compiled decoder layers (evaluate's default on GPUs) decode exactly as the eager ones, and the floor
a step is measured against counts the bytes a step reads."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from decoding_helpers import NEW, OracleProposer, hf_greedy, loops, make_draft, make_target, prompt
from flashdraft.target.compiled_layers import CompiledLayers, compiles_by_default
from flashdraft.decoding.decoding import generate
from flashdraft.decoding.memory_floor import (
    copy_bandwidth, floor_ms, parameter_bytes, speculative_step_bytes, target_step_bytes,
)
from flashdraft.target.frozen import decoder_layers


def recompile_limit_hits() -> int:
    return sum(n for reason, n in counters["unimplemented"].items() if "recompile limit" in reason)


@torch._dynamo.config.patch(recompile_limit=1)  # restored after the test
def test_compiled_layers_decode_token_for_token_like_eager():
    """float32 on the CPU (inductor): plain and speculative greedy outputs of the compiled target and
    draft equal transformers' eager greedy output; a noisy oracle makes the verify accept partial blocks,
    so the compiled verify and its cache rollback are exercised, not just whole-block accepts. Only the
    fixed-length steps compile: a prompt of another length (its prefill, the draft's first context)
    decodes with no new compile, which evaluate's timed loops would otherwise pay. Every layer runs its
    compiled code even where dynamo's recompile limit starts below one graph per (layer, step length):
    past the limit dynamo would run the remaining layers eagerly without a word."""
    torch.set_num_threads(1)
    # Graphs of earlier tests' layers count toward the limit of their shared code (transformers' layer
    # call wrapper): without them, the limit of 1 is this test's alone, in any test order.
    torch._dynamo.reset()
    hits = recompile_limit_hits()
    target = make_target("qwen3")
    block = 5
    ids = prompt()
    longer = torch.randint(4, 260, (1, ids.shape[1] + 7), generator=torch.Generator().manual_seed(1))
    reference = hf_greedy(target, ids, NEW + block)
    reference_longer = hf_greedy(target, longer, NEW)
    draft = make_draft(target, block_size=block)
    max_len = longer.shape[1] + NEW + block + 1  # one size for every prompt, as evaluate sizes its runners
    plain_runner, spec_runner, proposer = loops(target, draft, max_len)
    layers = CompiledLayers([*decoder_layers(target), *draft.layers], lengths={1, block})
    with layers:
        assert all("forward" in vars(layer) for layer in [*target.model.layers, *draft.layers])
        assert generate(plain_runner, ids, max_new_tokens=NEW).tokens == reference[:NEW]
        assert generate(spec_runner, ids, proposer=proposer, max_new_tokens=NEW).tokens == reference[:NEW]
        noisy = generate(spec_runner, ids, proposer=OracleProposer(reference, block, target.config.vocab_size,
                                                                   noise=0.3), max_new_tokens=NEW)
        assert noisy.tokens == reference[:NEW] and any(0 < a < block - 1 for a in noisy.accepted)
        graphs = counters["stats"]["unique_graphs"]
        assert graphs > 0
        assert generate(plain_runner, longer, max_new_tokens=NEW).tokens == reference_longer
        assert generate(spec_runner, longer, proposer=proposer, max_new_tokens=NEW).tokens == reference_longer
        assert counters["stats"]["unique_graphs"] == graphs
    assert recompile_limit_hits() == hits
    # Outside, the eager forwards are back (transformers' generate feeds every length).
    assert not any("forward" in vars(layer) for layer in [*target.model.layers, *draft.layers])
    assert hf_greedy(target, ids, NEW) == reference[:NEW]


@pytest.mark.parametrize("device, hybrid, compiled", [("cuda", False, True), ("cuda", True, False),
                                                      ("cpu", False, False)])
def test_decoding_compiles_by_default_on_gpus_for_attention_targets(device, hybrid, compiled):
    assert compiles_by_default(torch.device(device), hybrid) is compiled


@pytest.mark.parametrize("tied", [False, True])
def test_step_bytes_count_what_a_step_reads(tied):
    """Every weight once; the input embedding table only where it is also the output head (one row of
    it is gathered otherwise). A speculative step adds the draft's layers and the head's second read."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    table = 1000 * 32 * 2  # bytes of the [vocab, hidden] bf16 table
    everything = sum(p.numel() * 2 for p in model.parameters())  # shared tensors are listed once
    assert target_step_bytes(model) == (everything if tied else everything - table)
    draft = make_draft(make_target("qwen3"), block_size=4).to(torch.bfloat16)
    assert speculative_step_bytes(model, draft) == target_step_bytes(model) + parameter_bytes(draft) + table


def test_floor_is_bytes_over_the_measured_bandwidth():
    bandwidth = copy_bandwidth(torch.device("cpu"), size=2**24, repeats=2)
    assert 1e8 < bandwidth < 1e13  # a copy of 16 MiB runs at some memory's speed
    assert floor_ms(int(bandwidth), bandwidth) == pytest.approx(1000.0)
