"""The fused q/k/v and gate/up projections of evaluate's GPU fast path: the separate projections' numbers,
no extra weight memory, the model's own modules back on exit, and token-for-token decoding when compiled."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from decoding_helpers import NEW, OracleProposer, hf_greedy, loops, make_target, prompt, qwen3_case
from flashdraft.decoding.decoding import generate
from flashdraft.target.compiled_layers import CompiledLayers
from flashdraft.target.frozen import decoder_layers
from flashdraft.target.fused_projections import FusedProjections
from tiny_models import tiny_config


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def biased_llama() -> nn.Module:
    config = tiny_config("llama")
    config.attention_bias = config.mlp_bias = True  # q/k/v and gate/up with biases: fused with theirs
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            nn.init.normal_(param, std=0.1)  # zero biases would hide a bias put in the wrong rows
    return model


@pytest.mark.parametrize("model", ["qwen3", "llama with biases", "nemotron_h"])
def test_fused_projections_give_the_separate_projections_logits_in_no_extra_memory(model):
    """float32: the same logits as the separate projections; two groups a layer where a layer has them
    (a hybrid's Mamba and MoE blocks have none); the model's own linears read views of the fused weight
    (no copy) and are back in place on exit, still giving the same logits."""
    target = biased_llama() if model == "llama with biases" else make_target(model)
    ids = prompt()
    own = linears(target)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    with torch.no_grad():
        reference = target(ids).logits
        fused = FusedProjections(target)
        layers = decoder_layers(target)
        expected = 0 if model == "nemotron_h" else 2 * len(layers)
        assert fused.groups == expected
        with fused:
            if expected:
                assert all(type(layer.self_attn.q_proj) is not nn.Linear for layer in layers)
            torch.testing.assert_close(target(ids).logits, reference, rtol=1e-5, atol=1e-5)
        assert linears(target) == own
        torch.testing.assert_close(target(ids).logits, reference, rtol=1e-5, atol=1e-5)
    assert sum(p.numel() * p.element_size() for p in target.parameters()) == weight_bytes
    if expected:
        attn = layers[0].self_attn
        storage = attn.q_proj.weight.untyped_storage().data_ptr()
        assert {p.untyped_storage().data_ptr() for p in (attn.k_proj.weight, attn.v_proj.weight)} == {storage}


class _KFirst(nn.Module):
    """A layer that calls its projections out of the usual order, and v on another input."""

    def __init__(self):
        super().__init__()
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(self.self_attn, name, nn.Linear(8, 4, bias=False))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = self.self_attn
        return torch.cat([a.k_proj(x), a.q_proj(x), a.v_proj(y), a.k_proj(y)], -1)


def test_fused_projections_do_not_depend_on_call_order_or_a_shared_input():
    """Each projection returns its own product whatever order the layer calls them in and whichever
    inputs it gives them: the fused matmul is only reused for the very input it was computed on."""
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleList([_KFirst()])
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    layer = model.layers[0]
    with torch.no_grad():
        reference = layer(x, y)
        with FusedProjections(model):
            torch.testing.assert_close(layer(x, y), reference)
            torch.testing.assert_close(layer(x, y), reference)


def test_fused_and_compiled_layers_decode_token_for_token_like_eager():
    """evaluate's GPU fast path, here on the CPU in float32: fused projections inside compiled layers give
    transformers' eager greedy output in the plain loop and the speculative one, partial accepts too."""
    torch._dynamo.reset()  # earlier tests' graphs of the shared layer code would count toward its limit
    block = 5
    target, draft, ids, reference, max_len = qwen3_case(block)
    plain_runner, spec_runner, proposer = loops(target, draft, max_len)
    fused = FusedProjections(target)
    compiled = CompiledLayers([*decoder_layers(target), *draft.layers], lengths={1, block})
    with fused, compiled:
        assert generate(plain_runner, ids, max_new_tokens=NEW).tokens == reference[:NEW]
        assert generate(spec_runner, ids, proposer=proposer, max_new_tokens=NEW).tokens == reference[:NEW]
        noisy = generate(spec_runner, ids, proposer=OracleProposer(reference, block, target.config.vocab_size,
                                                                   noise=0.3), max_new_tokens=NEW)
        assert noisy.tokens == reference[:NEW] and any(0 < a < block - 1 for a in noisy.accepted)
    assert hf_greedy(target, ids, NEW) == reference[:NEW]


def test_fused_projections_refuse_a_model_cast_after_they_were_built():
    """A cast gives the linears new tensors: entering would run the stale fused weight, so it is refused."""
    target = make_target("qwen3")
    fused = FusedProjections(target)
    target.double()
    with pytest.raises(RuntimeError, match="cast or moved"):
        fused.__enter__()
    assert all(type(layer.self_attn.q_proj) is nn.Linear for layer in decoder_layers(target))
