"""Compiled decoder layers for the fixed-shape decoding steps (evaluate's loops, the graphed warmup
backend): fewer, fused kernels per step.

A decode step is the weight reads (the matmuls) plus ~40 tiny kernels a layer (norms, rotary embedding,
activations, residual adds, cache writes), each a few microseconds even inside a CUDA graph.
torch.compile fuses those; the matmuls stay cuBLAS's. Measured on one H200, Qwen3-8B shape, bf16, batch 1
(benchmarks/RESULTS.md section 7): plain step 9.75 -> 8.55 ms, draft + verify step 13.85 -> 9.63 ms.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable

import torch
from torch import nn


def compiles_by_default(device: torch.device, hybrid: bool) -> bool:
    """evaluate.compile unset: on CUDA devices, for attention-only targets (a hybrid's Mamba layers run
    their own kernels and roll their state back from recorded steps, which compiled code would hide)."""
    return device.type == "cuda" and not hybrid


class CompiledLayers:
    """While entered, each given layer runs a torch.compile'd forward (fixed shapes) for the decoding
    steps' own lengths and its eager forward for any other: a prompt's prefill, or the draft's first
    context, has a new length each sequence and would compile again inside the timed loop. On exit the
    eager forwards are back, for code that feeds every length (transformers' generate with a growing
    cache). The compiled code is kept between entries. Module hooks (the taps of the draft's features)
    stay outside and eager.

    `lengths`: the sequence lengths of the fixed-shape steps (1 for a plain step, the block for a verify
    and a draft step). A call is compiled when every 3-D positional tensor it gets (the hidden states;
    the draft's context too) is that long.
    `dynamic`: the other sizes (rows, cache slots) change between uses, as in the batch decoder, whose
    every batch has its own rows and cache: one graph a layer then serves them all, where fixed shapes
    would compile every layer again for each batch.
    """

    def __init__(self, layers: Iterable[nn.Module], lengths: Collection[int], dynamic: bool = False):
        self.layers = list(layers)
        self.lengths = frozenset(lengths)
        # The cache picks a layer's slot by indexing a list with its `layer_idx`, so dynamo specialises on
        # it: one graph per (layer, step length), all of one code object where the layers share a class.
        # Past `recompile_limit` dynamo runs the remaining layers eagerly without an error (a Qwen3-8B
        # target's 36 layers x 2 lengths passed the default 8 and the 64 set here before).
        # With dynamic sizes a size of 1 (a batch of one row) still specialises: a second graph a layer.
        # The limit counts every graph of the code object, also those of other models compiled earlier in
        # the process (evaluate's loops, then a batch decoder; tests), so it is raised by this set's graphs:
        # transformers wraps every decoder layer class's forward in one function, one code object for all.
        graphs = len(self.layers) * len(self.lengths) * (2 if dynamic else 1)
        config = torch._dynamo.config
        config.recompile_limit += graphs
        config.accumulated_recompile_limit += graphs
        self.compiled = [torch.compile(layer.forward, dynamic=dynamic) for layer in self.layers]

    def __enter__(self) -> CompiledLayers:
        for layer, compiled in zip(self.layers, self.compiled):
            layer.forward = functools.partial(_by_length, self.lengths, compiled, layer.forward)
        return self

    def __exit__(self, *_: object) -> None:
        for layer in self.layers:
            del layer.forward  # the class's eager forward again


def _by_length(lengths: frozenset[int], compiled: Callable, eager: Callable, *args, **kwargs):
    fixed = all(a.shape[1] in lengths for a in args if isinstance(a, torch.Tensor) and a.dim() == 3)
    return (compiled if fixed else eager)(*args, **kwargs)
