"""Batched decoding of an attention-only causal LM on a static cache, each decode step replayed as one CUDA
graph: the warmup's `graphed` regeneration backend.

transformers' `generate` spends tens of milliseconds of host time on every decode step of a batch
(benchmarks/RESULTS.md, "Data at scale": ~60 ms a step for a 135M model at batch 32), so on a GPU its
throughput is set by the host, not the model. Here the prompts are left-padded into one static cache, and
every decode step has the same shapes (the batch's tokens, one cache slot, a mask computed from that slot
on the device), so it is captured once per call and replayed. Attention runs grouped
(`grouped_attention`): the query heads that share a key/value head read it once, not a copy of the cache
per head. In long runs on a GPU the decoder layers run compiled in the decode steps (`compiled_layers`;
eager, a step is ~40 tiny kernels a layer), one graph a layer for every batch's shapes. All rows step
together; a row that has stopped keeps stepping until every row has stopped or reached its limit, and its
tokens past the stop are dropped by the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn
from transformers import StaticCache

from flashdraft.errors import UserError
from flashdraft.target import grouped_attention
from flashdraft.target.cache_kwarg import cache_kwarg
from flashdraft.target.compiled_layers import CompiledLayers
from flashdraft.target.frozen import decoder_layers
from flashdraft.target.step_graphs import StepGraphs

# Rows' stop states are read back every this many steps: each read waits for the device.
STOP_CHECK_EVERY = 16
# Compiled layers cost ~85 s of compilation a process and save ~2.2 ms a decode step (SmolLM2's shape,
# 64 rows, one H200: benchmarks/RESULTS.md section 6), so they pay from about 40,000 decode steps.
COMPILE_MIN_STEPS = 40_000
GRAPHED_REFUSAL = "use warmup.backend static or continuous"


def set_cache_length(cache: StaticCache, length: torch.Tensor | int) -> None:
    """Where the next forward writes in every attention layer of `cache` (graph-safe for a device tensor)."""
    lengths = [layer.cumulative_length for layer in cache.layers
               if hasattr(layer, "cumulative_length") and layer.is_initialized]
    if not lengths:
        return
    if isinstance(length, torch.Tensor):
        torch._foreach_copy_(lengths, [length] * len(lengths))  # one fused launch, no host sync
    else:
        for value in lengths:
            value.fill_(length)


def kv_cache_bytes(config, slots: int, dtype: torch.dtype) -> int:
    """Bytes of the keys and values of `slots` cache slots (rows x positions) over every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * slots * dtype.itemsize


def has_sliding_window(config) -> bool:
    """Whether a model of `config` has sliding-window attention layers (which static_cache refuses)."""
    return _sliding(StaticCache(config=config, max_cache_len=1))


def _sliding(cache: StaticCache) -> bool:
    return any(getattr(layer, "is_sliding", False) for layer in cache.layers)


def static_cache(config, max_len: int, refusal: str) -> StaticCache:
    """A static KV cache for a model of `config` (its tensors come with the first forward); a UserError
    ending in `refusal` (what to do instead) where the model has sliding-window layers, whose window the
    masks of static-cache decoding do not apply."""
    cache = StaticCache(config=config, max_cache_len=max_len)
    if _sliding(cache):
        raise UserError(f"{getattr(config, 'model_type', 'this model')} has sliding-window attention layers, which "
                        f"static-cache decoding does not handle yet; {refusal}")
    return cache


def compiles_layers(device: torch.device, decode_steps: int) -> bool:
    """Whether a run of about `decode_steps` batched decode steps should compile the decoder layers: on a
    GPU, when the steps repay the compilation (CPUs keep the eager layers)."""
    return device.type == "cuda" and decode_steps >= COMPILE_MIN_STEPS


