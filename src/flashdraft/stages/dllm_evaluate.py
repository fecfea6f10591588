"""`flashdraft dllm-evaluate`: evaluate a diffusion LM (an mdlm / hybrid export) on a held-out split.

    flashdraft dllm-evaluate --model runs/train/export --config llada2_sft [key=value ...] --output report.json

Two measurements:
- masked-token loss and accuracy: the held-out split of the same data config the trainer used (data.eval,
  or the `data.eval_samples` rows it held out with data.seed), corrupted exactly as the trainer's own
  evaluation corrupts it (MDLM masking, the fixed evaluation step), so the numbers are comparable;
- a short generation sample: the first held-out prompts (or --prompt), answered by iterative unmasking:
  the answer starts as `--gen-length` mask tokens and each of `--steps` bidirectional passes commits the
  most confident predictions (LLaDA's low-confidence remasking, greedy), until no mask is left.
The report (JSON) is written atomically and logged to MLflow (a `dllm_evaluate` run) when tracking is on.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from flashdraft.target.source import load_target_config, load_tokenizer
from flashdraft.config import load_config
from flashdraft.data.loader import eval_batches, prepare_datasets
from flashdraft.errors import UserError
from flashdraft.objectives.mdlm import MDLMStrategy
from flashdraft.tracking.runs import step_run
from flashdraft.train.metrics import add_sums
from flashdraft.train.trainer import EVAL_STEP

log = logging.getLogger(__name__)


@torch.no_grad()
def generate(strategy: MDLMStrategy, model, prompt_ids: list[int], *, gen_length: int, steps: int,
             eos_token_id: int | None = None) -> list[int]:
    """Greedy iterative unmasking of `gen_length` tokens after the prompt in `steps` passes (cut at EOS)."""
    mask = strategy.mask_token_id
    device = strategy.device
    x = torch.tensor([list(prompt_ids) + [mask] * gen_length], device=device)
    attention = torch.ones_like(x)
    steps = max(1, min(steps, gen_length))
    for step in range(steps):
        masked = x[0] == mask
        masked[: len(prompt_ids)] = False
        remaining = int(masked.sum())
        if remaining == 0:
            break
        logits = strategy.logits(model, x, attention, causal=False)[0].float()
        logits[:, mask] = -math.inf  # never "predict" the mask itself
        confidence, predicted = logits.softmax(dim=-1).max(dim=-1)
        confidence[~masked] = -math.inf
        chosen = confidence.topk(math.ceil(remaining / (steps - step))).indices
        x[0, chosen] = predicted[chosen]
    answer = x[0, len(prompt_ids) :].tolist()
    if eos_token_id is not None and eos_token_id in answer:
        answer = answer[: answer.index(eos_token_id)]
    return answer


def masked_token_metrics(strategy: MDLMStrategy, model, batches) -> dict[str, float]:
    sums: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for batch in tqdm(batches, desc="masked-token eval"):
            _, counts = strategy.loss(model, strategy.prepare(batch, EVAL_STEP))
            add_sums(sums, counts)
    return strategy.summarise(sums) if sums else {}


def prompt_ids_of(tokenizer, messages: list[dict]) -> list[int]:
    """`messages` rendered with the chat template and the generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def evaluate(model_dir: str, *, recipe: str | None, overrides: list[str], prompts: list[str], num_samples: int,
             gen_length: int, steps: int) -> dict:
    config = load_config(recipe, [*overrides, f"target.name_or_path={model_dir}", "draft.init_from=null"])
    if config.data.eval is None and not config.data.eval_samples:
        raise UserError("dllm-evaluate needs a held-out split: set data.eval or data.eval_samples (as in training)")
    t = config.target
    model_config = load_target_config(model_dir, trust_remote_code=t.trust_remote_code)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=t.trust_remote_code)
    # Any trained diffusion LM is measured with the MDLM corruption (hybrid exports too).
    strategy = MDLMStrategy(config, model_config, MDLMStrategy.check(config, model_config, tokenizer))
    with tempfile.TemporaryDirectory() as cache:
        _, eval_set = prepare_datasets(config.data, tokenizer, min_supervised=1, cache_dir=Path(cache),
                                       is_main=True, barrier=lambda: None)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        batches = eval_batches(eval_set, micro_batch=config.train.micro_batch_size, rank=0, world=1, pad_id=pad_id,
                               pad_to_multiple=config.data.pad_to_multiple)
        # Held-out prompts: each row up to its first supervised token (the conversation so far and the
        # assistant header).
        prompt_ids = [row["input_ids"][: int(row["loss_mask"].int().argmax())].tolist()
                      for row in (eval_set[i] for i in range(min(num_samples, len(eval_set))))]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = strategy.build(device).eval()
    if device.type == "cuda":  # the compute dtype training used there (bf16 under FSDP's policy)
        model.to(getattr(torch, t.dtype))
    metrics = masked_token_metrics(strategy, model, batches)

    if prompts:
        prompt_ids = [prompt_ids_of(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    samples = []
    for prompt in prompt_ids:
        answer = generate(strategy, model, prompt, gen_length=gen_length, steps=steps,
                          eos_token_id=tokenizer.eos_token_id)
        samples.append({"prompt": tokenizer.decode(prompt), "completion": tokenizer.decode(answer),
                        "completion_tokens": len(answer)})
    return {"model": str(model_dir), "eval_batches": len(batches), "metrics": metrics, "samples": samples,
            "generation": {"gen_length": gen_length, "steps": steps, "mask_token_id": strategy.mask_token_id}}


# -- command -------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF folder of the trained diffusion LM (a train export)")
    parser.add_argument("--config", help="the recipe the model was trained with (its data and strategy settings)")
    parser.add_argument("--output", required=True, help="report JSON path")
    parser.add_argument("--prompt", action="append", default=[],
                        help="generation prompt (repeatable); default: the first held-out conversations")
    parser.add_argument("--num-samples", type=int, default=2, help="held-out prompts to answer (without --prompt)")
    parser.add_argument("--gen-length", type=int, default=32, help="tokens per generated answer")
    parser.add_argument("--steps", type=int, default=16, help="unmasking passes per answer")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides as in training, e.g. data.train=chats.jsonl data.eval_samples=64")


def main(args: argparse.Namespace) -> int:
    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"--model {args.model!r} is not a model folder (no config.json); give a train export")
    if args.gen_length < 1 or args.steps < 1:
        raise UserError("--gen-length and --steps must be >= 1")
    with step_run("dllm_evaluate") as tracking:
        report = evaluate(args.model, recipe=args.config, overrides=args.overrides, prompts=args.prompt,
                          num_samples=args.num_samples, gen_length=args.gen_length, steps=args.steps)
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_name(f".{output.name}.tmp")
        tmp.write_text(json.dumps(report, indent=1))
        os.replace(tmp, output)
        tracking.log_metrics({f"eval_{k}": v for k, v in report["metrics"].items()})
        tracking.log_dict(report, "dllm_report.json")
    log.info("masked-token eval: %s", report["metrics"])
    return 0
