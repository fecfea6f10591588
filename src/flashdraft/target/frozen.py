"""The target model: loading it from any source, its decoder layers, tapped hidden states, embedding and
LM head (frozen, as the DFlash trainer and decoding use it; the diffusion objectives train the loaded LM).

Layer id `i` always means the OUTPUT of decoder layer `i` (transformers' `hidden_states[i + 1]`); we
capture it with forward hooks on the decoder layers, which is also right for the last layer, where
transformers' tuple holds the output after the final norm instead.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from flashdraft.errors import UserError
from flashdraft.target.fast_path import fast_path_status, require_fast_path
from flashdraft.target.source import TargetSource, hub_error, load_target_config, resolve_source

log = logging.getLogger(__name__)


def _decoder(model: nn.Module) -> nn.Module:
    """The module that holds the decoder layers (the model itself where it has no `get_decoder`)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's stack of decoder layers (llama, qwen3, nemotron_h and most HF causal LMs)."""
    layers = getattr(_decoder(model), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise UserError(f"cannot find the decoder layers of {type(model).__name__} (expected `.model.layers`)")
    return layers


@contextlib.contextmanager
def capture_layer_outputs(model: nn.Module, layer_ids: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, every forward of `model` stores the output of each listed decoder layer."""
    layers = decoder_layers(model)
    bad = [i for i in layer_ids if not 0 <= i < len(layers)]
    if bad:
        raise UserError(f"target layer ids {bad} are out of range for a {len(layers)}-layer target")
    captured: dict[int, torch.Tensor] = {}

    def hook(index: int):
        def store(_module, _args, output):
            captured[index] = output[0] if isinstance(output, tuple) else output

        return store

    handles = [layers[i].register_forward_hook(hook(i)) for i in set(layer_ids)]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def layers_through(model: nn.Module, last: int) -> Iterator[None]:
    """Within the block, the decoder runs only its layers 0..`last`: the ones a caller reads.

    The tapped features never need the layers after the last tap (2 of Nemotron-Nano's 52, 2 of
    Qwen3-8B's 36 in the recipes), so their forward is pure waste. HF decoders loop over `.layers`, so
    a shorter list for the duration of the forward is all it takes; the full list comes back after.
    """
    full = decoder_layers(model)
    _decoder(model).layers = full[: last + 1]
    try:
        yield
    finally:
        _decoder(model).layers = full


def concat_taps(captured: dict[int, torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """[.., n_taps * H] in the order of `layer_ids` (the order `fc` was trained with)."""
    return torch.cat([captured[i] for i in layer_ids], dim=-1)


def load_causal_lm(
    spec: str | TargetSource,
    *,
    dtype: torch.dtype | str = torch.bfloat16,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
    fast_path_required: bool = False,
) -> nn.Module:
    """A causal LM from any target source (hub id, folder, .gguf, packaged:NAME), on `device`."""
    from transformers import AutoModelForCausalLM

    source = spec if isinstance(spec, TargetSource) else resolve_source(spec)
    config = load_target_config(source, trust_remote_code=trust_remote_code)
    if fast_path_required:
        require_fast_path(config)
    status = fast_path_status(config)
    if status["hybrid"]:
        log.info(
            "hybrid target: %d recurrent layers, Mamba-2 fast path %s",
            status["recurrent_layers"],
            "on" if status["fast_path"] else f"OFF ({status['kernel_errors']})",
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.path,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            **source.hf_kwargs(),
        )
    except (OSError, ValueError) as err:
        raise hub_error(source, err) from err
    return model.to(device)


class FrozenTarget:
    """A target LM with gradients off, handing out context features, its embedding and its head."""

    def __init__(self, model: nn.Module):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config.get_text_config()

    @classmethod
    def load(cls, spec: str | TargetSource, **options: Any) -> FrozenTarget:
        """The target of `spec`, frozen; `options` as for `load_causal_lm`."""
        return cls(load_causal_lm(spec, **options))

    @property
    def num_layers(self) -> int:
        return len(decoder_layers(self.model))

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    @property
    def embedding(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    def compile_layers(self, through: int) -> None:
        """torch.compile the forward of decoder layers 0..`through` (the ones context_features runs): their
        norms, rotary embedding and activations fuse, the matmuls stay cuBLAS's.

        The forward, not the module call, so the taps' hooks (and FSDP2's, where the target is sharded)
        stay eager around each layer. Without a cache the layers share their graphs: one per padded
        batch length (and with or without padding), so callers pad batches to a few lengths.
        """
        for layer in decoder_layers(self.model)[: through + 1]:
            layer.forward = torch.compile(layer.forward, dynamic=False)

    def eager_layers(self) -> None:
        """Undo compile_layers: every layer runs its class's forward again (benchmarks that time the
        same target both ways)."""
        for layer in decoder_layers(self.model):
            layer.__dict__.pop("forward", None)

    @torch.no_grad()
    def context_features(
        self,
        input_ids: torch.Tensor,
        layer_ids: Sequence[int],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Tapped hidden states [B, S, n_taps * H] of one forward, without computing logits or any layer
        after the last tap (the final norm still runs: it is one cheap op and every decoder has it)."""
        with capture_layer_outputs(self.model, layer_ids) as captured, layers_through(self.model, max(layer_ids)):
            self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return concat_taps(captured, layer_ids)
