"""The weights an objective trains, loaded and exported: a DFlash draft next to the frozen target, or the
target LM itself (mdlm / hybrid). The trainer, the diffusion-LM evaluation and tests load through here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from flashdraft.config import Config, TargetConfig
from flashdraft.model.build import initial_draft
from flashdraft.model.card import DraftCard, FineTuneCard
from flashdraft.model.export import draft_from_state, export_draft, export_lm, lm_from_state
from flashdraft.objectives import Objective
from flashdraft.target.frozen import FrozenTarget, decoder_layers, load_causal_lm
from flashdraft.target.source import load_tokenizer, source_of

# Compiled code keeps one graph per padded batch length; torch's default of 8 would fall back to the slow
# eager path on a longer tail of lengths, silently.
RECOMPILE_LIMIT = 64


def recompile_limit(config: Config, objective: Objective) -> int:
    """Graphs one compiled code object may keep: one per padded batch length, for batches with and without
    padding (the target's layers get a mask or none), at the full micro-batch and a smaller last one."""
    lengths = -(-config.data.max_length // max(objective.pad_multiple, 1))
    return max(RECOMPILE_LIMIT, 4 * lengths)


@dataclass
class Models:
    model: nn.Module  # trained: fp32 master weights, train mode
    shard_units: list[nn.Module]  # sub-modules FSDP2 shards one by one (then the root)
    target: FrozenTarget | None  # the frozen target (dflash); None where the target itself is trained

    @property
    def frozen_shard_units(self) -> list[nn.Module]:
        """The frozen target's layers, sharded when train.shard_target is set."""
        return list(decoder_layers(self.target.model)) if self.target is not None else []


def _load_lm(target: TargetConfig, device: torch.device, path: str | None = None) -> nn.Module:
    return load_causal_lm(path or source_of(target), dtype=getattr(torch, target.dtype), device=device,
                          attn_implementation=target.attn_implementation, trust_remote_code=target.trust_remote_code)


def load_models(config: Config, objective: Objective, device: torch.device) -> Models:
    """Load what `objective` trains onto `device` (after its `use_device`) and bind the objective to it."""
    if objective.compiles:
        limit, dynamo = recompile_limit(config, objective), torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, limit)
        # The draft's and the target's layers are two code objects, each with up to `limit` graphs.
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 2 * limit)
    if objective.draft_config is not None:
        target = FrozenTarget(_load_lm(config.target, device))
        model = initial_draft(config.draft, objective.draft_config).to(device).train()
        units = list(model.layers)
    else:
        target = None
        # Loaded in target.dtype and upcast on the device: each rank's host holds the checkpoint's size only.
        model = _load_lm(config.target, device, config.draft.init_from).float()
        model.config.use_cache = False
        model.requires_grad_(True).train()
        units = list(decoder_layers(model))
    objective.bind(model, target)
    return Models(model, units, target)


def export_trained(config: Config, objective: Objective, target_config, state_dict: dict[str, torch.Tensor],
                   path: Path) -> Path:
    """The trained weights as an HF folder, in target.dtype: the draft in the z-lab format, or the LM
    with its tokenizer."""
    t = config.target
    dtype = getattr(torch, t.dtype)
    if objective.draft_config is not None:
        draft = draft_from_state(objective.draft_config, state_dict, dtype)
        return export_draft(draft, path, DraftCard.describe(draft, target=t.name_or_path, recipe=config.recipe,
                                                            trained=True))
    model = lm_from_state(target_config, state_dict, dtype=dtype, trust_remote_code=t.trust_remote_code)
    source = config.draft.init_from or source_of(t)
    card = FineTuneCard(name=path.name, objective=objective.name, base=t.name_or_path, recipe=config.recipe,
                        mask_token_id=objective.mask_token_id)
    return export_lm(model, load_tokenizer(source, trust_remote_code=t.trust_remote_code), path, card,
                     bidirectional=objective.bidirectional)
