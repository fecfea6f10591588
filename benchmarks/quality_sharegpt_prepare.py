"""Prompt and benchmark files for the side-by-side quality run (`benchmarks/quality_sharegpt.sh`).

The GPU machine has none of the packaged sources, so they become jsonl files here, with flashdraft's
own loaders (seeded: the same files on every machine):
  prompts_0.jsonl ... prompts_K.jsonl  training prompts (one warmup answers them all): --sharegpt first user
                                       turns of the TRAIN split of packaged:sharegpt, --sharegpt-second-turns
                                       of its conversations cut after their second user turn (the warmup
                                       answers both, the second after the target's own first answer: the
                                       second-turn benchmark's kind of prompt), plus a --mix of the
                                       packaged sources (by default, --mix-weights to change it: 50%
                                       reasoning-gym, every other one with the GSM8K
                                       prompt's step-by-step instruction; 20% stdlib code; 30% word
                                       problems with that instruction), interleaved over the shards
  gsm8k.jsonl, humaneval.jsonl, chat.jsonl
                                       held-out benchmarks (GSM8K test, HumanEval, the EVAL split of chitchat)
  sharegpt_first_turn.jsonl            the EVAL split of packaged:sharegpt: first user turns
  sharegpt_second_turn_source.jsonl    the EVAL split's conversations with two user turns, cut after the
                                       second: the warmup answers both turns with the target (greedy),
                                       and the second turn, with the target's own first answer in
                                       context, becomes the MT-Bench-style benchmark

    python benchmarks/quality_sharegpt_prepare.py --out DIR [--sharegpt 2000] [--sharegpt-second-turns 0]
        [--mix 1000] [--mix-weights reasoning_gym=0.5,stdlib_code=0.2,word_problems=0.3] [--eval-prompts 32] [--shards 4]
        [--exclude EARLIER_DIR ...]

`--exclude` grows a run's prompts across machine windows: the training prompts of the folders it names (earlier
outputs of this script) are left out, --sharegpt and --mix then count new prompts, and the shards are numbered
after the earlier ones, so the warmup answers of all of them sit side by side in one WORK and train together
(a new WORK holding a copy of the earlier answers: `quality_sharegpt.sh all` refuses to continue a WORK it ran
on other shards).

The sources run out: the two draws of the 24,000-prompt runs (8,000 ShareGPT + 4,000 mix each, the second
with --exclude the first) leave 232 new ShareGPT first turns, and stdlib code has 3,986 prompts in all: its
20% share caps a default mix draw at 19,930 prompts, counting those --exclude leaves out, so after those
draws no default mix fits. Later draws take the generated sources, e.g. `--sharegpt 232 --mix 23768
--mix-weights reasoning_gym=0.5,word_problems=0.5`, and the second turns: 12,745 of the train split's 17,076
conversations have one, none of them drawn by the first-turn runs (the two forms are other prompts).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2_prepare import step_by_step, write_jsonl  # noqa: E402

from flashdraft.data.sources import load_chat_dataset  # noqa: E402
from flashdraft.decoding.benchmarks import load_benchmark  # noqa: E402
from flashdraft.errors import UserError  # noqa: E402

MIX_SOURCES = ("reasoning_gym", "stdlib_code", "word_problems")
DEFAULT_MIX = "reasoning_gym=0.5,stdlib_code=0.2,word_problems=0.3"


def first_turn(messages: list[dict]) -> list[dict]:
    """The conversation up to and with its first user turn (a system turn before it stays)."""
    return messages[: next(i for i, m in enumerate(messages) if m["role"] == "user") + 1]


def through_second_turn(messages: list[dict]) -> list[dict] | None:
    """The conversation cut after its second user turn, or None where it has no second one."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    return messages[: users[1] + 1] if len(users) >= 2 else None