class BatchDecoder:
    """`decode` runs a batch of prompts to their limits; token choice is the caller's `choose(logits)`."""

    def __init__(self, model: nn.Module, pad_id: int, compile_layers: bool = False):
        """`compile_layers`: run the decode steps' layers compiled (`compiles_layers` says when it pays)."""
        attention = getattr(model.config, "_attn_implementation", "sdpa")
        if attention != "sdpa":
            raise UserError(f"the graphed backend runs the target with sdpa attention, not {attention!r}")
        self.model, self.pad_id = model, pad_id
        self.device = model.get_input_embeddings().weight.device
        self.attention = grouped_attention.register()
        self.cache_name = cache_kwarg(model)
        if self.cache_name is None:
            raise UserError(f"{type(model).__name__}.forward takes no cache argument; use warmup.backend static")
        self.layers = CompiledLayers(decoder_layers(model), lengths={1}, dynamic=True) if compile_layers else None

    def decode(self, prompts: Sequence[Sequence[int]], limits: Sequence[int], stop_ids: Sequence[int],
               choose) -> list[list[int]]:
        """Each prompt's next max(limits) tokens (the caller cuts each at its stop token or its limit).

        `choose`: float logits [rows, V] -> tokens [rows] (greedy or sampled, on the device)."""
        # Grouped attention for this call only: the caller's model keeps its own for other uses.
        self.model.set_attn_implementation(self.attention)
        try:
            with self.layers or contextlib.nullcontext():
                return self._decode(prompts, limits, stop_ids, choose)
        finally:
            self.model.set_attn_implementation("sdpa")

    @torch.no_grad()
    def _decode(self, prompts: Sequence[Sequence[int]], limits: Sequence[int], stop_ids: Sequence[int],
                choose) -> list[list[int]]:
        rows, width, new = len(prompts), max(len(p) for p in prompts), max(limits)
        max_len = width + new
        device = self.device
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        in_prompt = torch.zeros((rows, max_len), dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            in_prompt[row, width - len(prompt):width] = True
        ids, in_prompt = ids.to(device), in_prompt.to(device)
        starts = (width - torch.tensor([len(p) for p in prompts])).to(device)  # where each prompt begins
        slots = torch.arange(max_len, device=device)
        cache = static_cache(self.model.config, max_len, GRAPHED_REFUSAL)

        # Prefill: each position sees its own prompt's earlier tokens; a pad sees itself only, which
        # keeps its (unused) hidden states finite.
        earlier = slots[None, :] <= slots[:width, None]  # [query, key]
        visible = ((in_prompt[:, None, :] & earlier) | (slots[None, :] == slots[:width, None]))[:, None]
        positions = (slots[None, :width] - starts[:, None]).clamp(min=0)
        logits = self.model(input_ids=ids, position_ids=positions, attention_mask=visible,
                            use_cache=True, logits_to_keep=1, **{self.cache_name: cache}).logits[:, -1].float()

        def step(tokens: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
            set_cache_length(cache, slot)
            seen = in_prompt | ((slots >= width) & (slots <= slot))[None]
            out = self.model(input_ids=tokens, position_ids=(slot - starts)[:, None],
                             attention_mask=seen[:, None, None, :], use_cache=True, **{self.cache_name: cache})
            return out.logits[:, -1].float()

        graphs = StepGraphs.for_device(device)  # per call: its graph holds this call's cache
        stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
        row_limits = torch.tensor(list(limits), device=device)
        stopped = torch.zeros(rows, dtype=torch.bool, device=device)
        chosen = []
        for t in range(new):
            token = choose(logits)
            chosen.append(token)
            stopped |= torch.isin(token, stops)
            if t + 1 == new or ((t + 1) % STOP_CHECK_EVERY == 0 and bool((stopped | (row_limits <= t + 1)).all())):
                break
            # slots[i] is a view on the device: no host-to-device copy a step.
            logits = graphs.run("decode", step, token[:, None], slots[width + t])
        return torch.stack(chosen, dim=1).tolist()
