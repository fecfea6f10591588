"""The target side of the decoding loops: a preallocated KV cache, fixed-shape forwards, exact commits.

Every forward takes the block's first position as a device tensor and first sets the cache length to
it, so a step is a pure function of (tokens, start, committed cache): it can be replayed as a CUDA
graph, and a rejected tail is dropped by setting the length (the stale keys are overwritten later and
are never visible: the mask only shows keys at positions <= the query's). Hybrid targets also restore
their recurrent state first and roll it back exactly on commit (`hybrid_cache`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedConfig

from flashdraft.decoding.hybrid_cache import RecurrentStates
from flashdraft.errors import UserError
from flashdraft.target import grouped_attention
from flashdraft.target.batch_decoder import set_cache_length, static_cache
from flashdraft.target.cache_kwarg import cache_kwarg
from flashdraft.target.frozen import capture_layer_outputs, concat_taps
from flashdraft.target.step_graphs import StepGraphs


class TargetRunner:
    """Prefill / block forward / commit for one sequence (batch 1) of a causal LM."""

    def __init__(self, model: nn.Module, tap_ids: Sequence[int], max_len: int):
        self.model = model
        self.tap_ids = list(tap_ids)
        self.max_len = max_len
        self.device = model.get_input_embeddings().weight.device
        attn = getattr(model.config, "_attn_implementation", "sdpa")
        if attn not in ("sdpa", "eager", grouped_attention.NAME):
            raise UserError(f"speculative decoding runs the target with sdpa, eager or {grouped_attention.NAME} "
                            f"attention, not {attn!r}")
        self._additive_mask = attn == "eager"
        self.cache = static_cache(model.config, max_len, "evaluate a full-attention or Mamba-hybrid target")
        self.recurrent = RecurrentStates.find(model, self.cache)
        name = cache_kwarg(model)
        if name is None:
            raise UserError(
                f"{type(model).__name__}.forward takes no cache argument, so speculative decoding cannot keep its "
                "state; evaluate a transformers causal LM"
            )
        self._cache_kwargs = {name: self.cache}
        self._key_positions = torch.arange(max_len, device=self.device)

    def _mask(self, positions: torch.Tensor) -> torch.Tensor:
        visible = (self._key_positions[None, :] <= positions[:, None])[None, None]
        if not self._additive_mask:
            return visible
        dtype = self.model.get_input_embeddings().weight.dtype
        return torch.zeros(visible.shape, dtype=dtype, device=self.device).masked_fill(
            ~visible, torch.finfo(dtype).min
        )

    def _forward(self, ids: torch.Tensor, start: torch.Tensor, logits_to_keep: int):
        positions = start + torch.arange(ids.shape[1], device=self.device)
        with capture_layer_outputs(self.model, self.tap_ids) as taps:
            out = self.model(
                input_ids=ids,
                position_ids=positions[None],
                attention_mask=self._mask(positions),
                use_cache=True,
                **self._cache_kwargs,
                logits_to_keep=logits_to_keep,
            )
        features = concat_taps(taps, self.tap_ids) if self.tap_ids else None
        return out.logits.float(), features

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompt [1, P] -> (logits of the last position [1, V], tapped features [1, P, F] or None)."""
        if ids.shape[1] + 1 > self.max_len:
            raise UserError(f"prompt of {ids.shape[1]} tokens does not fit the {self.max_len}-token cache")
        self.cache.reset()
        set_cache_length(self.cache, 0)
        logits, features = self._forward(ids, torch.zeros((), dtype=torch.long, device=self.device), 1)
        if self.recurrent is not None:
            self.recurrent.commit_prefill()
        return logits[:, -1], features

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens [1, q] at positions start.. (start: 0-d device tensor) -> float logits [1, q, V], features."""
        set_cache_length(self.cache, start)
        if self.recurrent is None:
            return self._forward(ids, start, 0)
        self.recurrent.restore()
        with self.recurrent.recording():
            return self._forward(ids, start, 0)

    @torch.no_grad()
    def commit(self, kept: int, forwarded: int, graphs: StepGraphs | None = None) -> None:
        """Keep the first `kept` of the `forwarded` tokens of the last forward.

        The KV caches need nothing here: the next forward sets their length from its start, and the
        rejected keys beyond it are never visible. Recurrent states are rolled back exactly.
        """
        if self.recurrent is not None:
            self.recurrent.commit(kept, forwarded, graphs)


def check_target(config: PreTrainedConfig) -> None:
    """Refuse a target that the loop cannot run before any weights load: build it without weights (on
    the meta device) and set up a runner for it, which makes every check the real one will."""
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    TargetRunner(skeleton, [], 1)
