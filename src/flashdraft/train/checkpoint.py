"""Distributed checkpoints for exact resume: `<root>/step-N/` after N optimizer steps, with no pickle.

A checkpoint holds the model's and the optimizer's tensors as one torch.distributed.checkpoint of
`get_state_dict(model, optimizer)` (sharded: every rank writes its part; metadata as JSON, see
`checkpoint_format`), the optimizer's param groups and `trainer.json` (step, schedule, data position,
the resolved config, run totals) as JSON, and one `rng-rank{r}.json` per rank. It is written into a temp
folder beside `step-N` (`files.atomic_dir`) and renamed once every rank has finished, so a folder named
`step-N` is complete when written; only the newest `keep` are kept. The root must be a filesystem shared
by all ranks.

Resume takes the newest checkpoint that loads: one torn later (a truncated shard, a corrupt JSON file)
is skipped with a warning that names it, and an intact older one is used.
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
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from flashdraft.errors import UserError
from flashdraft.files import atomic_dir, write_json
from flashdraft.train.checkpoint_format import JsonMetadataReader, JsonMetadataWriter, TensorsOnlyLoadPlanner
from flashdraft.train.distributed import Distributed

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
TRAINER_STATE = "trainer.json"
PARAM_GROUPS = "param_groups.json"


def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state().tolist(), "python": [version, list(internal), gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state().tolist()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def _param_groups(groups: list[dict]) -> list[dict]:
    """Param groups from JSON: the tuples JSON made lists (AdamW's betas) become tuples again."""
    return [{k: tuple(v) if k == "betas" else v for k, v in group.items()} for group in groups]


class Checkpointer:
    def __init__(self, root: Path, dist: Distributed, keep: int):
        self.root, self.dist, self.keep = root, dist, keep

    def steps(self) -> list[int]:
        """Steps of the checkpoints that were completely written, oldest first."""
        if not self.root.is_dir():
            return []
        found = (_STEP_DIR.match(p.name) for p in self.root.iterdir())
        return sorted(int(m[1]) for m in found if m and (self.root / m[0] / TRAINER_STATE).is_file())

    def save(self, step: int, model: nn.Module, optimizer, trainer_state: dict[str, Any]) -> Path:
        final = self.root / f"step-{step}"
        model_state, optim_state = get_state_dict(model, optimizer)
        with contextlib.ExitStack() as stack:
            # Rank 0 makes the temp folder (and renames it when the block ends); every rank writes into it.
            made = str(stack.enter_context(atomic_dir(final))) if self.dist.is_main else None
            tmp = Path(self.dist.broadcast(made))
            # Tensors only: the param groups (plain numbers) go to JSON, so that nothing is pickled.
            dcp.save({"model": model_state, "optim": optim_state["state"]}, storage_writer=JsonMetadataWriter(tmp))
            write_json(tmp / f"rng-rank{self.dist.rank}.json", _rng_state())
            self.dist.barrier()
            if self.dist.is_main:
                write_json(tmp / PARAM_GROUPS, optim_state["param_groups"])
                write_json(tmp / TRAINER_STATE, {"step": step, **trainer_state}, indent=1)
        if self.dist.is_main:
            for old in self.steps()[: -self.keep]:
                shutil.rmtree(self.root / f"step-{old}", ignore_errors=True)
            self.remove_leftovers()
            log.info("checkpoint %s", final)
        self.dist.barrier()
        return final

    def remove_leftovers(self) -> None:
        """Temp folders of saves that died with their process (only ever written by `save`)."""
        for leftover in self.root.glob(".step-*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)

    def load_latest(self, model: nn.Module, optimizer) -> dict[str, Any] | None:
        """Restore the newest checkpoint that loads into model/optimizer/RNG; its trainer state, or None."""
        if self.dist.is_main and self.root.is_dir():
            self.remove_leftovers()
        for step in reversed(self.steps()):
            folder = self.root / f"step-{step}"
            try:
                state = self._load(folder, model, optimizer)
            # A torn file of any kind (DCP wraps its errors in a BaseException): the older checkpoint is whole.
            except (Exception, CheckpointException) as err:
                log.warning("checkpoint %s cannot be loaded (%s: %s); trying the one before it", folder,
                            type(err).__name__, str(err)[:300])
                continue
            log.info("resumed from %s", folder)
            return state
        if self.steps():
            raise UserError(f"no checkpoint in {self.root} can be loaded (each is torn: see the warnings above); "
                            "move the folder away to start afresh")
        return None

    def _load(self, folder: Path, model: nn.Module, optimizer) -> dict[str, Any]:
        trainer_state = json.loads((folder / TRAINER_STATE).read_text())
        param_groups = _param_groups(json.loads((folder / PARAM_GROUPS).read_text()))
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state["state"]}
        dcp.load(state, storage_reader=JsonMetadataReader(folder), planner=TensorsOnlyLoadPlanner())
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict={"state": state["optim"], "param_groups": param_groups})
        rng = folder / f"rng-rank{self.dist.rank}.json"
        if rng.is_file():  # absent when resuming on more ranks than wrote the checkpoint
            _set_rng_state(json.loads(rng.read_text()))
        return trainer_state
