"""Building drafts: the draft config from the `draft` section and the target's config and tokenizer, a
fresh (seeded) draft, or the one in `draft.init_from`. Reads configs and tokenizers, never target weights.
"""

from __future__ import annotations

import logging

import torch

from flashdraft.config import DraftConfig
from flashdraft.errors import UserError
from flashdraft.model.check import check_draft
from flashdraft.model.config import DFlashDraftConfig, default_target_layer_ids
from flashdraft.model.mask_token import resolve_mask_token
from flashdraft.model.modeling import DFlashDraftModel

log = logging.getLogger(__name__)


def _rope_theta(target_config) -> float:
    params = getattr(target_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(target_config, "rope_theta", None) or 1e6)


def build_draft_config(draft: DraftConfig, target_config, tokenizer) -> DFlashDraftConfig:
    """The draft's config: shapes from `draft`, unset ones and hidden size/vocab from the target."""
    hidden = target_config.hidden_size
    if draft.hidden_size is not None and draft.hidden_size != hidden:
        raise UserError(
            f"draft hidden size {draft.hidden_size} != target hidden size {hidden}: the draft reads the "
            "target's embeddings and feeds its LM head, so they must match; drop draft.hidden_size"
        )
    n_target = target_config.num_hidden_layers
    layer_ids = draft.target_layer_ids
    if layer_ids is None:
        layer_ids = default_target_layer_ids(n_target, draft.num_taps or draft.num_layers)
    bad = [i for i in layer_ids if not 0 <= i < n_target]
    if bad:
        raise UserError(
            f"target layer ids {bad} are out of range: the target has {n_target} decoder layers (0..{n_target - 1})"
        )
    if n_target - 1 in layer_ids:
        log.warning("tapping the target's last layer %d: captured by hook before the final norm", n_target - 1)

    heads = draft.num_attention_heads or target_config.num_attention_heads
    head_dim = draft.head_dim or getattr(target_config, "head_dim", None) or hidden // heads
    mask = resolve_mask_token(tokenizer, target_config, draft.mask_token_id)
    log.info("mask token %d (%s)", mask.token_id, mask.reason)
    return DFlashDraftConfig(
        hidden_size=hidden,
        vocab_size=target_config.vocab_size,
        num_hidden_layers=draft.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=draft.num_key_value_heads
        or getattr(target_config, "num_key_value_heads", None)
        or heads,
        head_dim=head_dim,
        intermediate_size=draft.intermediate_size or target_config.intermediate_size,
        rms_norm_eps=draft.rms_norm_eps
        or getattr(target_config, "rms_norm_eps", None)
        or getattr(target_config, "layer_norm_epsilon", 1e-6),
        max_position_embeddings=draft.max_position_embeddings or target_config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": draft.rope_theta or _rope_theta(target_config)},
        num_target_layers=n_target,
        dflash_config={
            "mask_token_id": mask.token_id,
            "target_layer_ids": list(layer_ids),
            "block_size": draft.block_size,
        },
        block_size=draft.block_size,
    )


def initial_draft_config(draft: DraftConfig, target_config, tokenizer) -> DFlashDraftConfig:
    """The config of the draft training starts from: `draft.init_from`'s, or a fresh one's."""
    if draft.init_from:
        # The whole folder (weights of the config's shapes), before the trainer tokenises anything.
        config = check_draft(draft.init_from, "draft.init_from").config
        _check_init_from_agrees(draft, config)
        return config
    return build_draft_config(draft, target_config, tokenizer)


# draft field -> the value a loaded draft config has for it
_SHAPE_OF_DRAFT = {
    "num_layers": lambda c: c.num_hidden_layers,
    "num_taps": lambda c: len(c.target_layer_ids),
    "target_layer_ids": lambda c: list(c.target_layer_ids),
    "block_size": lambda c: c.block_size,
    "mask_token_id": lambda c: c.mask_token_id,
    "num_attention_heads": lambda c: c.num_attention_heads,
    "num_key_value_heads": lambda c: c.num_key_value_heads,
    "head_dim": lambda c: c.head_dim,
    "intermediate_size": lambda c: c.intermediate_size,
    "rope_theta": lambda c: (c.rope_parameters or {}).get("rope_theta"),
    "rms_norm_eps": lambda c: c.rms_norm_eps,
    "max_position_embeddings": lambda c: c.max_position_embeddings,
    "hidden_size": lambda c: c.hidden_size,
}


def _check_init_from_agrees(draft: DraftConfig, config: DFlashDraftConfig) -> None:
    """A draft started from `init_from` keeps that draft's shape; a shape the config asks for (a value other
    than the default) that the folder does not have is an error, not something to drop silently."""
    defaults = DraftConfig()
    clashes = [
        f"draft.{key}={getattr(draft, key)!r} (the folder has {shape(config)!r})"
        for key, shape in _SHAPE_OF_DRAFT.items()
        if getattr(draft, key) != getattr(defaults, key) and getattr(draft, key) != shape(config)
    ]
    if clashes:
        raise UserError(
            f"draft.init_from {draft.init_from!r} is a draft of another shape than the draft section asks for: "
            f"{'; '.join(clashes)}. Training continues the folder's draft as it is: drop these keys, or drop "
            "draft.init_from to build a fresh draft of this shape"
        )


def new_draft(config: DFlashDraftConfig, seed: int) -> DFlashDraftModel:
    """A freshly initialised draft; the same seed gives the same weights."""
    torch.manual_seed(seed)
    return DFlashDraftModel(config)


def initial_draft(draft: DraftConfig, config: DFlashDraftConfig) -> DFlashDraftModel:
    """The draft training starts from (float32): `draft.init_from`'s weights, or fresh ones seeded by draft.seed."""
    if draft.init_from:
        return DFlashDraftModel.from_pretrained(draft.init_from, dtype=torch.float32)
    return new_draft(config, draft.seed).float()
