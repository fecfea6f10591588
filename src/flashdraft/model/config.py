"""The DFlash draft's configuration: a Qwen3 config plus the `dflash_config` block.

The checkpoint format is fixed by the z-lab reference, vLLM and SGLang: `model_type` stays "qwen3",
`dflash_config` holds mask_token_id / target_layer_ids / block_size, and block_size is repeated at top
level because older readers look there.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen3Config


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Taps spread evenly from layer 1 to layer L-3 (a single tap: the middle layer).

    Never the last layer: transformers returns that one after the final norm.
    """
    if num_taps < 1:
        raise ValueError(f"num_taps must be >= 1, got {num_taps}")
    if num_taps == 1:
        return [num_target_layers // 2]
    if num_target_layers < 4:
        raise ValueError(
            f"the default tap rule needs a target with at least 4 layers (got {num_target_layers}); "
            "pass explicit target_layer_ids instead"
        )
    span = num_target_layers - 4
    return [round(1 + i * span / (num_taps - 1)) for i in range(num_taps)]


class DFlashDraftConfig(Qwen3Config):
    """Qwen3 config of the draft layers plus the DFlash fields (see module docstring)."""

    dflash_config: dict | None = None
    num_target_layers: int | None = None
    block_size: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        # Released checkpoints keep block_size at top level, in dflash_config, or both.
        dflash = dict(self.dflash_config or {})
        block_size = dflash.get("block_size", self.block_size)
        dflash["block_size"] = int(block_size if block_size is not None else 16)
        self.block_size = dflash["block_size"]
        self.dflash_config = dflash
        super().__post_init__(**kwargs)

    @property
    def mask_token_id(self) -> int | None:
        return self.dflash_config.get("mask_token_id")

    @property
    def target_layer_ids(self) -> list[int]:
        ids = self.dflash_config.get("target_layer_ids")
        if ids is None:
            if self.num_target_layers is None:
                raise ValueError(
                    "the draft config has neither dflash_config.target_layer_ids nor num_target_layers"
                )
            return default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        return list(ids)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        # Readers built on transformers 4.x (vLLM, SGLang) still look for a top-level rope_theta.
        rope = out.get("rope_parameters") or {}
        if "rope_theta" in rope:
            out["rope_theta"] = rope["rope_theta"]
        out["tie_word_embeddings"] = False
        return out
