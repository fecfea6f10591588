"""The DFlash draft model: configuration and architecture (z-lab / vLLM / SGLang checkpoint format), the
mask-token choice, building drafts (build), model cards (card) and HF-folder exports (export)."""

from flashdraft.model.config import DFlashDraftConfig, default_target_layer_ids
from flashdraft.model.modeling import DFlashDraftModel

__all__ = ["DFlashDraftConfig", "DFlashDraftModel", "default_target_layer_ids"]
