"""Tiny diffusion-LM models, batches and objectives shared by the mdlm / hybrid tests and the LLaDA2 pipeline test."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from flashdraft.config import load_config
from flashdraft.data import Batch
from flashdraft.objectives import get_objective
from flashdraft.target.source import load_target_config, load_tokenizer
from flashdraft.train.models import load_models
from tiny_models import tiny_config, tiny_tokenizer


MASK_ID = 3  # <|reserved_0|> of the tiny tokenizer


EPS = 1e-3


def save_model(path: Path, *, bidirectional: bool, seed: int = 0) -> Path:
    """A tiny random llama; `bidirectional` saves it with `is_causal: false` (a bidirectional model)."""
    config = tiny_config("llama", num_layers=2)
    if bidirectional:
        config.is_causal = False
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def make_objective(path: Path, name: str = "mdlm", **overrides):
    values = {"target.name_or_path": str(path), "objective.name": name, "objective.mask_token_id": MASK_ID,
              "objective.mdlm_eps": EPS, **overrides}
    config = load_config(None, [f"{k}={v}" for k, v in values.items()])
    return get_objective(name).plan(config, load_target_config(str(path)), load_tokenizer(str(path)))


def load_model(objective) -> nn.Module:
    """The LM `objective` trains, on the CPU and bound to it, as the trainer loads it."""
    cpu = torch.device("cpu")
    objective.use_device(cpu)
    return load_models(objective.config, objective, cpu).model


def sample(sample_id: int, length: int, prompt: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (a function of the sample id) and its loss mask (everything after the prompt)."""
    gen = torch.Generator().manual_seed(1000 + sample_id)
    ids = torch.randint(4, 260, (length,), generator=gen)
    return ids, torch.arange(length) >= prompt


def make_batch(rows: list[tuple[int, int]]) -> Batch:
    """Right-padded batch of (sample_id, length) rows."""
    width = max(length for _, length in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for r, (sid, length) in enumerate(rows):
        ids[r, :length], loss_mask[r, :length] = sample(sid, length)
        attention[r, :length] = 1
    return Batch(ids, attention, loss_mask, torch.tensor([sid for sid, _ in rows]))


ROWS = [(0, 20), (1, 14), (2, 17), (3, 9)]


def global_step_grads(objective, model, micro_batches: list[Batch]) -> tuple[dict, float]:
    """What the trainer does within one step: every micro-step's loss sum / the step's target count."""
    model.zero_grad(set_to_none=True)
    prepared = [objective.prepare(b, step=2) for b in micro_batches]
    count = sum(p.num_targets for p in prepared)
    total = 0.0
    for p in prepared:
        loss_sum, _ = objective.loss(model, p)
        (loss_sum / count).backward()
        total += float(loss_sum.detach())
    return {k: v.grad.clone() for k, v in model.named_parameters()}, total / count
