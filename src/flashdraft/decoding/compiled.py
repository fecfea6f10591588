"""Compiled decoder layers for the decoding loops: fewer, fused kernels per step.

At batch 1 a target step is the weight reads (the matmuls) plus ~40 tiny kernels a layer (norms,
rotary embedding, activations, residual adds, cache writes), each a few microseconds even inside a CUDA
graph. torch.compile fuses those; the matmuls stay cuBLAS's. Measured on one H200, Qwen3-8B shape, bf16
(benchmarks/RESULTS.md section 7): plain step 9.75 -> 8.55 ms, draft + verify step 13.85 -> 9.63 ms.
"""

from __future__ import annotations

import torch
from torch import nn

from flashdraft.target.frozen import decoder_layers


def compiles_by_default(device: torch.device, hybrid: bool) -> bool:
    """evaluate.compile unset: on CUDA devices, for attention-only targets (a hybrid's Mamba layers run
    their own kernels and roll their state back from recorded steps, which compiled code would hide)."""
    return device.type == "cuda" and not hybrid


class CompiledLayers:
    """While entered, each decoder layer's forward is a torch.compile'd one (fixed shapes); on exit the
    eager forwards are back, for code that feeds the model shapes of every length (transformers'
    generate with a growing cache would recompile each step). The compiled code is kept between entries.
    The module's hooks, which tap hidden states for the draft, stay outside and eager."""

    def __init__(self, model: nn.Module):
        # A layer's attention reads its `layer_idx` (the cache slot); as a static int it would compile
        # once per layer, as a dynamic one all layers share a graph.
        torch._dynamo.config.allow_unspec_int_on_nn_module = True
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self.layers = list(decoder_layers(model))
        self.compiled = [torch.compile(layer.forward, dynamic=False) for layer in self.layers]

    def __enter__(self) -> CompiledLayers:
        for layer, forward in zip(self.layers, self.compiled):
            layer.forward = forward
        return self

    def __exit__(self, *_: object) -> None:
        for layer in self.layers:
            del layer.forward  # the class's eager forward again
