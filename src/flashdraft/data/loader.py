"""The step-indexed batch plan over prepared (tokenised) data: shuffle per epoch, shard per rank, resume by step.

The loader has no iterator state: the samples of global step s are a pure function of (seed, s), so
resuming at step s needs only s. Every optimizer step takes `global_batch = micro x accum x world` rows
of the epoch's permutation; rank r's micro-step m takes the slice starting at (m * world + r) * micro.
A sample draws the same anchors however a step is split (anchors are seeded by its dataset index).
"""

from __future__ import annotations

import logging

import datasets
import torch

from flashdraft.data import Batch
from flashdraft.errors import UserError

log = logging.getLogger(__name__)


def collate(rows: list[dict], sample_ids: list[int], pad_id: int, pad_to_multiple: int) -> Batch:
    """Right-pad rows to the longest (rounded up to `pad_to_multiple`)."""
    longest = max(len(r["input_ids"]) for r in rows)
    length = -(-longest // pad_to_multiple) * pad_to_multiple
    n = len(rows)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros(n, length, dtype=torch.long)
    loss_mask = torch.zeros(n, length, dtype=torch.bool)
    for i, row in enumerate(rows):
        size = len(row["input_ids"])
        ids[i, :size] = row["input_ids"]
        attention[i, :size] = 1
        loss_mask[i, :size] = row["loss_mask"]
    return Batch(ids, attention, loss_mask, torch.tensor(sample_ids, dtype=torch.long))


class StepLoader:
    """The micro-batches of one rank for any global step (see the module docstring)."""

    def __init__(
        self,
        dataset: datasets.Dataset,
        *,
        micro_batch: int,
        accum: int,
        rank: int,
        world: int,
        seed: int,
        pad_id: int,
        pad_to_multiple: int = 1,
    ):
        self.dataset = dataset
        self.micro, self.accum, self.rank, self.world = micro_batch, accum, rank, world
        self.seed, self.pad_id, self.pad_to_multiple = seed, pad_id, pad_to_multiple
        self.global_batch = micro_batch * accum * world
        self.steps_per_epoch = len(dataset) // self.global_batch
        if self.steps_per_epoch == 0:
            raise UserError(
                f"the training set has {len(dataset)} usable samples, fewer than one global batch "
                f"({micro_batch} micro x {accum} accumulation x {world} ranks = {self.global_batch}); "
                "use more data or a smaller train.micro_batch_size / train.grad_accum_steps"
            )
        self._epoch, self._order = -1, None

    def order(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(len(self.dataset), generator=gen)
        return self._order

    def position(self, step: int) -> dict[str, int]:
        """Where global step `step` reads (stored in checkpoints)."""
        return {"epoch": step // self.steps_per_epoch, "step_in_epoch": step % self.steps_per_epoch,
                "samples": len(self.dataset), "global_batch": self.global_batch}

    def micro_batches(self, step: int) -> list[Batch]:
        """This rank's `accum` micro-batches of global step `step` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self.order(epoch)
        start = within * self.global_batch
        out = []
        for m in range(self.accum):
            first = start + (m * self.world + self.rank) * self.micro
            ids = order[first : first + self.micro].tolist()
            out.append(collate([self.dataset[i] for i in ids], ids, self.pad_id, self.pad_to_multiple))
        return out


def eval_batches(dataset: datasets.Dataset, *, micro_batch: int, rank: int, world: int, pad_id: int,
                 pad_to_multiple: int = 1) -> list[Batch]:
    """This rank's share of the eval set: samples rank, rank + world, ... so that the ranks together see
    every sample once and the eval numbers do not depend on the number of GPUs. Every rank runs the same
    number of batches (sharded models run collectives in every forward): a rank one sample short gets a
    blank row, a copy of a sample with nothing supervised, which adds nothing to the sums."""
    if len(dataset) == 0:
        return []
    per_rank = -(-len(dataset) // world)
    ids = list(range(rank, len(dataset), world))
    rows = [dataset[i] for i in ids]
    if len(rows) < per_rank:
        blank = dataset[0]
        rows.append({"input_ids": blank["input_ids"], "loss_mask": torch.zeros(len(blank["input_ids"]), dtype=torch.bool)})
        ids.append(0)
    return [
        collate(rows[s : s + micro_batch], ids[s : s + micro_batch], pad_id, pad_to_multiple)
        for s in range(0, per_rank, micro_batch)
    ]
