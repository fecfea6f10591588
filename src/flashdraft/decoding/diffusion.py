"""Evaluating a diffusion LM (an mdlm / hybrid export) on a held-out split, and generating with it.

Two measurements:
- masked-token loss and accuracy: the held-out split of the same data config the trainer used (data.eval,
  or the `data.eval_samples` rows it held out with data.seed), corrupted exactly as the trainer's own
  evaluation corrupts it (MDLM masking at the fixed evaluation step), so the numbers are comparable;
- a short generation sample: the first held-out prompts (or evaluate.prompts), answered by iterative
  unmasking: the answer starts as `evaluate.dllm_gen_length` mask tokens and each of `evaluate.dllm_steps`
  bidirectional passes commits the most confident predictions (LLaDA's low-confidence remasking, greedy),
  until no mask is left.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from flashdraft.config import Config
from flashdraft.data.loader import eval_batches
from flashdraft.data.prepare import prepare_datasets
from flashdraft.errors import UserError
from flashdraft.files import write_json
from flashdraft.objectives import eval_sums
from flashdraft.objectives.mdlm import MDLMObjective
from flashdraft.target.source import check_weights, load_target_config, load_tokenizer, source_of
from flashdraft.train.models import load_models


@torch.no_grad()
def generate(objective: MDLMObjective, model: nn.Module, prompt_ids: list[int], *, gen_length: int, steps: int,
             eos_token_id: int | None = None) -> list[int]:
    """Greedy iterative unmasking of `gen_length` tokens after the prompt in `steps` passes (cut at EOS)."""
    mask = objective.mask_token_id
    x = torch.tensor([list(prompt_ids) + [mask] * gen_length], device=objective.device)
    attention = torch.ones_like(x)
    steps = max(1, min(steps, gen_length))
    for step in range(steps):
        masked = x[0] == mask
        masked[: len(prompt_ids)] = False
        remaining = int(masked.sum())
        if remaining == 0:
            break
        logits = objective.logits(model, x, attention, causal=False)[0].float()
        logits[:, mask] = -math.inf  # never "predict" the mask itself
        confidence, predicted = logits.softmax(dim=-1).max(dim=-1)
        confidence[~masked] = -math.inf
        chosen = confidence.topk(math.ceil(remaining / (steps - step))).indices
        x[0, chosen] = predicted[chosen]
    answer = x[0, len(prompt_ids) :].tolist()
    if eos_token_id is not None and eos_token_id in answer:
        answer = answer[: answer.index(eos_token_id)]
    return answer


def prompt_ids_of(tokenizer, messages: list[dict]) -> list[int]:
    """`messages` rendered with the chat template and the generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def evaluate_diffusion_lm(config: Config, output: Path) -> dict[str, Any]:
    """Measure the LM `config.target.name_or_path` on the held-out split of `config.data`; the report,
    also written to `output` (JSON)."""
    if config.data.eval is None and not config.data.eval_samples:
        raise UserError("dllm-evaluate needs a held-out split: set data.eval or data.eval_samples (as in training)")
    # The model under evaluation is the target; a training recipe's draft.init_from is not.
    config = dataclasses.replace(config, draft=dataclasses.replace(config.draft, init_from=None))
    t, settings = config.target, config.evaluate
    source = source_of(t)
    check_weights(source)
    model_config = load_target_config(source, trust_remote_code=t.trust_remote_code)
    tokenizer = load_tokenizer(source, trust_remote_code=t.trust_remote_code)
    # Any trained diffusion LM is measured with the MDLM corruption (hybrid exports too).
    objective = MDLMObjective(config, model_config, MDLMObjective.check(config, model_config, tokenizer))
    with tempfile.TemporaryDirectory() as cache:
        eval_set = prepare_datasets(config.data, tokenizer, min_supervised=1, cache_dir=Path(cache)).eval
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        batches = eval_batches(eval_set, micro_batch=config.train.micro_batch_size, rank=0, world=1, pad_id=pad_id,
                               pad_to_multiple=config.data.pad_to_multiple)
        # Held-out prompts: each row up to its first supervised token (the conversation so far and the
        # assistant header).
        prompt_ids = [row["input_ids"][: int(row["loss_mask"].int().argmax())].tolist()
                      for row in (eval_set[i] for i in range(min(settings.dllm_samples, len(eval_set))))]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    objective.use_device(device)
    model = load_models(config, objective, device).model.eval()
    if device.type == "cuda":  # the compute dtype training used there (bf16 under FSDP's policy)
        model.to(getattr(torch, t.dtype))
    sums = eval_sums(objective, model, tqdm(batches, desc="masked-token eval"))
    metrics = objective.summarise(sums) if sums else {}

    if settings.prompts:
        prompt_ids = [prompt_ids_of(tokenizer, [{"role": "user", "content": p}]) for p in settings.prompts]
    samples = []
    for prompt in prompt_ids:
        answer = generate(objective, model, prompt, gen_length=settings.dllm_gen_length, steps=settings.dllm_steps,
                          eos_token_id=tokenizer.eos_token_id)
        samples.append({"prompt": tokenizer.decode(prompt), "completion": tokenizer.decode(answer),
                        "completion_tokens": len(answer)})
    report = {"model": t.name_or_path, "eval_batches": len(batches), "metrics": metrics, "samples": samples,
              "generation": {"gen_length": settings.dllm_gen_length, "steps": settings.dllm_steps,
                             "mask_token_id": objective.mask_token_id}}
    write_json(output, report, indent=1)
    return report
