"""Speculative decoding speed: flashdraft's loop vs the z-lab reference `dflash.model.dflash_generate`.

Same random-weight target and draft, batch 1, greedy, prefill excluded, device synchronised. Four
runs per prompt: our speculative loop and our plain decoding (static caches + CUDA graphs), z-lab's
`dflash_generate` with the draft, and z-lab's loop with block size 1 (its plain decoding). The timed
runs are in bf16, where the two loops' different kernels may flip a near-tie between two random-weight
logits, so there the report gives the first position at which the outputs part. Equality is then
asserted in float32 on the same weights (one prompt): our speculative output == z-lab's == our plain
greedy output, token for token. Prints a table and writes JSON, also after each timed variant (`complete`
false until the end), so a run cut off by a time limit keeps what it measured.

Beside them, so that our plain baseline is never slower than the library's best: transformers' own
static cache and its forward under `torch.compile(mode="reduce-overhead")`, one token a step
(`HFCompiledDecoder`; `generate` itself passes a growing 2D mask, which recompiles every step). Then
both of our loops again with every decoder layer's forward compiled (`--compiled`, the base of evaluate's
GPU fast path; our CUDA graphs still replay the steps). Two experiments on that compiled step, each with its
layers compiled afresh (a batch-1 step is ~250 matrix-vector products whose bandwidth sets most of its
time): `--autotuned-gemms`, inductor choosing each matmul's kernel by timing its Triton templates against
cuBLAS, and `--fused-projections`, the target reading q, k, v and gate, up with one matmul each
(`flashdraft.target.fused_projections`, measured faster and since then evaluate's GPU default beside the
compiled layers; both flags: also the two together). `--flex-decode` adds the fused step with the
compiled steps' attention as one flex-attention call a layer (`flashdraft.target.flex_decode`: inductor's split-KV
decoding kernel, the runner's mask read inside it) in place of sdpa's mask preprocessing and cuDNN kernel,
measured faster and since then evaluate's GPU default on sdpa targets. `--gemv-decode` adds the fused step
under inductor's coordinate-descent tuning, with which it writes each one-row matmul of a plain step as a
Triton reduction (a matrix-vector kernel tuned for bandwidth, fused with the norm or activation around it) in
place of cuBLAS's kernel and its split-K reduction; with `--flex-decode` also both together. Each step is set
against its floor, the weight bytes it reads over the measured copy bandwidth
(`flashdraft.decoding.memory_floor`). `--profile` adds the top kernels of a plain step without CUDA
graphs (eager, and compiled with `--compiled`); `--dtype float32` times float32 as evaluate runs it
(IEEE Triton dots, eager attention on a GPU; `--attention sdpa` for the other; `--attention grouped`
for grouped-query attention that reads each key/value head once).

    # GPU (the issue's setting): Qwen3-8B-shaped target, 5-layer draft, bf16
    python benchmarks/spec_decode.py --out spec_decode.json
    # CPU smoke run (CI): tiny shapes, float32
    python benchmarks/spec_decode.py --tiny --out /tmp/spec_decode_tiny.json

Needs torch, transformers and `dflash==0.1.0` (pip install --no-deps dflash==0.1.0); flashdraft is
imported from this checkout's src/ when it is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flashdraft.decoding.decoding import generate  # noqa: E402
from flashdraft.decoding.evaluate import ieee_float32_dots  # noqa: E402
from flashdraft.decoding.harness import flex_decode_for, target_attention  # noqa: E402
from flashdraft.decoding.memory_floor import (  # noqa: E402
    copy_bandwidth,
    floor_ms,
    speculative_step_bytes,
    target_step_bytes,
)
from flashdraft.decoding.proposers import DraftProposer  # noqa: E402
from flashdraft.decoding.target_runner import TargetRunner  # noqa: E402
from flashdraft.files import write_json  # noqa: E402
from flashdraft.model import DFlashDraftConfig, DFlashDraftModel  # noqa: E402
from flashdraft.target import grouped_attention  # noqa: E402
from flashdraft.target.cache_kwarg import cache_kwarg  # noqa: E402
from flashdraft.target.compiled_layers import CompiledLayers  # noqa: E402
from flashdraft.target.frozen import decoder_layers  # noqa: E402
from flashdraft.target.fused_projections import FusedProjections  # noqa: E402
from flashdraft.target.step_graphs import StepGraphs  # noqa: E402

SHAPES = {
    # Qwen3-8B and the z-lab Qwen3-8B DFlash draft (dflash-reference.md section 2).
    "qwen3-8b": dict(
        target=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                    rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
        draft=dict(num_hidden_layers=5, intermediate_size=12288, mask_token_id=151669,
                   target_layer_ids=[1, 9, 17, 25, 33], block_size=16),
    ),
    # SmolLM2-135M-Instruct's sizes (a llama; here Qwen3 layers, which add q/k norms), with the 4-layer
    # draft the smollm2_135m recipe had when RESULTS.md's step breakdowns ran (it has 6 now, section 8
    # says why): a launch-bound target, where host work per step shows.
    "smollm2": dict(
        target=dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                    rope_theta=1e5, rms_norm_eps=1e-5, tie_word_embeddings=True),
        draft=dict(num_hidden_layers=4, intermediate_size=1536, mask_token_id=16,
                   target_layer_ids=[1, 7, 14, 20, 27], block_size=16),
    ),
    "tiny": dict(
        target=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                    rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
        draft=dict(num_hidden_layers=2, intermediate_size=128, mask_token_id=511,
                   target_layer_ids=[1, 2, 3], block_size=8),
    ),
}


def _entered(*contexts) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for context in contexts:
        stack.enter_context(context)
    return stack


def build(shape: str, dtype: torch.dtype, device: torch.device, seed: int, attention: str):
    spec = SHAPES[shape]
    torch.manual_seed(seed)
    target_config = Qwen3Config(**spec["target"])
    # Initialised on the device: random init of an 8B model on the CPU takes minutes.
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(target_config, dtype=dtype, attn_implementation=attention)
    target = target.eval().requires_grad_(False)
    t, d = spec["target"], spec["draft"]
    draft_config = DFlashDraftConfig(
        hidden_size=t["hidden_size"], vocab_size=t["vocab_size"], num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=t["num_attention_heads"], num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"], intermediate_size=d["intermediate_size"], rms_norm_eps=t["rms_norm_eps"],
        max_position_embeddings=t["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": t["rope_theta"]},
        num_target_layers=t["num_hidden_layers"],
        dflash_config={"mask_token_id": d["mask_token_id"], "target_layer_ids": d["target_layer_ids"],
                       "block_size": d["block_size"]},
    )
    with torch.device(device):
        draft = DFlashDraftModel(draft_config).to(dtype=dtype).eval().requires_grad_(False)
    return target, draft


def zlab_draft(draft: DFlashDraftModel):
    from dflash.model import DFlashDraftModel as ZLabDraft

    with torch.device(draft.device):
        ref = ZLabDraft(draft.config).to(dtype=draft.dtype).eval().requires_grad_(False)
    ref.load_state_dict(draft.state_dict(), strict=True)
    return ref


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def run_zlab(ref, target, ids, new: int, block: int) -> dict:
    """z-lab's loop, timed from outside (its own stats need CUDA): a hook on the target marks the end of
    the prefill forward and counts the verify forwards; the same clock rule as ours."""
    from dflash.model import dflash_generate

    device = ids.device
    state = {"forwards": 0, "prefill_end": 0.0}

    def mark(_module, _args, _output):
        state["forwards"] += 1
        if state["forwards"] == 1:
            state["prefill_end"] = _sync(device)

    handle = target.register_forward_hook(mark)
    try:
        out = dflash_generate(ref, target, ids, max_new_tokens=new, stop_token_ids=None, block_size=block)
        end = _sync(device)
    finally:
        handle.remove()
    tokens = out[0, ids.shape[1]:].tolist()
    return {"tokens": tokens, "decode_tokens": len(tokens) - 1, "decode_s": end - state["prefill_end"],
            "steps": state["forwards"] - 1}


def run_ours(runner, proposer, ids, new: int, graphs: StepGraphs) -> dict:
    if proposer is None:
        g = generate(runner, ids, max_new_tokens=new, graphs=graphs)
        steps = g.decode_tokens
    else:
        g = generate(runner, ids, proposer=proposer, max_new_tokens=new, graphs=graphs)
        steps = len(g.emitted)
    return {"tokens": g.tokens, "decode_tokens": g.decode_tokens, "decode_s": g.decode_s, "steps": steps}


class HFCompiledDecoder:
    """transformers' documented fastest plain decoding: a `StaticCache` and the model's forward under
    torch.compile(mode="reduce-overhead", fullgraph=True), fed one token and its `cache_position` a step
    (no 2D attention mask: a growing one would recompile every step). Greedy, batch 1."""

    def __init__(self, model, max_len: int):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.cache_kwargs = {cache_kwarg(model): self.cache}  # `past_key_values` or, newer, `cache`
        self.step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

    def __call__(self, ids: torch.Tensor, new: int) -> dict:
        device = ids.device
        self.cache.reset()
        logits = self.model(input_ids=ids, **self.cache_kwargs, use_cache=True,
                            cache_position=torch.arange(ids.shape[1], device=device)).logits[:, -1]
        token = logits.argmax(-1, keepdim=True)
        out = [token]
        began = _sync(device)
        for position in range(ids.shape[1], ids.shape[1] + new - 1):
            logits = self.step(input_ids=token, **self.cache_kwargs, use_cache=True,
                               cache_position=torch.tensor([position], device=device)).logits[:, -1]
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
        end = _sync(device)
        return {"tokens": torch.cat(out, 1)[0].tolist(), "decode_tokens": new - 1, "decode_s": end - began,
                "steps": new - 1}


def profile_plain_step(runner: TargetRunner, ids, new: int, rows: int = 25) -> str:
    """Our plain loop without CUDA graphs under torch.profiler: where a step's device time goes. The
    timed runs' runner: a cache of another size would compile every layer again."""
    from torch.profiler import ProfilerActivity, profile

    graphs = StepGraphs(enabled=False)
    run_ours(runner, None, ids, new, graphs)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_ours(runner, None, ids, new, graphs)
    return prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows)


