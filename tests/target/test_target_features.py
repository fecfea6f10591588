"""Layer id i == the output of decoder layer i == transformers' hidden_states[i + 1] (not the last one)."""

from __future__ import annotations

import pytest
import torch

from flashdraft.target.frozen import FrozenTarget, decoder_layers


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "nemotron_h"])
def test_context_features_are_decoder_layer_outputs(tiny_target, model_type):
    target = FrozenTarget.load(str(tiny_target(model_type)), dtype=torch.float32)
    n = target.num_layers
    ids = torch.randint(4, 260, (2, 11))

    # Independent capture: plain forward hooks on every decoder layer, plus the HF tuple.
    seen = {}
    handles = [
        layer.register_forward_hook(lambda _m, _a, out, i=i: seen.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i, layer in enumerate(decoder_layers(target.model))
    ]
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
    for h in handles:
        h.remove()
    assert len(out.hidden_states) == n + 1

    taps = [3, 1, n - 1]  # out of order on purpose: features follow the given order
    features = target.context_features(ids, taps)
    assert features.shape == (2, 11, len(taps) * target.config.hidden_size)
    chunks = features.split(target.config.hidden_size, dim=-1)
    for chunk, layer in zip(chunks, taps):
        torch.testing.assert_close(chunk, seen[layer], rtol=0, atol=0)
        if layer < n - 1:
            torch.testing.assert_close(chunk, out.hidden_states[layer + 1], rtol=0, atol=0)
    # The last entry of the HF tuple is after the final norm: tapping the last layer must not use it.
    assert not torch.allclose(chunks[2], out.hidden_states[n])


def test_target_is_frozen_and_lends_embedding_and_head(tiny_target):
    target = FrozenTarget.load(str(tiny_target("qwen3")), dtype=torch.float32)
    assert not any(p.requires_grad for p in target.model.parameters())
    assert target.embedding.weight.shape[0] == target.config.vocab_size
    assert target.lm_head.out_features == target.config.vocab_size


@pytest.mark.parametrize("model_type", ["qwen3", "nemotron_h"])
def test_context_features_skip_the_layers_after_the_last_tap(tiny_target, model_type):
    target = FrozenTarget.load(str(tiny_target(model_type)), dtype=torch.float32)
    layers = decoder_layers(target.model)
    ran = []
    handles = [layer.register_forward_hook(lambda *_a, i=i: ran.append(i)) for i, layer in enumerate(layers)]
    ids = torch.randint(4, 260, (1, 9))
    target.context_features(ids, [1, 0])
    assert ran == [0, 1]
    # The full stack is back afterwards, also when the forward fails half-way.
    assert decoder_layers(target.model) is layers
    def fail(*_):
        raise RuntimeError("layer 0 failed")

    failing = layers[0].register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="layer 0 failed"):
        target.context_features(ids, [1])
    failing.remove()
    assert decoder_layers(target.model) is layers
    ran.clear()
    with torch.no_grad():
        target.model(ids)
    for h in handles:
        h.remove()
    assert ran == list(range(len(layers)))
