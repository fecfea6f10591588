"""The cache reaches the target under the name its forward takes, on every supported transformers.

transformers before the rename takes `past_key_values=` (models) and `cache_params=` (Mamba mixers),
later releases `cache=`; a cache under an unknown name is silently dropped. CI runs one transformers,
so the older signatures are reproduced here by giving the tiny targets' forwards the old parameter
names (strict where the caller allows it), which runs both branches on whichever version is installed.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from transformers.utils.deprecation import deprecate_kwarg

from decoding_helpers import OracleProposer, hf_greedy, make_target, prompt
from flashdraft.decoding.decoding import generate
from flashdraft.decoding.hybrid_cache import RecurrentStates
from flashdraft.decoding.target_runner import TargetRunner
from flashdraft.errors import UserError
from flashdraft.target.cache_kwarg import cache_kwarg
from flashdraft.target.frozen import decoder_layers


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class _Renamed(nn.Module):
    # What newer transformers does: the new name in the signature, the old one a deprecated alias.
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(self, hidden_states, cache=None, **kwargs):
        return cache


class _Old(nn.Module):
    def forward(self, hidden_states, past_key_values=None, **kwargs):
        return past_key_values


class _OldMixer(nn.Module):
    def forward(self, hidden_states, cache_params=None, attention_mask=None):
        return cache_params


class _NoCache(nn.Module):
    # Like an MoE or MLP "mixer": no way to pass it a cache, so it keeps no state.
    def forward(self, hidden_states):
        return hidden_states


class _Hidden(nn.Module):
    # Like transformers 5.15's Mamba mixers, whose decorator hides the signature.
    def forward(self, *args, **kwargs):
        return None


@pytest.mark.parametrize("module,name", [(_Renamed(), "cache"), (_Old(), "past_key_values"),
                                         (_OldMixer(), "cache_params"), (_NoCache(), None)])
def test_cache_kwarg_reads_the_signature(module, name):
    assert cache_kwarg(module) == name


def test_a_hidden_cache_name_is_refused_not_guessed():
    with pytest.raises(UserError, match=r'pip install -U "transformers>=5.24"'):
        cache_kwarg(_Hidden())


def test_hybrid_whose_mixers_hide_their_signature_is_refused():
    """On transformers 5.15 the Mamba rollback cannot know how to pass the cache: a clear error, not a
    silently lossy decode (skipping the mixers would leave their states unrolled)."""
    target = make_target("nemotron_h")
    for layer in decoder_layers(target):
        if type(layer.mixer).__name__.endswith("Mixer"):
            current = type(layer.mixer).forward.__get__(layer.mixer)
            layer.mixer.forward = lambda *args, _f=current, **kwargs: _f(*args, **kwargs)
    with pytest.raises(UserError, match=r"NemotronHMamba2Mixer.*transformers>=5.24"):
        TargetRunner(target, [1, 2, 4], 32)


def _legacy_model_forward(target, seen: list):
    """Give `target` a forward with the old `past_key_values` name and no **kwargs: any other cache
    keyword is a TypeError, and a missing cache leaves `seen` with a None."""
    current = type(target).forward.__get__(target)
    name = cache_kwarg(target)

    def forward(self, input_ids, position_ids, attention_mask, past_key_values, use_cache, logits_to_keep):
        seen.append(past_key_values)
        return current(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                       use_cache=use_cache, logits_to_keep=logits_to_keep, **{name: past_key_values})

    target.forward = types.MethodType(forward, target)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_old_past_key_values_signature_gets_the_cache_and_stays_lossless(model_type):
    target = make_target(model_type)
    ids = prompt(2)
    block, new = 5, 30
    reference = hf_greedy(target, ids, new + block)
    seen: list = []
    _legacy_model_forward(target, seen)
    assert cache_kwarg(target) == "past_key_values"
    runner = TargetRunner(target, [1, 2, 4], ids.shape[1] + new + block + 1)
    oracle = OracleProposer(reference, block, target.config.vocab_size, noise=0.3, seed=3)
    spec = generate(runner, ids, proposer=oracle, max_new_tokens=new)
    assert spec.tokens == reference[:new] and len(set(spec.accepted)) > 1
    assert seen and all(cache is runner.cache for cache in seen)


def _legacy_mixer_forward(mixer: nn.Module, via_cache_params: list):
    """Give a Mamba mixer the old `cache_params` name. The decoder block of the installed transformers
    still calls it with its own keyword; only the rollback's replay has to choose `cache_params`."""
    current = type(mixer).forward.__get__(mixer)
    name = cache_kwarg(mixer)

    def forward(self, hidden_states, cache_params=None, attention_mask=None, **block_kwargs):
        if cache_params is not None:
            via_cache_params.append(cache_params)
        else:
            cache_params = block_kwargs.pop(name)
        return current(hidden_states, attention_mask=attention_mask, **{name: cache_params}, **block_kwargs)

    mixer.forward = types.MethodType(forward, mixer)


def test_old_cache_params_mixer_signature_rolls_back_exactly():
    target = make_target("nemotron_h")
    ids = prompt(2)
    block, new = 5, 40
    reference = hf_greedy(target, ids, new + block)
    via_cache_params: list = []
    mixers = [layer.mixer for layer in decoder_layers(target) if type(layer.mixer).__name__.endswith("Mixer")]
    assert len(mixers) == 2
    for mixer in mixers:
        _legacy_mixer_forward(mixer, via_cache_params)
    runner = TargetRunner(target, [1, 2, 4], ids.shape[1] + new + block + 1)
    assert isinstance(runner.recurrent, RecurrentStates) and len(runner.recurrent.mixers) == 2
    oracle = OracleProposer(reference, block, target.config.vocab_size, noise=0.3, seed=3)
    spec = generate(runner, ids, proposer=oracle, max_new_tokens=new)
    assert spec.tokens == reference[:new]
    # Every partial accept replays both mixers through `cache_params=` (the last step may be cut short).
    partial = sum(1 for n in spec.accepted[:-1] if n < block - 1)
    assert partial >= 3
    assert len(via_cache_params) >= 2 * partial
    assert all(cache is runner.cache for cache in via_cache_params)