def summarise(runs: list[dict]) -> dict:
    tokens = sum(r["decode_tokens"] for r in runs)
    seconds = sum(r["decode_s"] for r in runs)
    steps = sum(r["steps"] for r in runs)
    return {"decode_tokens": tokens, "decode_s": seconds, "tokens_per_s": tokens / seconds,
            "ms_per_step": 1000 * seconds / steps, "steps": steps, "tau": tokens / steps}


def time_methods(methods: dict, prompts: list[torch.Tensor], new: int, block: int) -> dict[str, list[dict]]:
    for fn in methods.values():  # warm-up: kernels, allocator, graph capture, compilation
        fn(prompts[0], min(new, 3 * block))
    return {name: [fn(ids, new) for ids in prompts] for name, fn in methods.items()}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position at which two outputs differ (None when equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def float32_check(target, draft, prompt: torch.Tensor, new: int, max_len: int, cuda_graphs: bool) -> dict:
    """On the same weights cast to float32: our speculative output == z-lab's == our plain greedy output."""
    target.float()
    draft.float()
    ref = zlab_draft(draft)
    graphs = {k: StepGraphs.for_device(prompt.device, cuda_graphs) for k in ("spec", "plain")}
    with torch.inference_mode():
        spec = run_ours(TargetRunner(target, draft.target_layer_ids, max_len),
                        DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings()),
                        prompt, new, graphs["spec"])
        plain = run_ours(TargetRunner(target, [], max_len), None, prompt, new, graphs["plain"])
        theirs = run_zlab(ref, target, prompt, new, draft.block_size)
    return {"new_tokens": new, "identical_to_zlab": spec["tokens"] == theirs["tokens"],
            "identical_to_plain": spec["tokens"] == plain["tokens"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, float32, CPU: a quick smoke run")
    parser.add_argument("--shape", choices=["qwen3-8b", "smollm2"], default="qwen3-8b", help="the model sizes")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=None, help="default 512 (tiny: 16)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 256 (tiny: 40)")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--compiled", action="store_true", help="also time both loops with compiled decoder layers")
    parser.add_argument("--fused-projections", action="store_true",
                        help="also time both loops with compiled layers whose target reads q, k and v (and gate "
                             "and up) with one matmul each (evaluate's GPU default)")
    parser.add_argument("--flex-decode", action="store_true",
                        help="also time both loops with fused projections and the target's attention as one "
                             "flex-attention call a layer (evaluate's GPU fast path on sdpa targets whose head grouping "
                             "inductor's decoding kernel serves; timed here on any, e.g. SmolLM2's 9 over 3)")
    parser.add_argument("--gemv-decode", action="store_true",
                        help="GPU: also time both loops with fused projections under inductor's coordinate-descent "
                             "tuning (one-row matmuls become tuned Triton reductions)")
    parser.add_argument("--autotuned-gemms", action="store_true",
                        help="GPU: also time both loops with compiled layers whose matmuls inductor autotunes "
                             "(its Triton templates against cuBLAS: max_autotune_gemm)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                        help="of the timed runs; default bfloat16 (tiny: float32). float32 uses IEEE Triton dots, "
                             "as evaluate does")
    parser.add_argument("--profile", action="store_true",
                        help="top kernels of a plain step without CUDA graphs, eager (and compiled with --compiled); CUDA")
    parser.add_argument("--attention", choices=["sdpa", "eager", "grouped"], default=None,
                        help="the target's attention; default as evaluate picks it (eager for float32 on a GPU); "
                             "grouped: flashdraft.target.grouped_attention (no repeated key/value heads)")
    parser.add_argument("--no-zlab", action="store_true", help="skip the z-lab loops and the float32 check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON results file")
    args = parser.parse_args(argv)

    if args.flex_decode and args.attention not in (None, "sdpa"):
        parser.error("--flex-decode stands in for sdpa attention; leave --attention unset or sdpa")
    for flag, on in (("--autotuned-gemms", args.autotuned_gemms), ("--gemv-decode", args.gemv_decode)):
        if on and (args.tiny or not torch.cuda.is_available()):
            parser.error(f"{flag} times GPU kernels; run it on a GPU without --tiny")
    shape = "tiny" if args.tiny else args.shape
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = getattr(torch, args.dtype or ("float32" if args.tiny else "bfloat16"))
    if dtype == torch.float32:
        ieee_float32_dots()
    prompt_len = args.prompt_len or (16 if args.tiny else 512)
    new = args.max_new_tokens or (40 if args.tiny else 256)
    attention = args.attention or target_attention(dtype, device)
    if attention == "grouped":
        attention = grouped_attention.register()
    target, draft = build(shape, dtype, device, args.seed, attention)
    ref = None if args.no_zlab else zlab_draft(draft)
    block = draft.block_size
    gen = torch.Generator().manual_seed(args.seed)
    vocab = target.config.vocab_size
    prompts = [torch.randint(0, vocab - 1024 if vocab > 4096 else vocab - 2, (1, prompt_len), generator=gen).to(device)
               for _ in range(args.prompts)]

    max_len = prompt_len + new + block + 1
    spec_runner = TargetRunner(target, draft.target_layer_ids, max_len)
    plain_runner = TargetRunner(target, [], max_len)
    proposer = DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings())
    graphs = {"spec": StepGraphs.for_device(device, not args.no_cuda_graphs),
              "plain": StepGraphs.for_device(device, not args.no_cuda_graphs)}
    methods = {
        "flashdraft speculative": lambda ids, n: run_ours(spec_runner, proposer, ids, n, graphs["spec"]),
        "flashdraft plain": lambda ids, n: run_ours(plain_runner, None, ids, n, graphs["plain"]),
    }
    if not args.no_zlab:
        methods["z-lab dflash_generate"] = lambda ids, n: run_zlab(ref, target, ids, n, block)
        methods["z-lab plain (block 1)"] = lambda ids, n: run_zlab(ref, target, ids, n, 1)
    if device.type == "cuda":
        methods["transformers static + compile"] = HFCompiledDecoder(target, max_len)
    bandwidth = copy_bandwidth(device)
    floors = {"plain": floor_ms(target_step_bytes(target), bandwidth),
              "speculative": floor_ms(speculative_step_bytes(target, draft), bandwidth)}
    enabled = {}  # CUDA graphs in use, by loop; kept apart from the graphs, which are freed before the float32 check

    def write_report(exact: dict | None) -> dict:
        """The report of what has run so far, written to --out: after each variant, so that a call cut off
        by a time limit keeps its measurements (`complete` false), and at the end with the float32 check."""
        results = {name: summarise(r) for name, r in runs.items()}
        for name, r in results.items():
            drafted = "speculative" in name or "dflash_generate" in name
            r["floor_ms_per_step"] = floors["speculative" if drafted else "plain"]
            r["vs_floor"] = r["ms_per_step"] / r["floor_ms_per_step"]
        ours, theirs = runs["flashdraft speculative"], runs.get("z-lab dflash_generate")
        parted = [first_difference(a["tokens"], b["tokens"]) for a, b in zip(ours, theirs)] if theirs else None
        # Compiled kernels round differently: in bf16 a near-tie may flip, so report where outputs part.
        variants_parted = {
            f"{kind}, {label}": [first_difference(a["tokens"], b["tokens"])
                                 for a, b in zip(runs[f"flashdraft {kind}"], runs[f"flashdraft {kind}, {label}"])]
            for label in settings for kind in ("speculative", "plain")
            if f"flashdraft {kind}, {label}" in runs}
        report = {
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "complete": exact is not None,
            "shape": shape, "dtype": str(dtype).removeprefix("torch."), "attention": attention, "block_size": block,
            "prompts": args.prompts, "prompt_len": prompt_len, "max_new_tokens": new,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
            "cuda_graphs": dict(enabled),
            "results": results,
            "ours_over_zlab_speculative": (results["flashdraft speculative"]["tokens_per_s"]
                                           / results["z-lab dflash_generate"]["tokens_per_s"] if theirs else None),
            "speedup_ours": (results["flashdraft speculative"]["tokens_per_s"]
                             / results["flashdraft plain"]["tokens_per_s"]),
            "speedup_zlab": (results["z-lab dflash_generate"]["tokens_per_s"]
                             / results["z-lab plain (block 1)"]["tokens_per_s"] if theirs else None),
            "first_difference_from_zlab": parted,
            "variants_first_difference_from_eager": variants_parted,
            "copy_bandwidth_gb_s": bandwidth / 1e9,
            "floor_ms_per_step": floors,
            "profile_plain_step": profile,
            "float32": exact,
        }
        write_json(args.out, report)
        return report

    settings: dict = {}
    profile: dict = {}
    with torch.inference_mode():
        started = time.perf_counter()
        runs = time_methods(methods, prompts, new, block)
        print(f"unchanged paths: {time.perf_counter() - started:.0f} s", flush=True)
        enabled.update({k: g.enabled for k, g in graphs.items()})
        write_report(None)
        profiling = args.profile and device.type == "cuda"
        if profiling:
            profile["eager"] = profile_plain_step(plain_runner, prompts[0], 32)
        # Compiled layers (the base of evaluate's GPU fast path), then the experiments on
        # that step, each with its layers compiled afresh (after a reset, the graphs of the one before would
        # be reused as they are).
        settings.update({"compiled": (args.compiled, contextlib.nullcontext),
                        "autotuned": (args.autotuned_gemms,
                                      lambda: torch._inductor.config.patch(max_autotune_gemm=True)),
                        "fused": (args.fused_projections, lambda: FusedProjections(target)),
                        "fused, gemv": (args.gemv_decode, lambda: _entered(
                            torch._inductor.config.patch(coordinate_descent_tuning=True), FusedProjections(target))),
                        "fused, flex decode": (args.flex_decode, lambda: _entered(
                            FusedProjections(target), flex_decode_for(max_len, proposer, device))),
                        "fused, gemv, flex decode": (args.gemv_decode and args.flex_decode, lambda: _entered(
                            torch._inductor.config.patch(coordinate_descent_tuning=True), FusedProjections(target),
                            flex_decode_for(max_len, proposer, device))),
                        # Both experiments together, when both are asked for: each may gain on its own matmuls.
                        "fused, autotuned": (args.fused_projections and args.autotuned_gemms,
                                             lambda: _entered(torch._inductor.config.patch(max_autotune_gemm=True),
                                                              FusedProjections(target)))})
        for label, (on, setting) in settings.items():
            if not on:
                continue
            torch._dynamo.reset()
            started = time.perf_counter()
            steps = {"spec": StepGraphs.for_device(device, not args.no_cuda_graphs),
                     "plain": StepGraphs.for_device(device, not args.no_cuda_graphs)}
            with setting(), CompiledLayers([*decoder_layers(target), *draft.layers], lengths={1, block}):
                runs.update(time_methods({
                    f"flashdraft speculative, {label}": lambda ids, n, g=steps["spec"]: run_ours(
                        spec_runner, proposer, ids, n, g),
                    f"flashdraft plain, {label}": lambda ids, n, g=steps["plain"]: run_ours(
                        plain_runner, None, ids, n, g),
                }, prompts, new, block))
                for kind in ("plain", "speculative"):  # progress: a long call keeps what it measured
                    ms = summarise(runs[f"flashdraft {kind}, {label}"])["ms_per_step"]
                    print(f"{label} {kind}: {ms:.2f} ms a step", flush=True)
                print(f"{label}: {time.perf_counter() - started:.0f} s with compilation", flush=True)
                if profiling and label == "compiled":
                    profile["compiled"] = profile_plain_step(plain_runner, prompts[0], 32)
            graphs.update({f"{k}, {label}": g for k, g in steps.items()})
            enabled.update({f"{k}, {label}": g.enabled for k, g in steps.items()})
            write_report(None)

    ours, theirs = runs["flashdraft speculative"], runs.get("z-lab dflash_generate")
    if args.no_zlab:
        exact = {}
    elif dtype == torch.float32:
        exact = {"identical_to_zlab": all(a["tokens"] == b["tokens"] for a, b in zip(ours, theirs)),
                 "identical_to_plain": all(a["tokens"] == b["tokens"] for a, b in zip(ours, runs["flashdraft plain"]))}
    else:
        del spec_runner, plain_runner, proposer, graphs, methods
        exact = float32_check(target, draft, prompts[0], min(new, 128), max_len, not args.no_cuda_graphs)
    report = write_report(exact)
    results, parted = report["results"], report["first_difference_from_zlab"]
    ratio, variants_parted = report["ours_over_zlab_speculative"], report["variants_first_difference_from_eager"]

    print(f"{shape} {report['dtype']} on {report['device']}, block {block}, {args.prompts} prompts x "
          f"{prompt_len} tokens, {new} new tokens")
    print(f"{'method':<36}{'tok/s':>10}{'ms/step':>10}{'tau':>7}{'floor ms':>10}{'x floor':>9}")
    for name, r in results.items():
        print(f"{name:<36}{r['tokens_per_s']:>10.1f}{r['ms_per_step']:>10.2f}{r['tau']:>7.2f}"
              f"{r['floor_ms_per_step']:>10.2f}{r['vs_floor']:>9.2f}")
    if variants_parted:
        print(f"compiled variants' outputs part from the eager ones at {variants_parted} (None: identical)")
    print(f"floors: weight bytes read a step / {bandwidth / 1e9:.0f} GB/s measured copy bandwidth")
    for kind, table in profile.items():
        print(f"\nplain step, {kind}, no CUDA graphs, under torch.profiler (32 tokens):\n{table}")
    if theirs:
        print(f"ours / z-lab (speculative): {ratio:.2f}x; {report['dtype']} outputs part from z-lab's at "
              f"{parted} (None: identical); float32: {exact}")
    assert all(exact.values()), f"float32 outputs differ: {exact}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
