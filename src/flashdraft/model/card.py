"""Model cards (README.md of an exported folder), written from data: what a folder holds is a field."""

from __future__ import annotations

from dataclasses import dataclass

from flashdraft.model.modeling import DFlashDraftModel


@dataclass(frozen=True)
class DraftCard:
    """The card of a DFlash draft folder, fresh (`flashdraft draft-init`) or trained."""

    target: str
    recipe: str | None
    num_target_layers: int
    hidden_size: int
    vocab_size: int
    num_layers: int
    num_parameters: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int
    trained: bool = False

    @classmethod
    def describe(cls, draft: DFlashDraftModel, *, target: str, recipe: str | None, trained: bool = False) -> DraftCard:
        c = draft.config
        return cls(target=target, recipe=recipe, num_target_layers=c.num_target_layers, hidden_size=c.hidden_size,
                   vocab_size=c.vocab_size, num_layers=c.num_hidden_layers,
                   num_parameters=sum(p.numel() for p in draft.parameters()), target_layer_ids=c.target_layer_ids,
                   mask_token_id=c.mask_token_id, block_size=c.block_size, trained=trained)

    def render(self) -> str:
        weights = "trained with `flashdraft train`" if self.trained else (
            "freshly initialised until trained (`flashdraft train`)")
        return f"""---
library_name: transformers
tags: [dflash, speculative-decoding, flashdraft]
---
# DFlash draft for `{self.target}`

A block-diffusion speculative-decoding draft in the z-lab DFlash format (loads in vLLM, SGLang and
the `dflash` reference package). It has no embedding and no LM head: it borrows the target's.

| | |
| --- | --- |
| target | `{self.target}` ({self.num_target_layers} layers, hidden {self.hidden_size}, vocab {self.vocab_size}) |
| recipe | {self.recipe or "none (shapes from the target)"} |
| draft layers | {self.num_layers} ({self.num_parameters / 1e6:.1f}M parameters) |
| target layer ids | {self.target_layer_ids} |
| mask token id | {self.mask_token_id} |
| block size | {self.block_size} |

Made by `flashdraft draft-init`; weights are {weights}.
"""


@dataclass(frozen=True)
class FineTuneCard:
    """The card of a diffusion LM trained in full (objective mdlm or hybrid)."""

    name: str  # the folder's name
    objective: str
    base: str  # the model it was trained from
    recipe: str | None
    mask_token_id: int

    def render(self) -> str:
        recipe = f" (recipe `{self.recipe}`)" if self.recipe else ""
        return (f"# {self.name}\n\n`{self.objective}` fine-tune of `{self.base}`{recipe}, trained with "
                f"`flashdraft train`. Mask token id: {self.mask_token_id}.\n")
