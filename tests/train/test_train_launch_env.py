"""How `flashdraft train` finds its process group: torchrun's variables, or a PyTorchJob's PET_* ones."""

from __future__ import annotations

import sys

from flashdraft.train.distributed import torchrun_command


def test_pet_variables_relaunch_under_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    assert torchrun_command(["train", "--config", "x"]) is None  # a plain single process
    monkeypatch.setenv("PET_NPROC_PER_NODE", "8")
    # torchrun itself reads PET_NNODES / PET_NODE_RANK / PET_MASTER_ADDR / PET_MASTER_PORT.
    assert torchrun_command(["train", "--config", "x"]) == [
        sys.executable, "-m", "torch.distributed.run", "-m", "flashdraft.cli", "train", "--config", "x"]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # already a torchrun worker: no second launch
    assert torchrun_command(["train"]) is None
