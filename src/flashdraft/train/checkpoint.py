"""Distributed checkpoints for exact resume: `<root>/step-N/` after N optimizer steps.

A checkpoint holds the model and optimizer as one torch.distributed.checkpoint (DCP) of
`get_state_dict(model, optimizer)` (sharded, every rank writes its part), `trainer.json` (step,
schedule, data position, the resolved config) and one `rng-rank{r}.pt` per rank. It is written into a
temp folder beside `step-N` (`files.atomic_dir`) and renamed once every rank has finished, so a folder
named `step-N` is always complete; only the newest `keep` are kept. The root must be a filesystem shared
by all ranks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from flashdraft.files import atomic_dir, write_json
from flashdraft.train.distributed import Distributed

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    def __init__(self, root: Path, dist: Distributed, keep: int):
        self.root, self.dist, self.keep = root, dist, keep

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = (_STEP_DIR.match(p.name) for p in self.root.iterdir())
        return sorted(int(m[1]) for m in found if m and (self.root / m[0] / "trainer.json").is_file())

    def save(self, step: int, model: nn.Module, optimizer, trainer_state: dict[str, Any]) -> Path:
        final = self.root / f"step-{step}"
        with contextlib.ExitStack() as stack:
            # Rank 0 makes the temp folder (and renames it when the block ends); every rank writes into it.
            made = str(stack.enter_context(atomic_dir(final))) if self.dist.is_main else None
            tmp = Path(self.dist.broadcast(made))
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
            torch.save(_rng_state(), tmp / f"rng-rank{self.dist.rank}.pt")
            self.dist.barrier()
            if self.dist.is_main:
                write_json(tmp / "trainer.json", {"step": step, **trainer_state}, indent=1)
        if self.dist.is_main:
            for old in self.steps()[: -self.keep]:
                shutil.rmtree(self.root / f"step-{old}", ignore_errors=True)
            for leftover in self.root.glob(".step-*.tmp"):  # of saves that died with their process
                shutil.rmtree(leftover, ignore_errors=True)
            log.info("checkpoint %s", final)
        self.dist.barrier()
        return final

    def load_latest(self, model: nn.Module, optimizer) -> dict[str, Any] | None:
        """Restore the newest complete checkpoint into model/optimizer/RNG; its trainer state, or None."""
        steps = self.steps()
        if not steps:
            return None
        folder = self.root / f"step-{steps[-1]}"
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rng = folder / f"rng-rank{self.dist.rank}.pt"
        if rng.is_file():  # absent when resuming on more ranks than wrote the checkpoint
            _set_rng_state(torch.load(rng, weights_only=False))
        log.info("resumed from %s", folder)
        return json.loads((folder / "trainer.json").read_text())
