"""Prompt and benchmark files for the side-by-side quality run (`benchmarks/quality_sharegpt.sh`).

The GPU machine has none of the packaged sources, so they become jsonl files here, with flashdraft's
own loaders (seeded: the same files on every machine):
  prompts_0.jsonl ... prompts_K.jsonl  training prompts, one warmup process each: --sharegpt first user
                                       turns of the TRAIN split of packaged:sharegpt, plus a --mix of the
                                       packaged sources (50% reasoning-gym, every other one with the GSM8K
                                       prompt's step-by-step instruction; 20% stdlib code; 30% word
                                       problems with that instruction), interleaved over the shards
  gsm8k.jsonl, humaneval.jsonl, chat.jsonl
                                       held-out benchmarks (GSM8K test, HumanEval, the EVAL split of chitchat)
  sharegpt_first_turn.jsonl            the EVAL split of packaged:sharegpt: first user turns
  sharegpt_second_turn_source.jsonl    the EVAL split's conversations with two user turns, cut after the
                                       second: the warmup answers both turns with the target (greedy),
                                       and the second turn, with the target's own first answer in
                                       context, becomes the MT-Bench-style benchmark

    python benchmarks/quality_sharegpt_prepare.py --out DIR [--sharegpt 2000] [--mix 1000]
        [--eval-prompts 32] [--shards 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2_prepare import step_by_step, write_jsonl  # noqa: E402

from flashdraft.data.sources import load_chat_dataset  # noqa: E402
from flashdraft.decoding.benchmarks import load_benchmark  # noqa: E402


def first_turn(messages: list[dict]) -> list[dict]:
    """The conversation up to and with its first user turn (a system turn before it stays)."""
    return messages[: next(i for i, m in enumerate(messages) if m["role"] == "user") + 1]


def through_second_turn(messages: list[dict]) -> list[dict] | None:
    """The conversation cut after its second user turn, or None where it has no second one."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    return messages[: users[1] + 1] if len(users) >= 2 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sharegpt", type=int, default=2000, help="ShareGPT training prompts")
    parser.add_argument("--mix", type=int, default=1000, help="training prompts from the packaged mix")
    parser.add_argument("--eval-prompts", type=int, default=32, help="prompts per benchmark")
    parser.add_argument("--shards", type=int, default=8, help="training prompt files, one warmup process each")
    args = parser.parse_args(argv)
    for flag in ("sharegpt", "mix", "eval_prompts", "shards"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    args.out.mkdir(parents=True, exist_ok=True)

    held_out = set()
    for name in ("gsm8k", "humaneval", "chat"):
        bench = load_benchmark(name, limit=args.eval_prompts)
        write_jsonl(args.out / f"{name}.jsonl", [{"messages": m} for m in bench.prompts])
        held_out.update(json.dumps(m) for m in bench.prompts)
    # ShareGPT's eval split is a hash of the conversation id (packaged.py), disjoint from its train split.
    conversations = load_chat_dataset("packaged:sharegpt", split="eval", seed=0)["messages"]
    write_jsonl(args.out / "sharegpt_first_turn.jsonl",
                [{"messages": first_turn(m)} for m in conversations[: args.eval_prompts]])
    seconds = [cut for cut in map(through_second_turn, conversations) if cut is not None]
    write_jsonl(args.out / "sharegpt_second_turn_source.jsonl", [{"messages": m} for m in seconds[: args.eval_prompts]])

    sharegpt = [first_turn(m) for m in load_chat_dataset("packaged:sharegpt", limit=args.sharegpt, seed=0)["messages"]]
    mix = load_chat_dataset(["packaged:reasoning_gym@0.5", "packaged:stdlib_code@0.2", "packaged:word_problems@0.3"],
                            split="train", limit=args.mix, seed=0)
    packaged = []
    for index, (source, messages) in enumerate(zip(mix["source"], mix["messages"])):
        opening = first_turn(messages)
        # `source` is the mixture member's spec, e.g. packaged:word_problems@0.3
        asks_steps = "word_problems" in source or ("reasoning_gym" in source and index % 2 == 0)
        packaged.append(step_by_step(opening) if asks_steps else opening)
    rows = [{"messages": m} for m in sharegpt + packaged if json.dumps(m) not in held_out]
    for stale in args.out.glob("prompts_*.jsonl"):  # a rerun with fewer shards must not leave old ones
        stale.unlink()
    for shard in range(args.shards):
        write_jsonl(args.out / f"prompts_{shard}.jsonl", rows[shard:: args.shards])
    counts = {"sharegpt": len(sharegpt), "mix": len(packaged),
              "dropped_as_held_out": len(sharegpt) + len(packaged) - len(rows),
              "eval_prompts": args.eval_prompts, "second_turn_conversations": min(len(seconds), args.eval_prompts)}
    (args.out / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
