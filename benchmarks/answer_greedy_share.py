"""How much of a regenerated training set is the target's own greedy choice, and how much it would be
under other sampling settings.

    python benchmarks/answer_greedy_share.py --target TARGET --answers A.jsonl [B.jsonl ...] \
        --samples 80 --sampling 0.8 0.2,0.9 --out FILE.json

Runs the target teacher-forced over regenerated conversations (`messages` rows, as `flashdraft warmup`
writes them) and reports, over the assistant tokens: the share equal to the target's argmax, the mean
entropy of its next-token distribution, and for each `--sampling T[,TOP_P[,TOP_K]]` the expected share
that sampling with those settings would draw the argmax (the mean probability of the argmax after
temperature, top-k and top-p, as warmup applies them). For answers sampled at T the measured share and
the expected share at T agree up to sampling noise, which checks the measurement.

Why: evaluation decodes greedily, so a draft is scored on predicting the target's greedy continuation.
A label that is not the argmax teaches a continuation greedy decoding never takes, and slot k of a
block is greedy-consistent only when all k labels before it are: about share**k.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch


def parse_sampling(text: str):
    from flashdraft.data.sampling import Sampling
    from flashdraft.errors import UserError

    parts = text.split(",")
    if not 1 <= len(parts) <= 3:
        raise SystemExit(f"error: --sampling {text!r} is not T[,TOP_P[,TOP_K]] (e.g. 0.2,0.9)")
    try:
        params = Sampling(float(parts[0]), float(parts[1]) if len(parts) > 1 else 1.0,
                          int(parts[2]) if len(parts) > 2 else 0)
    except ValueError:
        raise SystemExit(f"error: --sampling {text!r} is not T[,TOP_P[,TOP_K]] (numbers, e.g. 0.2,0.9)") from None
    except UserError as error:
        raise SystemExit(f"error: --sampling {text!r}: {error}") from None
    if params.greedy:
        raise SystemExit(f"error: --sampling {text!r}: temperature 0 draws the argmax always; give T > 0")
    return params


def read_rows(paths: list[Path], samples: int, seed: int) -> list[list[dict]]:
    rows = []
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"error: {path} does not exist; give the train.jsonl files that warmup wrote")
        # Iterating the file splits at newlines only: str.splitlines would also split inside a JSON
        # string at characters such as U+2028, which real answers contain.
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                try:
                    rows.append(json.loads(line)["messages"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise SystemExit(f"error: {path}:{number} is not a JSON row with `messages`") from None
    random.Random(seed).shuffle(rows)
    return rows[:samples]


def measure(model, tokenizer, conversations: list[list[dict]], settings: list, max_length: int) -> dict:
    from flashdraft.data.chat import tokenize_chat
    from flashdraft.data.sampling import sampling_probs

    tokens, greedy, entropy = 0, 0, 0.0
    expected = [0.0] * len(settings)
    for messages in conversations:
        ids, mask = tokenize_chat(tokenizer, messages, max_length)
        ids_t = torch.tensor([ids], device=model.device)
        with torch.no_grad():
            logits = model(ids_t).logits[0, :-1].float()
        # Position i's logits predict token i + 1: score the supervised tokens after the first.
        labels = ids_t[0, 1:]
        keep = torch.tensor(mask[1:], device=model.device)
        logits, labels = logits[keep], labels[keep]
        argmax = logits.argmax(-1)
        tokens += len(labels)
        greedy += int((argmax == labels).sum())
        logp = logits.log_softmax(-1)
        entropy += float(-(logp.exp() * logp).sum())
        for i, params in enumerate(settings):
            expected[i] += float(sampling_probs(logits, params).gather(-1, argmax[:, None]).sum())
    if not tokens:
        raise SystemExit("error: the conversations have no assistant tokens to score")
    return {
        "conversations": len(conversations), "tokens": tokens, "greedy_share": greedy / tokens,
        "entropy_nats": entropy / tokens,
        "expected_greedy_share": [{"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
                                   "share": e / tokens} for p, e in zip(settings, expected)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True, help="a transformers model folder (warmup's target_path)")
    parser.add_argument("--answers", type=Path, nargs="+", required=True, help="regenerated train.jsonl files")
    parser.add_argument("--samples", type=int, default=80, help="conversations to score, drawn at random")
    parser.add_argument("--sampling", nargs="*", default=[], metavar="T[,TOP_P[,TOP_K]]",
                        help="settings to compute the expected greedy share for")
    parser.add_argument("--max-length", type=int, default=1024, help="tokens of a conversation scored")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON file for the numbers")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.max_length < 2:
        raise SystemExit("error: --samples must be >= 1 and --max-length >= 2")
    settings = [parse_sampling(text) for text in args.sampling]
    if not (args.target / "config.json").is_file():
        raise SystemExit(f"error: {args.target} has no config.json; give a transformers model folder "
                         "(for a GGUF: the path that warmup's manifest names as target_path)")
    conversations = read_rows(args.answers, args.samples, args.seed)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashdraft.files import write_json

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()
    result = {"command": " ".join(["answer_greedy_share.py", *(argv if argv is not None else sys.argv[1:])]),
              "answers": [str(p) for p in args.answers], "max_length": args.max_length, "seed": args.seed,
              **measure(model, tokenizer, conversations, settings, args.max_length)}
    if args.out:
        write_json(args.out, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