def earlier_prompts(folders: list[Path], out: Path) -> tuple[set[str], int]:
    """The training prompts (as json text) of earlier outputs of this script, and the first shard number after
    theirs; a SystemExit naming the problem where a folder is not one."""
    prompts, last = set(), -1
    for folder in folders:
        if folder.resolve() == out.resolve():
            sys.exit(f"error: --exclude {folder} is --out: this run would replace the prompts it leaves out; "
                     "give another --out")
        shards = {int(m.group(1)): path for path in folder.glob("prompts_*.jsonl")
                  if (m := re.fullmatch(r"prompts_(\d+)\.jsonl", path.name))}
        if not shards:
            sys.exit(f"error: --exclude {folder} holds no prompts_K.jsonl; give a folder this script wrote")
        for path in shards.values():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                try:
                    prompts.add(json.dumps(json.loads(line)["messages"]))
                except (ValueError, KeyError, TypeError):
                    sys.exit(f"error: {path}:{number} is not a prompt row of this script ({{\"messages\": [...]}})")
        last = max(last, *shards)
    return prompts, last + 1


def fresh(candidates: list[tuple[list[dict], list[dict]]], excluded: set[str], count: int, flag: str) -> list:
    """The first `count` prompts of (prompt, other form) pairs whose forms are both outside `excluded` (an
    earlier run may have asked the same question in the other form); a SystemExit where too few are left."""
    kept = [prompt for prompt, other in candidates
            if json.dumps(prompt) not in excluded and json.dumps(other) not in excluded][:count]
    if len(kept) < count:
        left = f"are left after the {len(excluded)} of --exclude" if excluded else "are in the source"
        sys.exit(f"error: only {len(kept)} {flag} prompts {left}; lower --{flag} to at most {len(kept)}")
    return kept


def mix_weights(text: str) -> dict[str, float]:
    """`--mix-weights`: NAME=WEIGHT pairs over the packaged mix's sources, each named once, weights > 0."""
    weights: dict[str, float] = {}
    for pair in text.split(","):
        name, _, value = pair.partition("=")
        name = name.strip()
        if name not in MIX_SOURCES or name in weights:
            raise argparse.ArgumentTypeError(
                f"{pair!r}: each of {', '.join(MIX_SOURCES)} may be named once, as NAME=WEIGHT")
        try:
            weight = float(value)
        except ValueError:
            weight = None
        if weight is None or not 0 < weight < math.inf:
            raise argparse.ArgumentTypeError(f"{pair!r}: the weight must be a finite number above 0")
        weights[name] = weight
    return weights


