"""The graphed warmup backend's decode step with eager and with compiled decoder layers, side by side.

A random-weight bf16 model of a target's shape, one process, the same left-padded batch through
`BatchDecoder` twice per setting (the decode step replayed as a CUDA graph in both): first 8 rows x 8
tokens, untimed, which includes the compilation of every layer, then `--rows` prompts of 50 to 50 + 3 x
rows tokens for `--new` tokens each, greedy, no stop tokens (every row runs to the limit), timed with the
device synchronised. Reports milliseconds a decode step, the first call's seconds (compilation), and whether
the two settings chose the same tokens (bf16 on random weights: different kernels may flip near-ties).

    # GPU: SmolLM2-135M-Instruct's shape (the embedded target's, and issue 22's regeneration)
    python benchmarks/graphed_step.py --out graphed_step.json
    # CPU smoke run (CI): tiny shapes, float32, where both settings must choose the same tokens
    python benchmarks/graphed_step.py --tiny --out /tmp/graphed_step.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flashdraft.files import write_json  # noqa: E402
from flashdraft.target.batch_decoder import BatchDecoder  # noqa: E402

SHAPES = {
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def measure(model, prompts: list[list[int]], new: int, compiled: bool) -> dict:
    device = model.get_input_embeddings().weight.device
    decoder = BatchDecoder(model, pad_id=0, compile_layers=compiled)
    greedy = lambda logits: logits.argmax(-1)  # noqa: E731
    began = _sync(device)
    decoder.decode(prompts[:8], [8] * min(8, len(prompts)), [], greedy)
    first = _sync(device) - began
    began = _sync(device)
    tokens = decoder.decode(prompts, [new] * len(prompts), [], greedy)
    seconds = _sync(device) - began
    return {"first_call_s": round(first, 2), "seconds": round(seconds, 3),
            "ms_per_step": round(1000 * seconds / new, 3), "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, float32, CPU: checks the script")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--new", type=int, default=512, help="decode steps (new tokens a row)")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.new < 1:
        parser.error(f"--rows and --new must be at least 1, got {args.rows} and {args.new}")
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    shape = "tiny" if args.tiny else "smollm2"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPES[shape]), dtype=dtype).eval()
    vocab = model.config.vocab_size
    prompts = [[(7 * i + j) % (vocab - 5) + 5 for j in range(50 + 3 * i)] for i in range(args.rows)]
    runs = {name: measure(model, prompts, args.new, compiled)
            for name, compiled in (("eager", False), ("compiled", True))}
    same = sum(a == b for a, b in zip(runs["eager"].pop("tokens"), runs["compiled"].pop("tokens")))
    report = {"command": "graphed_step.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "transformers": transformers.__version__, "shape": shape,
              "dtype": str(dtype).removeprefix("torch."), "rows": args.rows, "new_tokens": args.new,
              "runs": runs, "rows_with_equal_tokens": same,
              "eager_over_compiled": round(runs["eager"]["ms_per_step"] / runs["compiled"]["ms_per_step"], 3)}
    write_json(args.out, report)
    for name, run in runs.items():
        print(f"{name:9s} {run['ms_per_step']:8.2f} ms a step   first call {run['first_call_s']:.1f} s")
    print(f"eager / compiled {report['eager_over_compiled']:.2f}x; rows with equal tokens {same} of {args.rows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
