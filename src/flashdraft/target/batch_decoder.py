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
together, and the caller drops each row's tokens past its stop or limit.

With fewer rows than prompts, a row whose prompt has stopped or reached its limit takes the next waiting
prompt at the next stop check (prefilled apart, its keys and values copied into the row's slots, which the
step's mask then covers), so rows do not idle while the longest answer of a batch runs on: in issue 22's
regeneration 43% of the row-steps kept a token (benchmarks/RESULTS.md section 8). The cache is a ring of
slots a row sized to the longest prompt plus its limit, so a row's new prompt and answer always fit. Prompts
are prefilled at most PREFILL_ROWS at a time (the first rows too): a prefill's activations grow with its rows
times its longest prompt, where the decode step's cost grows with the rows alone.
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
# Prompts prefilled in one forward: bounds its activations (64 x 1,024 tokens of SmolLM2: a few GB) however many
# rows decode at once.
PREFILL_ROWS = 64
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


def cache_layout(prompts: Sequence[Sequence[int]], limits: Sequence[int], rows: int | None) -> tuple[int, int]:
    """(rows in flight, ring slots a row) of one decode call: at most `rows` prompts at once (None: all), each
    row's ring long enough for the longest prompt plus its limit."""
    return min(rows or len(prompts), len(prompts)), max(len(p) + limit for p, limit in zip(prompts, limits))


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
               choose, rows: int | None = None) -> list[list[int]]:
        """Each prompt's next tokens, at least its limit's worth unless it stopped (the caller cuts each at its
        stop token or its limit).

        `choose`: float logits [rows, V] -> tokens [rows] (greedy or sampled, on the device).
        `rows`: at most this many prompts decode at once (None: all); a row whose prompt has stopped or
        reached its limit takes the next waiting prompt at the next stop check."""
        # Grouped attention for this call only: the caller's model keeps its own for other uses.
        self.model.set_attn_implementation(self.attention)
        try:
            with self.layers or contextlib.nullcontext():
                return self._decode(prompts, limits, stop_ids, choose, *cache_layout(prompts, limits, rows))
        finally:
            self.model.set_attn_implementation("sdpa")

    def _prefill(self, prompts: Sequence[Sequence[int]], cache: StaticCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompts through the model into `cache`, whose rows hold as many slots as the longest
        prompt: (the next-token logits [rows, V], which slots hold a prompt token [rows, width])."""
        width, device = max(len(p) for p in prompts), self.device
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        slots = torch.arange(width, device=device)
        in_prompt = slots[None, :] >= (width - lengths)[:, None]  # [rows, width]
        # Each position sees its own prompt's earlier tokens; a pad sees itself only, which keeps its
        # (unused) hidden states finite.
        earlier = slots[None, :] <= slots[:, None]  # [query, key]
        visible = (in_prompt[:, None, :] & earlier) | (slots[None, :] == slots[:, None])
        positions = (slots[None, :] - (width - lengths)[:, None]).clamp(min=0)
        logits = self.model(input_ids=ids.to(device), position_ids=positions, attention_mask=visible[:, None],
                            use_cache=True, logits_to_keep=1, **{self.cache_name: cache}).logits[:, -1].float()
        return logits, in_prompt

    @torch.no_grad()
    def _decode(self, prompts: Sequence[Sequence[int]], limits: Sequence[int], stop_ids: Sequence[int],
                choose, rows: int, ring: int) -> list[list[int]]:
        # The cache is a ring of slots a row: every row writes its next token at the same slot, and a row that
        # takes a new prompt gets it in the slots just before that one, so one sequence of at most `ring` tokens
        # never overwrites its own keys, whatever the other rows hold.
        device, config = self.device, self.model.config
        cache = static_cache(config, ring, GRAPHED_REFUSAL)
        owner = torch.zeros((rows, ring), dtype=torch.bool, device=device)  # the slots of each row's sequence
        position = torch.zeros(rows, dtype=torch.long, device=device)  # of each row's next token
        slots = torch.arange(ring, device=device)

        def step(tokens: torch.Tensor, slot: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            set_cache_length(cache, slot)
            owner.index_fill_(1, slot.view(1), True)
            out = self.model(input_ids=tokens, position_ids=positions[:, None],
                             attention_mask=owner[:, None, None, :], use_cache=True, **{self.cache_name: cache})
            return out.logits[:, -1].float()

        def refill(row_ids: list[int], waiting: list[int], slot: int) -> torch.Tensor:
            """Prompts `waiting` into rows `row_ids`, their last token just before `slot`: their logits."""
            return torch.cat([fill(row_ids[i:i + PREFILL_ROWS], waiting[i:i + PREFILL_ROWS], slot)
                              for i in range(0, len(row_ids), PREFILL_ROWS)])

        def fill(row_ids: list[int], waiting: list[int], slot: int) -> torch.Tensor:
            span = max(len(prompts[i]) for i in waiting)
            small = static_cache(config, span, GRAPHED_REFUSAL)
            fresh, fresh_prompt = self._prefill([prompts[i] for i in waiting], small)
            target = (slot - span + torch.arange(span, device=device)) % ring
            chosen_rows = torch.tensor(row_ids, device=device)
            for layer, new in zip(cache.layers, small.layers):
                if not layer.is_initialized:  # the ring's tensors: every row, `ring` slots, the prefill's dtype
                    layer.lazy_initialization(new.keys[:1].expand(rows, -1, -1, -1),
                                              new.values[:1].expand(rows, -1, -1, -1))
                # [rows, heads, slots, dim] indexed at rows x slots: the [k, span, heads, dim] values.
                layer.keys[chosen_rows[:, None], :, target[None, :]] = new.keys.transpose(1, 2)
                layer.values[chosen_rows[:, None], :, target[None, :]] = new.values.transpose(1, 2)
            owner[chosen_rows] = False
            owner[chosen_rows[:, None], target[None, :]] = fresh_prompt
            position[chosen_rows] = fresh_prompt.sum(1)
            return fresh

        # The first rows' prompts end just before slot `width`, where every row writes its first answer token.
        width = max(len(p) for p in prompts[:rows])
        logits = refill(list(range(rows)), list(range(rows)), width)

        graphs = StepGraphs.for_device(device)  # per call: its graph holds this call's cache
        stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
        stopped = torch.zeros(rows, dtype=torch.bool, device=device)
        holder = list(range(rows))  # each row's prompt; None once nothing was left to take
        begun = [0] * rows  # the step at which each row's prompt began
        spans: list[tuple[int, int, int, int]] = []  # (prompt, row, first step, end step)
        waiting = list(range(rows, len(prompts)))
        chosen = []
        t = 0
        horizon = max(limits[:rows])  # the step by which every row's prompt has reached its limit
        while True:
            if t > 0 and (t % STOP_CHECK_EVERY == 0 or t == horizon):
                ended = stopped.tolist()
                free = [row for row in range(rows) if holder[row] is not None
                        and (ended[row] or t - begun[row] >= limits[holder[row]])]
                for row in free:
                    spans.append((holder[row], row, begun[row], t))
                    holder[row], begun[row] = None, t
                if all(h is None for h in holder) and not waiting:
                    break
                taken = free[: len(waiting)]
                if taken:
                    given, waiting = waiting[: len(taken)], waiting[len(taken):]
                    fresh = refill(taken, given, (width + t) % ring)
                    logits = logits.clone()
                    logits[torch.tensor(taken, device=device)] = fresh
                    stopped[torch.tensor(taken, device=device)] = False
                    for row, prompt in zip(taken, given):
                        holder[row] = prompt
                horizon = max(begun[row] + limits[h] for row, h in enumerate(holder) if h is not None)
            token = choose(logits)
            chosen.append(token)
            stopped |= torch.isin(token, stops)
            # slots[i] is a view on the device: no host-to-device copy a step.
            logits = graphs.run("decode", step, token[:, None], slots[(width + t) % ring], position)
            position += 1
            t += 1
        steps = torch.stack(chosen, dim=1).tolist()  # [rows, steps]
        out: list[list[int]] = [[] for _ in prompts]
        for prompt, row, first, end in spans:
            out[prompt] = steps[row][first:end]
        return out
