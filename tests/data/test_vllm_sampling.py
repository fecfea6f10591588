"""The one sampling type: its checks, the target's recommendation, and its vLLM spelling (checked against a
stand-in `vllm.SamplingParams` that records its arguments; vLLM itself runs only on GPU machines)."""

from __future__ import annotations

import sys
import types

import pytest
from transformers import GenerationConfig

from flashdraft.data.sampling import Sampling, target_sampling, vllm_sampling
from flashdraft.errors import UserError


@pytest.fixture
def recorded(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kwargs: kwargs
    monkeypatch.setitem(sys.modules, "vllm", module)


@pytest.mark.usefixtures("recorded")
def test_filters_are_passed_only_when_on_and_never_when_greedy():
    common = {"max_tokens": 8, "stop_token_ids": [2, 7], "seed": 3}
    args = {"max_tokens": 8, "stop_ids": {7, 2}, "seed": 3}
    assert vllm_sampling(Sampling(), **args) == {"temperature": 0.0, **common}
    assert vllm_sampling(Sampling(0.0, top_p=0.5, top_k=4), **args) == {"temperature": 0.0, **common}
    assert vllm_sampling(Sampling(0.7, top_p=0.9), **args) == {"temperature": 0.7, "top_p": 0.9, **common}
    assert vllm_sampling(Sampling(0.6, 1.0, 20), **args) == {"temperature": 0.6, "top_k": 20, **common}


def test_sampling_follows_the_generation_config_unless_given():
    sampled = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.95, top_k=20)
    assert target_sampling(sampled) == Sampling(0.6, 0.95, 20)
    assert target_sampling(sampled, temperature=0.0).greedy
    assert target_sampling(GenerationConfig()) == Sampling()
    with pytest.raises(UserError, match="top-p must be in"):
        target_sampling(GenerationConfig(), top_p=0)
