"""Where a graphed warmup decode step spends its time when many rows decode at once.

A random-weight bf16 model of SmolLM2-135M's shape, one process. Every row's cache ring holds 1,024 slots (one
prompt of 768 tokens and 256 new tokens sets it, as the training length does in issue 22's regeneration); the
other prompts are 50 to 600 tokens. For each `--rows`, `BatchDecoder` decodes that many prompts for `--new`
tokens with no stop tokens, greedy and sampled at the regeneration's settings (T=0.2, top-p 0.9): the difference
is the token choice's share. Then, at the largest `--rows`, the pieces alone: the token choice on its logits, and
one layer's grouped attention over the ring (times the layers); and the kernels of an eager decode step under
torch.profiler, by device time (two calls of 4 and 36 steps: their difference leaves the prefill out).

    python benchmarks/warmup_step_profile.py --out warmup_step_profile.json           # GPU
    python benchmarks/warmup_step_profile.py --tiny --out /tmp/warmup_step_profile.json   # CPU smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphed_step import SHAPES, _sync  # noqa: E402

from flashdraft.data.sampling import Sampling, choose  # noqa: E402
from flashdraft.files import write_json  # noqa: E402
from flashdraft.target import batch_decoder, grouped_attention  # noqa: E402
from flashdraft.target.step_graphs import StepGraphs  # noqa: E402

REGENERATION = Sampling(temperature=0.2, top_p=0.9)


def _prompts(rows: int, vocab: int, ring: int, new: int, shortest: int, longest: int) -> list[list[int]]:
    """`rows` prompts of `shortest` to `longest` tokens, the first one `ring - new` long: every row's ring is
    `ring` slots."""
    lengths = [ring - new] + [shortest + (37 * i) % (longest - shortest + 1) for i in range(1, rows)]
    return [[(11 * i + j) % (vocab - 5) + 5 for j in range(n)] for i, n in enumerate(lengths)]


def step_ms(decoder, prompts, new: int, choice) -> float:
    device = decoder.device
    decoder.decode(prompts[:2], [4, 4], [], choice)  # the first call's graph capture and allocations
    began = _sync(device)
    decoder.decode(prompts, [new] * len(prompts), [], choice)
    return round(1000 * (_sync(device) - began) / new, 3)


def piece_ms(fn, device: torch.device, repeats: int) -> float:
    fn()
    began = _sync(device)
    for _ in range(repeats):
        fn()
    return round(1000 * (_sync(device) - began) / repeats, 3)


def kernel_times(decoder, prompts, steps: int, device: torch.device) -> dict[str, float]:
    """Device (CPU: self) microseconds by kernel name of one eager decode call of `steps` steps, its prefill
    included (no graph: the profiler sees each launch)."""
    from torch.profiler import ProfilerActivity, profile

    original = batch_decoder.StepGraphs.for_device
    batch_decoder.StepGraphs.for_device = classmethod(lambda cls, device, enabled=True: StepGraphs(False))
    try:
        activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            decoder.decode(prompts, [steps] * len(prompts), [], lambda logits: choose(logits, REGENERATION, None)[0])
            _sync(device)
    finally:
        batch_decoder.StepGraphs.for_device = original
    attr = "device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return {e.key: getattr(e, attr) for e in prof.key_averages() if getattr(e, attr) > 0}


def step_kernels(decoder, prompts, device: torch.device, few: int, many: int, top: int) -> list[dict]:
    """Kernel time a decode step: two calls of `few` and `many` steps, their difference over the extra steps
    (the prefill, the same in both, drops out)."""
    short, long = (kernel_times(decoder, prompts, steps, device) for steps in (few, many))
    per_step = {name: (long.get(name, 0.0) - short.get(name, 0.0)) / (many - few) / 1000 for name in long}
    total = sum(v for v in per_step.values() if v > 0)
    ranked = sorted(per_step.items(), key=lambda item: item[1], reverse=True)[:top]
    return [{"name": name[:120], "ms_per_step": round(ms, 4), "share": round(ms / total, 3)} for name, ms in ranked]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, float32, CPU: checks the script")
    parser.add_argument("--rows", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--new", type=int, default=256, help="decode steps (new tokens a row)")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    args = parser.parse_args(argv)
    if min(args.rows) < 1 or args.new < 1:
        parser.error(f"--rows and --new must be at least 1, got {args.rows} and {args.new}")
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    shape = "tiny" if args.tiny else "smollm2"
    ring = 96 if args.tiny else 1024
    if args.new >= ring - 600 and not args.tiny:
        parser.error(f"--new must leave room for the 600-token prompts in a ring of {ring}, got {args.new}")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPES[shape]), dtype=dtype).eval()
    config, vocab = model.config, model.config.vocab_size
    new = min(args.new, ring // 4) if args.tiny else args.new
    decoder = batch_decoder.BatchDecoder(model, pad_id=0)
    generator = torch.Generator(device).manual_seed(0)
    sampled = lambda logits: choose(logits, REGENERATION, generator)[0]  # noqa: E731
    greedy = lambda logits: logits.argmax(-1)  # noqa: E731
    steps = {}
    lengths = (4, 41) if args.tiny else (50, 600)  # the other prompts: the tiny ring holds 96 slots
    for rows in args.rows:
        prompts = _prompts(rows, vocab, ring, new, *lengths)
        steps[rows] = {"greedy_ms": step_ms(decoder, prompts, new, greedy),
                       "sampled_ms": step_ms(decoder, prompts, new, sampled)}
        print(f"{rows:5d} rows: {steps[rows]['greedy_ms']:8.2f} ms a step greedy, "
              f"{steps[rows]['sampled_ms']:8.2f} sampled")
    rows = max(args.rows)
    logits = torch.randn(rows, vocab, device=device) * 4
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    query = torch.randn(rows, heads, 1, head_dim, device=device, dtype=dtype)
    keys = torch.randn(rows, kv_heads, ring, head_dim, device=device, dtype=dtype)
    values = torch.randn_like(keys)
    mask = torch.rand(rows, 1, 1, ring, device=device) < 0.4
    mask[:, :, :, 0] = True
    layer = model.model.layers[0].self_attn
    repeats = 3 if args.tiny else 50
    pieces = {
        "sampled_choice_ms": piece_ms(lambda: choose(logits, REGENERATION, generator), device, repeats),
        "greedy_choice_ms": piece_ms(lambda: logits.argmax(-1), device, repeats),
        "attention_all_layers_ms": round(config.num_hidden_layers * piece_ms(
            lambda: grouped_attention.grouped_sdpa(layer, query, keys, values, mask, scaling=head_dim ** -0.5),
            device, repeats), 3),
        "kv_ring_gb": round(batch_decoder.kv_cache_bytes(config, rows * ring, dtype) / 1e9, 2),
    }
    print("   ".join(f"{k} {v}" for k, v in pieces.items()))
    prompts = _prompts(rows, vocab, ring, new, *lengths)
    few, many = (2, 6) if args.tiny else (4, 36)
    top = step_kernels(decoder, prompts, device, few, many, top=20)
    for k in top:
        print(f"{k['ms_per_step']:8.3f} ms  {k['share']:6.3f}  {k['name']}")
    write_json(args.out, {
        "command": "warmup_step_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "transformers": transformers.__version__, "shape": shape, "dtype": str(dtype).removeprefix("torch."),
        "ring_slots": ring, "new_tokens": new,
        "sampling": {"temperature": REGENERATION.temperature, "top_p": REGENERATION.top_p},
        "decode_step_by_rows": steps, "pieces_at_rows": {"rows": rows, **pieces},
        "eager_step_kernels": {"rows": rows, "steps": [few, many], "top": top},
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
