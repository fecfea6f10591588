"""The DFlash draft: Qwen3-style layers whose keys/values also cover the target's fused context features.

Architecture only. Attribute names are the checkpoint keys of the z-lab format (`fc`, `hidden_norm`,
`layers.{i}.self_attn.q_proj`, ..., `norm`); there is no embedding and no LM head, the caller borrows
the target's.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)

from flashdraft.model.config import DFlashDraftConfig


@functools.cache
def _compiled_flex_attention():
    # Compiled once per process; uncompiled flex_attention materialises the full score matrix.
    return torch.compile(flex_attention, dynamic=False)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    """Queries from the block; keys/values from [context features ; block], one set of projections.

    A dense mask goes to transformers' registered "sdpa" function, as a target layer's does, so decoding's
    fast path (target/flex_decode.py) serves the draft's compiled steps as well as the target's.
    """

    # Read by transformers' sdpa function: the block attends both ways, and each key/value head serves
    # `num_key_value_groups` query heads.
    is_causal = False

    def __init__(self, config: DFlashDraftConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim**-0.5
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | BlockMask | None,
        past_key_values: Cache | None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        kv_input = torch.cat([context, hidden_states], dim=1)
        q = self.q_norm(self.q_proj(hidden_states).view(batch, q_len, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(kv_input).view(batch, -1, self.num_kv_heads, self.head_dim))
        v = self.v_proj(kv_input).view(batch, -1, self.num_kv_heads, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        # position_embeddings cover [context ; block]; the queries are the block, i.e. the tail.
        cos, sin = position_embeddings
        q = _rope(q, cos[:, -q_len:], sin[:, -q_len:])
        k = _rope(k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)

        if isinstance(attention_mask, BlockMask):
            # Inside a compiled layer flex_attention is traced with the rest; alone it needs its own compile.
            flex = flex_attention if torch.compiler.is_compiling() else _compiled_flex_attention()
            out = flex(q, k, v, block_mask=attention_mask, scale=self.scaling, enable_gqa=True).transpose(1, 2)
        else:
            out, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](self, q, k, v, attention_mask, scaling=self.scaling)
        return self.o_proj(out.reshape(batch, q_len, -1))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DFlashDraftConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, context: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | BlockMask | None, past_key_values: Cache | None) -> torch.Tensor:
        # The context features enter un-normalised by this layer: z-lab normalises them once (hidden_norm).
        hidden_states = hidden_states + self.self_attn(
            self.input_layernorm(hidden_states), context, position_embeddings, attention_mask, past_key_values)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class DFlashDraftModel(PreTrainedModel):
    """The DFlash draft (z-lab format).

    forward(position_ids, noise_embedding, target_hidden):
      - target_hidden: [batch, ctx, n_taps * hidden], the target's tapped hidden states, concatenated
        in `target_layer_ids` order (not yet fused; `fc` + `hidden_norm` happen here);
      - noise_embedding: [batch, q, hidden], the target's input embedding of the block(s);
      - position_ids: [batch, past + ctx + q], positions of cached keys, context and block (the cached
        part is only needed by RoPE-free callers; rotary tables are sliced from the tail).
    Returns the final-normed hidden states of the block, [batch, q, hidden]; apply the target's head.
    """

    config_class = DFlashDraftConfig
    base_model_prefix = ""
    supports_gradient_checkpointing = False
    _no_split_modules = ["DFlashDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True

    def __init__(self, config: DFlashDraftConfig):
        super().__init__(config)
        n_taps = len(config.target_layer_ids)
        self.fc = nn.Linear(n_taps * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(
            DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.post_init()

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int | None:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> list[int]:
        return self.config.target_layer_ids

    def compile_layers(self) -> None:
        """torch.compile each decoder layer: its norms, rotary embedding and activations fuse into a few
        kernels instead of running as separate eager ones.

        Per layer, not the whole model, so FSDP2's per-layer hooks stay eager around each compiled
        layer. Layers 1.. share one graph (layer 0 differs only in taking a frozen input); every new
        input length compiles again, so callers pad batches to a few lengths.
        """
        for layer in self.layers:
            layer.compile(dynamic=False)

    def fuse_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[.., n_taps * H] tapped hidden states -> [.., H] fused context features."""
        return self.hidden_norm(self.fc(target_hidden))

    def forward(
        self,
        position_ids: torch.LongTensor,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        attention_mask: torch.Tensor | BlockMask | None = None,
        past_key_values: Cache | None = None,
        **_: object,
    ) -> torch.Tensor:
        context = self.fuse_context(target_hidden)
        # Rotary tables for the new keys only: [context ; block] are the last ctx+q positions.
        new_len = context.shape[1] + noise_embedding.shape[1]
        position_embeddings = self.rotary_emb(noise_embedding, position_ids[:, -new_len:])
        hidden = noise_embedding
        for layer in self.layers:
            hidden = layer(hidden, context, position_embeddings, attention_mask, past_key_values)
        return self.norm(hidden)
