"""Exact rollback of recurrent (Mamba-2 / linear-attention) state after a partial accept.

A verify forward pushes all B block tokens through every recurrent layer, and such a state cannot be
cropped like a KV cache (transformers' own `crop` only trims conv windows and refuses the SSM state).
We keep a COMMITTED copy of every conv and SSM state. A step starts from it (so a step can run twice,
e.g. as a CUDA-graph warm-up, with the same result), and each mixer's input is recorded. After the
accept, keeping n of the q tokens:
  - n == q: the live state is already right; it becomes the committed one;
  - n <  q: the committed state is restored and each recurrent mixer replays its recorded input for
    the n kept positions. A mixer's input at positions < n does not depend on later positions
    (causality), so this is exactly the state a forward of the n tokens alone would leave, computed
    by the model's own mixer code (its fast kernels when installed), and the cost is only the mixers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

from flashdraft.errors import UserError
from flashdraft.target.cache_kwarg import cache_kwarg
from flashdraft.target.frozen import decoder_layers
from flashdraft.target.step_graphs import StepGraphs

# Attribute names under which hybrid models keep the recurrent mixer of a decoder layer.
_MIXER_ATTRIBUTES = ("mixer", "linear_attn", "mamba")


def _mixer(layer: nn.Module) -> nn.Module | None:
    for name in _MIXER_ATTRIBUTES:
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


class RecurrentStates:
    """The recurrent layers of a hybrid target, with committed copies of their states."""

    def __init__(self, model: nn.Module, cache: Cache):
        self.cache = cache
        layers = decoder_layers(model)
        self.mixers: dict[int, nn.Module] = {}
        self._cache_kwargs: dict[int, str] = {}
        for i, cache_layer in enumerate(cache.layers):
            if not isinstance(cache_layer, LinearAttentionCacheLayerMixin):
                continue
            mixer = _mixer(layers[i])
            if mixer is None:
                raise UserError(
                    f"layer {i} of {type(model).__name__} keeps a recurrent state but has no recognised mixer "
                    f"({', '.join(_MIXER_ATTRIBUTES)}); speculative decoding of this hybrid needs state rollback"
                )
            name = cache_kwarg(mixer)
            # A mixer that cannot take a cache keeps no state: transformers 5.17 and older give MoE and MLP
            # layers an empty linear-attention cache layer as a placeholder.
            if name is not None:
                self.mixers[i] = mixer
                self._cache_kwargs[i] = name
        self.layer_ids = list(self.mixers)
        self._committed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._inputs: dict[int, torch.Tensor] = {}

    @classmethod
    def find(cls, model: nn.Module, cache: Cache) -> RecurrentStates | None:
        states = cls(model, cache)
        return states if states.layer_ids else None

    def _live(self) -> list[torch.Tensor]:
        out = []
        for i in self.layer_ids:
            layer = self.cache.layers[i]
            for s in range(layer.number_of_states):
                out.extend(t for t in (layer.conv_states[s], layer.recurrent_states[s]) if t is not None)
        return out

    def commit_prefill(self) -> None:
        """After the prefill: the states it left are the first committed ones.

        The copies are allocated once and then overwritten, so captured CUDA graphs stay valid.
        """
        if not self._committed:
            self._committed = [t.clone() for t in self._live()]
        else:
            self._save()

    def restore(self) -> None:
        # One fused multi-tensor copy instead of two launches per layer.
        torch._foreach_copy_(self._live(), self._committed)

    def _save(self) -> None:
        torch._foreach_copy_(self._committed, self._live())

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Within the block, each recurrent mixer's input of the last forward is kept for a replay."""

        def hook(index: int):
            def keep(_module, args, kwargs):
                self._inputs[index] = args[0] if args else kwargs["hidden_states"]

            return keep

        handles = [m.register_forward_pre_hook(hook(i), with_kwargs=True) for i, m in self.mixers.items()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def replay(self, *prefixes: torch.Tensor) -> None:
        """From the committed state, push each recurrent mixer's recorded input prefix through it.

        Idempotent (it starts from the committed copy), so it can be replayed as a CUDA graph.
        """
        self.restore()
        for (i, mixer), prefix in zip(self.mixers.items(), prefixes):
            mixer(prefix, **{self._cache_kwargs[i]: self.cache})

    def commit(self, kept: int, forwarded: int, graphs: StepGraphs | None = None) -> None:
        """Keep the state after the first `kept` of the `forwarded` tokens of the last recorded forward."""
        if kept < forwarded:
            prefixes = [self._inputs[i][:, :kept] for i in self.mixers]
            if graphs is None:
                self.replay(*prefixes)
            else:
                graphs.run("rollback", self.replay, *prefixes)  # one graph per kept length
        self._save()
