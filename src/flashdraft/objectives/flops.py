"""Useful FLOPs of a training step (matmuls only), for MFU: every objective counts here.

dflash: the target's forward through its last tapped layer over the real tokens (active parameters:
routed experts scaled by top-k / experts; causal attention scores), the draft's forward and backward (3x
the forward for trained weights, 2x where only a weight gradient is needed, i.e. `fc` over frozen
features), the sparse attention actually allowed by the block mask, and the LM head over supervised
slots (forward + the gradient of the hidden states; the head is frozen).
mdlm / hybrid: forward (bidirectional, and causal for hybrid) of the whole LM with its head over every
position, times 3 for the backward.
Not counted: norms, activations, softmax, and Mamba-2 scans (their projections are counted), so MFU is
a slight underestimate.
"""

from __future__ import annotations

import torch
from torch import nn


def _attention_layers(layers: nn.ModuleList) -> int:
    count = 0
    for layer in layers:
        count += any(
            type(m).__name__.endswith("Attention") and "Mamba" not in type(m).__name__ for m in layer.modules()
        )
    return count


def active_params(layers: nn.ModuleList, config) -> float:
    """Parameters one token passes through in the decoder layers (routed experts: the top-k share)."""
    n_experts = next(
        (getattr(config, k) for k in ("n_routed_experts", "num_experts", "num_local_experts")
         if getattr(config, k, None)),
        None,
    )
    top_k = getattr(config, "num_experts_per_tok", None)
    total = 0.0
    for name, param in layers.named_parameters():
        routed = "experts" in name and "shared_expert" not in name
        share = top_k / n_experts if routed and n_experts and top_k else 1.0
        total += param.numel() * share
    return total


class DecoderFlops:
    """Forward FLOPs of a stack of decoder layers (its parameter count is read once)."""

    def __init__(self, layers: nn.ModuleList, config):
        self.params = active_params(layers, config)
        self.attention_layers = _attention_layers(layers)
        self.heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads

    def __call__(self, lengths: torch.Tensor, *, causal: bool = True) -> float:
        """FLOPs over sequences of `lengths` real tokens."""
        # QK^T and PV: len^2 scores per head and layer, about half of them when causal.
        scores = float((lengths.double() ** 2).sum()) * (0.5 if causal else 1.0)
        attention = 2 * 2 * self.heads * self.head_dim * scores * self.attention_layers
        return 2 * self.params * float(lengths.sum()) + attention


def lm_forward_flops(layers: DecoderFlops, model_config, lengths: torch.Tensor, *, causal: bool) -> float:
    """One forward of a whole LM over sequences of `lengths` tokens: its decoder layers and its head over
    every position."""
    head = 2 * model_config.hidden_size * model_config.vocab_size * float(lengths.sum())
    return layers(lengths, causal=causal) + head


def draft_train_flops(
    draft_config,
    vocab_size: int,
    context_tokens: float,
    block_tokens: float,
    visible_keys: float,
    supervised_slots: float,
) -> float:
    """Forward + backward FLOPs of the draft and the frozen LM head for one micro-batch.

    visible_keys: sum over all block queries of the keys the mask lets them see.
    """
    c = draft_config
    hidden, heads, kv_heads, head_dim = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    n_taps = len(c.target_layer_ids)
    fc = 2 * 2 * n_taps * hidden * hidden * context_tokens  # forward + weight gradient
    q_o = 2 * heads * head_dim * hidden
    k_v = 2 * kv_heads * head_dim * hidden
    mlp = 3 * hidden * c.intermediate_size
    per_layer = (
        2 * (q_o + mlp) * block_tokens
        + 2 * k_v * (context_tokens + block_tokens)
        + 2 * 2 * heads * head_dim * visible_keys
    )
    head = 2 * 2 * hidden * vocab_size * supervised_slots
    return fc + 3 * per_layer * c.num_hidden_layers + head

