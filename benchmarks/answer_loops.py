"""How much of a set of regenerated answers is verbatim loops (`flashdraft.data.repetition`).

    python benchmarks/answer_loops.py --tokenizer TARGET --answers A.jsonl [B.jsonl ...] [--first 256] --out FILE.json

For the last assistant turn of every row (`messages` rows, as `flashdraft warmup` writes them): the share
of answer tokens that repeat the 32 tokens before them verbatim from earlier in the same answer, over all
answers, over the answers the token limit cut ("length") and over the ones that stopped, and over each
answer's first --first tokens (what a decoding benchmark of that many new tokens sees). Warmup records the
same count from the generated token ids; this re-tokenises the text, for answer files of any origin.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flashdraft.data.repetition import LOOP_WINDOW, looped_flags


def answer_loops(rows, tokenize, first: int) -> dict:
    """Looped-token shares of the rows' last assistant answers (module docstring)."""
    groups: dict[str, list[int]] = {}  # name -> [answers, tokens, looped tokens]
    for row in rows:
        answer = next(m["content"] for m in reversed(row["messages"]) if m["role"] == "assistant")
        ids = tokenize(answer)
        flags = looped_flags(ids)  # a token's flag looks back only: a prefix's flags are the same
        looped = sum(flags)
        names = ("all", "cut at the limit" if row.get("finish_reason") == "length" else "stopped")
        for name in names:
            total = groups.setdefault(name, [0, 0, 0])
            total[0] += 1
            total[1] += len(ids)
            total[2] += looped
        head = groups.setdefault(f"first {first} tokens", [0, 0, 0])
        head[0] += 1
        head[1] += min(len(ids), first)
        head[2] += sum(flags[:first])
    return {name: {"answers": n, "tokens": tokens, "looped_share": round(looped / max(tokens, 1), 4)}
            for name, (n, tokens, looped) in groups.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="the target's folder (warmup's target_path)")
    parser.add_argument("--answers", type=Path, nargs="+", required=True, help="regenerated train.jsonl files")
    parser.add_argument("--first", type=int, default=256, help="also count each answer's first N tokens")
    parser.add_argument("--out", type=Path, help="JSON file for the numbers")
    args = parser.parse_args(argv)
    if args.first < 1:
        parser.error(f"--first must be >= 1, got {args.first}")
    missing = [str(p) for p in args.answers if not p.is_file()]
    if missing:
        raise SystemExit(f"error: no answers file {', '.join(missing)}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

    def rows():
        for path in args.answers:
            with open(path, encoding="utf-8") as handle:
                yield from (json.loads(line) for line in handle if line.strip())

    result = {"command": " ".join(["answer_loops.py", *(argv if argv is not None else sys.argv[1:])]),
              "window": LOOP_WINDOW,
              "shares": answer_loops(rows(), lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
                                     args.first)}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
