"""One matmul for the projections that read the same input: q, k and v; gate and up.

A batch-1 decode step is ~7 matrix-vector products a layer, and each small one reads its weights below
the GPU's bandwidth and adds a launch (and a split-K reduction) to the step. Reading q/k/v and gate/up with
one matmul each leaves 4 a layer. Measured on one H200, Qwen3-8B shape, bf16, batch 1, compiled layers and
CUDA graphs (benchmarks/RESULTS.md section 7): plain step 7.30 -> 6.32 ms, draft + verify 9.12 -> 8.42 ms.

The fused weight is built once and the model's own linears keep working: their weights become views of
it, so the target takes no extra memory and code that runs the model as it is (transformers' generate)
sees the same modules. While entered, the fused modules stand in for the separate ones.
"""

from __future__ import annotations

import torch
from torch import nn

from flashdraft.target.frozen import decoder_layers

# (submodule of a decoder layer, the linears of it that read one input), as Llama-family layers name them.
GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


class _Group:
    """The shared matmul of one group: the first member called with a new input computes all parts; the
    others take theirs from it while they are called with that same input. Not a module, so the fused
    weight is never counted (or moved) twice with the model's own."""

    def __init__(self, linears: list[nn.Linear]):
        self.weight = torch.cat([linear.weight.detach() for linear in linears])
        # All members have a bias or none (FusedProjections skips mixed groups).
        self.bias = torch.cat([linear.bias.detach() for linear in linears]) if linears[0].bias is not None else None
        self.sizes = [linear.out_features for linear in linears]
        start = 0
        for linear, size in zip(linears, self.sizes):
            linear.weight.data = self.weight[start:start + size]
            if self.bias is not None:
                linear.bias.data = self.bias[start:start + size]
            start += size
        self.input: torch.Tensor | None = None
        self.parts: list[torch.Tensor] = []
        self.pending = 0

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if x is not self.input:
            self.input = x
            self.parts = list(nn.functional.linear(x, self.weight, self.bias).split(self.sizes, -1))
            self.pending = len(self.sizes)
        out = self.parts[index]
        self.pending -= 1
        if self.pending == 0:  # every part handed out: keep no activation (a long prefill's are large)
            self.input, self.parts = None, []
        return out


class _Part(nn.Module):
    def __init__(self, group: _Group, index: int):
        super().__init__()
        self.group = group
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.part(x, self.index)


class FusedProjections:
    """While entered, each decoder layer's q/k/v and gate/up linears (plain `nn.Linear`s, all with a bias or
    none) run as one matmul a group; the model's own linears are back on exit. Groups a layer lacks
    (a hybrid's Mamba blocks, an MLP without a gate) stay as they are. The same stand-in modules are used at
    every entry, so code compiled with them in place stays valid."""

    def __init__(self, model: nn.Module):
        self.swaps: list[tuple[nn.Module, str, nn.Linear, _Part]] = []
        for layer in decoder_layers(model):
            for parent_name, names in GROUPS:
                parent = getattr(layer, parent_name, None)
                linears = [getattr(parent, name, None) for name in names]
                if not all(type(linear) is nn.Linear for linear in linears):
                    continue
                if len({linear.bias is None for linear in linears}) > 1:
                    continue
                group = _Group(linears)
                self.swaps += [(parent, name, linear, _Part(group, index))
                               for index, (name, linear) in enumerate(zip(names, linears))]

    @property
    def groups(self) -> int:
        return len({id(part.group) for *_, part in self.swaps})

    def __enter__(self) -> FusedProjections:
        for _parent, name, linear, part in self.swaps:
            # Casting or moving the model gives its linears new tensors; the fused weight would then be stale.
            if linear.weight.untyped_storage().data_ptr() != part.group.weight.untyped_storage().data_ptr():
                raise RuntimeError(f"fused projections: {name} no longer reads the fused weight (the model was "
                                   "cast or moved after they were built); build them again")
        for parent, name, _linear, part in self.swaps:
            setattr(parent, name, part)
        return self

    def __exit__(self, *_: object) -> None:
        for parent, name, linear, _part in self.swaps:
            setattr(parent, name, linear)
