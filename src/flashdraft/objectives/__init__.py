"""Training objectives. The trainer knows only this small interface; each strategy is one module.

A strategy is a class registered in `STRATEGIES` (name -> "module:Class") with:

    name: str
    plan(config, target_config, tokenizer) -> Strategy      classmethod; LIGHT: configs and checks only,
                                                            so bad input fails before any weights load
    min_supervised_tokens: int                              samples with fewer supervised tokens are dropped
    pad_multiple(device) -> int                             batches are padded to a multiple of this many tokens
                                                            (data.pad_to_multiple, or more for compiled kernels)
    build(device) -> nn.Module                              HEAVY: load weights; returns the module to train
                                                            (fresh or from `draft.init_from`)
    shard_units(model) -> list[nn.Module]                   sub-modules FSDP2 shards one by one (then the root)
    frozen_shard_units() -> list[nn.Module]                 frozen modules to shard when train.shard_target
    prepare(batch: Batch, step: int) -> Prepared            cheap, CPU, deterministic in (seed, step, sample
                                                            ids); Prepared.num_targets = loss normaliser count
    loss(model, prepared) -> (loss_sum, sums)               loss_sum: float32 scalar, the UNNORMALISED sum;
                                                            sums: dict of count tensors (summed over micro-steps
                                                            and ranks by the trainer)
    summarise(sums) -> dict[str, float]                     reported metrics from the summed counts
    flops(prepared) -> float                                useful FLOPs of one forward+backward, for MFU
    export(model, state_dict, path, recipe) -> None         write the trained model as an HF folder

The trainer divides every micro-step's `loss_sum` by the GLOBAL `num_targets` of the whole step (all
micro-steps, all ranks), so the gradient does not depend on how a batch is split.
"""

from __future__ import annotations

import importlib

from flashdraft.errors import UserError

STRATEGIES: dict[str, str] = {
    "dflash": "flashdraft.objectives.dflash:DFlashStrategy",
    "mdlm": "flashdraft.objectives.mdlm:MDLMStrategy",
    "hybrid": "flashdraft.objectives.hybrid:HybridStrategy",
}


def get_strategy(name: str) -> type:
    """The strategy class registered under `name`."""
    if name not in STRATEGIES:
        raise UserError(f"objective.name: unknown strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}")
    module, _, cls = STRATEGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)