def draw_mix(count: int, weights: dict[str, float], excluded: set[str]) -> list[list[dict]]:
    """`count` new prompts of the packaged mix (weights: shares, normalised by the loader); word problems and
    every other reasoning-gym prompt carry the step-by-step instruction (the other form is checked against
    `excluded` too)."""
    mix = load_chat_dataset([f"packaged:{name}@{weight:g}" for name, weight in weights.items()],
                            split="train", limit=count + len(excluded), seed=0)
    packaged = []
    for index, (source, messages) in enumerate(zip(mix["source"], mix["messages"])):
        opening = first_turn(messages)
        # `source` is the mixture member's spec, e.g. packaged:word_problems@0.3
        asks_steps = "word_problems" in source or ("reasoning_gym" in source and index % 2 == 0)
        packaged.append((step_by_step(opening), opening) if asks_steps else (opening, step_by_step(opening)))
    return fresh(packaged, excluded, count, "mix")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sharegpt", type=int, default=2000, help="ShareGPT training prompts")
    parser.add_argument("--sharegpt-second-turns", type=int, default=0,
                        help="ShareGPT conversations cut after their second user turn; the warmup answers both")
    parser.add_argument("--mix", type=int, default=1000, help="training prompts from the packaged mix")
    parser.add_argument("--mix-weights", type=mix_weights, default=DEFAULT_MIX, metavar="NAME=W,...",
                        help="the mix's sources and their shares (default: %(default)s); stdlib_code has about "
                             "4,000 prompts in all")
    parser.add_argument("--eval-prompts", type=int, default=32, help="prompts per benchmark")
    parser.add_argument("--shards", type=int, default=8,
                        help="training prompt files (quality_sharegpt.sh answers a DATA's in one warmup)")
    parser.add_argument("--exclude", type=Path, nargs="+", default=[], metavar="EARLIER_DIR",
                        help="earlier outputs of this script: their training prompts are left out, the shards "
                             "numbered after theirs")
    args = parser.parse_args(argv)
    for flag in ("eval_prompts", "shards"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("sharegpt", "sharegpt_second_turns", "mix"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.sharegpt + args.sharegpt_second_turns + args.mix == 0:
        parser.error("--sharegpt, --sharegpt-second-turns and --mix are all 0: there would be no training prompts")
    excluded, first_shard = earlier_prompts(args.exclude, args.out)
    try:
        files, training, counts = draw(args, excluded)
    except UserError as error:  # e.g. a mix share larger than its source
        sys.exit(f"error: {error}")
    if excluded:
        counts.update(left_out_as_earlier=len(excluded), first_shard=first_shard)

    # Every draw succeeded: only now is anything written.
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        write_jsonl(args.out / f"{name}.jsonl", rows)
    for stale in args.out.glob("prompts_*.jsonl"):  # a rerun with fewer shards must not leave old ones
        stale.unlink()
    for shard in range(args.shards):
        write_jsonl(args.out / f"prompts_{first_shard + shard}.jsonl", training[shard:: args.shards])
    (args.out / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    print(json.dumps(counts))
    return 0


def draw(args: argparse.Namespace, excluded: set[str]) -> tuple[dict[str, list[dict]], list[dict], dict]:
    """The benchmark files' rows (by file name), the training prompts' rows and the counts."""
    files: dict[str, list[dict]] = {}
    held_out = set()
    for name in ("gsm8k", "humaneval", "chat"):
        bench = load_benchmark(name, limit=args.eval_prompts)
        files[name] = [{"messages": m} for m in bench.prompts]
        held_out.update(json.dumps(m) for m in bench.prompts)
    # ShareGPT's eval split is a hash of the conversation id (packaged.py), disjoint from its train split.
    conversations = load_chat_dataset("packaged:sharegpt", split="eval", seed=0)["messages"]
    files["sharegpt_first_turn"] = [{"messages": first_turn(m)} for m in conversations[: args.eval_prompts]]
    seconds = [cut for cut in map(through_second_turn, conversations) if cut is not None]
    files["sharegpt_second_turn_source"] = [{"messages": m} for m in seconds[: args.eval_prompts]]

    # Without --exclude each draw is exactly the count asked for (the published runs' prompts); with it, one
    # larger by the prompts left out, from which the first new ones are taken.
    sharegpt = []
    if args.sharegpt:
        sharegpt = [first_turn(m) for m in load_chat_dataset(
            "packaged:sharegpt", limit=args.sharegpt + len(excluded), seed=0)["messages"]]
        sharegpt = fresh([(m, m) for m in sharegpt], excluded, args.sharegpt, "sharegpt")
    second_turns = []
    if args.sharegpt_second_turns:
        cut = [m for m in map(through_second_turn, load_chat_dataset("packaged:sharegpt", seed=0)["messages"])
               if m is not None]
        second_turns = fresh([(m, m) for m in cut], excluded, args.sharegpt_second_turns, "sharegpt-second-turns")
    packaged = draw_mix(args.mix, args.mix_weights, excluded) if args.mix else []
    drawn = sharegpt + second_turns + packaged
    training = [{"messages": m} for m in drawn if json.dumps(m) not in held_out]
    # quality_sharegpt.sh reads sharegpt_second_turns to answer every user turn of these shards.
    counts = {"sharegpt": len(sharegpt), "sharegpt_second_turns": len(second_turns), "mix": len(packaged),
              "mix_weights": args.mix_weights, "dropped_as_held_out": len(drawn) - len(training),
              "eval_prompts": args.eval_prompts, "second_turn_conversations": min(len(seconds), args.eval_prompts)}
    return files, training, counts


if __name__ == "__main__":
    sys.exit(main())
