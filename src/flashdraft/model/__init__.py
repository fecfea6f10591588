"""The DFlash draft model: configuration and architecture (z-lab / vLLM / SGLang checkpoint format)."""

from flashdraft.model.config import DFlashDraftConfig, default_target_layer_ids
from flashdraft.model.modeling import DFlashDraftModel

__all__ = ["DFlashDraftConfig", "DFlashDraftModel", "default_target_layer_ids"]
