"""Process-group setup for one process, torchrun (RANK/WORLD_SIZE/LOCAL_RANK...) or a PyTorchJob (PET_*).

Parallelism is applied from outside the models: FSDP2 `fully_shard` per unit the trainer names, then
the root, with bf16 parameters and fp32 gradient reduction on GPUs (fp32 throughout on CPU/gloo).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Distributed:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier()

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (a copy, float64 on the compute device, returned on the CPU)."""
        out = value.detach().to(self.device, torch.float64).clone()
        dist.all_reduce(out)
        return out.cpu()

    def broadcast(self, value: T) -> T:
        """Rank 0's `value` on every rank (any picklable object)."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def setup() -> Distributed:
    """Join (or create) the default process group; a lone process gets a world of one."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        if world == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(backend, device_id=device if cuda else None)
    log.info("rank %d of %d on %s", rank, world, device)
    return Distributed(rank, world, local_rank, device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def shard(trainable: nn.Module, units: list[nn.Module], device: torch.device) -> nn.Module:
    """FSDP2 over the trainable model: each unit, then the root."""
    if device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    # Drafts are small (~1B parameters, ~2 GB in bf16): keeping each unit's gathered weights from its
    # forward to its backward costs little memory and saves one all-gather per unit and step.
    for unit in units:
        fully_shard(unit, mp_policy=policy, reshard_after_forward=False)
    fully_shard(trainable, mp_policy=policy, reshard_after_forward=False)
    return trainable


def shard_frozen(units: list[nn.Module]) -> None:
    """FSDP2 over the frozen target's layers (embedding and head stay whole: the draft borrows them)."""
    for unit in units:
        fully_shard(unit)
