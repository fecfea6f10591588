"""The vLLM sampling settings of the warmup and the --vllm evaluation (checked against a stand-in
`vllm.SamplingParams` that records its arguments; vLLM itself runs only on GPU machines)."""

from __future__ import annotations

import sys
import types

import pytest

from flashdraft.data.regenerate import Sampling
from flashdraft.decoding.sampling import SamplingParams
from flashdraft.data.vllm_sampling import vllm_sampling


@pytest.fixture
def recorded(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kwargs: kwargs
    monkeypatch.setitem(sys.modules, "vllm", module)


@pytest.mark.usefixtures("recorded")
def test_filters_are_passed_only_when_on_and_never_when_greedy():
    common = {"max_tokens": 8, "stop_token_ids": [2, 7], "seed": 3}
    args = {"max_tokens": 8, "stop_ids": {7, 2}, "seed": 3}
    assert vllm_sampling(SamplingParams(), **args) == {"temperature": 0.0, **common}
    assert vllm_sampling(SamplingParams(0.0, top_p=0.5, top_k=4), **args) == {"temperature": 0.0, **common}
    assert vllm_sampling(SamplingParams(0.7, top_p=0.9), **args) == {"temperature": 0.7, "top_p": 0.9, **common}
    assert vllm_sampling(Sampling(64, 0.6, 1.0, 20), **args) == {"temperature": 0.6, "top_k": 20, **common}
