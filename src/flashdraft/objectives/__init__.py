"""Training objectives behind one typed interface, `Objective`; each objective is one module, registered
in `OBJECTIVES`. The trainer knows only this interface.

Order of calls (the trainer's): `plan` (cheap: configs and checks, before any data or weights), then
`use_device`, then the trainer loads the weights the objective trains (`draft_config` says which) and calls
`bind`; from then on `prepare` / `loss` per micro-batch, `summarise` and `flops` per logged interval.

The trainer divides every micro-step's `loss_sum` by the GLOBAL `num_targets` of the whole step (all
micro-steps, all ranks), so the gradient does not depend on how a batch is split.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import torch

from flashdraft.errors import UserError

if TYPE_CHECKING:
    from torch import nn

    from flashdraft.config import Config
    from flashdraft.data import Batch
    from flashdraft.model import DFlashDraftConfig
    from flashdraft.target.frozen import FrozenTarget

OBJECTIVES: dict[str, str] = {
    "dflash": "flashdraft.objectives.dflash:DFlashObjective",
    "mdlm": "flashdraft.objectives.mdlm:MDLMObjective",
    "hybrid": "flashdraft.objectives.hybrid:HybridObjective",
}
EVAL_STEP = -1  # eval batches are prepared with this step: the same anchors / masks at every evaluation


class Prepared(Protocol):
    """One micro-batch made ready for `loss` (anchors, labels, corrupted tokens...)."""

    @property
    def num_targets(self) -> float:
        """The loss normaliser's share of this micro-batch: its supervised tokens, or their weight sum."""


class Objective(Protocol):
    name: str
    # The DFlash draft trained against the frozen target; None: the objective trains the target LM itself
    # (from target.name_or_path, or draft.init_from, an earlier export).
    draft_config: DFlashDraftConfig | None
    mask_token_id: int  # the token that stands in for the tokens to predict
    bidirectional: bool  # an LM trained to read both ways: its export is marked is_causal=False
    min_supervised_tokens: int  # samples with fewer supervised tokens are dropped

    @classmethod
    def plan(cls, config: Config, target_config, tokenizer) -> Objective:
        """LIGHT: configs and checks only, so bad input fails before any data or weights load."""

    def use_device(self, device: torch.device) -> None:
        """Device-dependent choices (attention kernel, compute dtype); a UserError for settings that
        cannot run on `device`. Cheap: called before the weights load."""

    @property
    def pad_multiple(self) -> int:
        """Batches are padded to a multiple of this many tokens (data.pad_to_multiple, or more for
        compiled kernels)."""

    @property
    def compiles(self) -> bool:
        """Whether training runs compiled code (one graph per padded batch length)."""

    def bind(self, model: nn.Module, target: FrozenTarget | None) -> None:
        """After the weights load: the module being trained and the frozen target (None where the
        objective trains the target itself)."""

    def prepare(self, batch: Batch, step: int) -> Prepared:
        """Cheap, CPU, deterministic in (train.seed, step, sample ids)."""

    def loss(self, model: nn.Module, prepared: Prepared) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss_sum, sums): loss_sum is a float32 scalar, the UNNORMALISED sum; sums are count tensors,
        summed over micro-steps and ranks by the caller (`add_sums`)."""

    def summarise(self, sums: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """The reported metrics of summed counts."""

    def flops(self, prepared: Prepared) -> float:
        """Useful FLOPs of one forward + backward (objectives/flops.py), for MFU."""


def get_objective(name: str) -> type[Objective]:
    """The objective class registered under `name`."""
    if name not in OBJECTIVES:
        raise UserError(f"objective.name: unknown objective {name!r}; known: {', '.join(sorted(OBJECTIVES))}")
    module, _, cls = OBJECTIVES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def add_sums(total: dict[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add `new` counts to `total` (float64, on the CPU)."""
    for key, value in new.items():
        value = value.detach().double().cpu()
        total[key] = total[key] + value if key in total else value
    return total


@torch.no_grad()
def eval_sums(objective: Objective, model: nn.Module, batches: Iterable[Batch]) -> dict[str, torch.Tensor]:
    """The summed counts of `batches` prepared at EVAL_STEP (this process's share; the trainer sums over ranks)."""
    sums: dict[str, torch.Tensor] = {}
    for batch in batches:
        add_sums(sums, objective.loss(model, objective.prepare(batch, EVAL_STEP))[1])
    return sums
