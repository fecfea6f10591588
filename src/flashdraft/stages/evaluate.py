"""`flashdraft evaluate`: tau, speedup and losslessness of a DFlash draft on benchmarks, plus baselines.

On every prompt, in one harness (same caches, same CUDA graphs, prefill excluded, device synced):
plain autoregressive decoding of the target and speculative decoding with the draft; then, as an
outside baseline, transformers' prompt-lookup decoding. At temperature 0 the speculative output must
equal the plain greedy output (the `lossless` fraction; 1.0 in float32).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from flashdraft.errors import UserError
from flashdraft.model import DFlashDraftConfig, DFlashDraftModel
from flashdraft.decoding import metrics, vllm_measure
from flashdraft.decoding.benchmarks import NAMED, Benchmark, load_benchmark
from flashdraft.decoding.decoding import Generation, autoregressive_generate, speculative_generate
from flashdraft.decoding.graphs import StepGraphs
from flashdraft.decoding.prompt_lookup import prompt_lookup
from flashdraft.decoding.proposers import DraftProposer
from flashdraft.decoding.report import plot, write_json
from flashdraft.decoding.sampling import SamplingParams
from flashdraft.decoding.target_runner import TargetRunner, check_target
from flashdraft.target.fast_path import fast_path_status
from flashdraft.target.frozen import FrozenTarget
from flashdraft.target.source import check_draft_fits, load_target_config as load_config, load_tokenizer, resolve_source
from flashdraft.tracking.runs import step_run

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device} asked for, but CUDA is not available here; use --device cpu")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise UserError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def load_draft_config(path: str | Path) -> DFlashDraftConfig:
    try:
        config = DFlashDraftConfig.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read the draft at {path}: {err}; give a folder from draft-init or train") from err
    if config.mask_token_id is None:
        raise UserError(f"{path} is not a DFlash draft (no dflash_config.mask_token_id in config.json)")
    return config


def encode(tokenizer, messages: list[dict], thinking: bool) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the target's tokenizer has no chat template; evaluation applies the target's own template")
    # enable_thinking is read by thinking-capable templates (Qwen3, Nemotron) and ignored by others.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stop_token_ids(tokenizer, model) -> set[int]:
    ids = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


def _bench_report(bench: Benchmark, spec: list[Generation], plain: list[Generation], block: int,
                  params: SamplingParams, lookup: dict | None) -> dict:
    spec_speed, plain_speed = metrics.throughput(spec), metrics.throughput(plain)
    result = {
        "source": bench.source,
        "num_prompts": len(spec),
        "speculative": metrics.acceptance(spec, block) | spec_speed,
        "autoregressive": plain_speed,
        "speedup": (spec_speed["tokens_per_second"] / plain_speed["tokens_per_second"])
        if spec_speed["tokens_per_second"] and plain_speed["tokens_per_second"] else None,
        "lossless": metrics.lossless_fraction(spec, plain) if params.greedy else None,
        "per_prompt": [
            {"new_tokens": len(s.tokens), "verify_steps": len(s.emitted),
             "tau": sum(s.emitted) / len(s.emitted) if s.emitted else None,
             "same_as_plain": s.tokens == p.tokens if params.greedy else None}
            for s, p in zip(spec, plain)
        ],
    }
    if lookup is not None:
        result["prompt_lookup"] = lookup
        if lookup.get("tokens_per_second") and plain_speed["tokens_per_second"]:
            lookup["speedup"] = lookup["tokens_per_second"] / plain_speed["tokens_per_second"]
    return result


def evaluate(
    *,
    draft: str | Path,
    target: str,
    benches: Sequence[str],
    output: str | Path,
    num_prompts: int | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    block_size: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    seed: int = 0,
    thinking: bool = False,
    cuda_graphs: bool = True,
    baseline_prompt_lookup: bool = True,
    vllm: bool = False,
    tracking_uri: str | None = None,
) -> dict:
    """Run the evaluation, write the report JSON (+ PNG plots next to it) and return the report."""
    if max_new_tokens <= 0:
        raise UserError(f"max-new-tokens must be > 0, got {max_new_tokens}")
    if not benches:
        raise UserError(f"give at least one benchmark: {', '.join(NAMED)} or a .jsonl file")
    params = SamplingParams(temperature, top_p, top_k)
    output = Path(output)
    # Everything that can be wrong with the inputs is checked before any weights are loaded.
    draft_config = load_draft_config(draft)
    source = resolve_source(target)
    target_config = load_config(source)
    check_draft_fits(draft_config, target_config)
    check_target(target_config)
    if vllm:
        vllm_measure.require_vllm()
        if source.gguf_file:
            raise UserError("--vllm needs the target as an HF folder or hub id, not a .gguf; `flashdraft warmup` "
                            "materialises a GGUF into a folder (its manifest.json names it as target_path)")
    block = block_size or draft_config.block_size
    if block < 2:
        raise UserError(f"block size must be >= 2 (anchor + at least one draft), got {block}")
    suite = [load_benchmark(spec, num_prompts) for spec in benches]
    names = [b.name for b in suite]
    if len(set(names)) != len(names):
        raise UserError(f"benchmark names repeat: {names}; give each benchmark once")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if torch_dtype == torch.float32:
        # Lossless here means bit-exact greedy output. Triton's default float32 dot is TF32 (10-bit
        # mantissa), so in the Mamba-2 kernels a 16-token verify and a 1-token decode could differ at
        # TF32's ~1e-3 precision and flip near-ties; IEEE float32 dots keep them within rounding.
        os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
    torch.manual_seed(seed)

    frozen = FrozenTarget.load(source, dtype=torch_dtype, device=torch_device)
    tokenizer = load_tokenizer(source)
    draft_model = DFlashDraftModel.from_pretrained(str(draft), dtype=torch_dtype).to(torch_device).eval()
    model = frozen.model
    stops = stop_token_ids(tokenizer, model)
    encoded = {
        b.name: [torch.tensor([encode(tokenizer, m, thinking)], device=torch_device) for m in b.prompts] for b in suite
    }
    longest = max(ids.shape[1] for prompts in encoded.values() for ids in prompts)
    max_len = longest + max_new_tokens + block + 1
    spec_runner = TargetRunner(model, draft_model.target_layer_ids, max_len)
    plain_runner = TargetRunner(model, [], max_len)
    proposer = DraftProposer(draft_model, frozen.embedding, frozen.lm_head, block)
    spec_graphs = StepGraphs.for_device(torch_device, cuda_graphs)
    plain_graphs = StepGraphs.for_device(torch_device, cuda_graphs)
    gen_spec = torch.Generator(torch_device).manual_seed(seed)
    gen_plain = torch.Generator(torch_device).manual_seed(seed)
    common = {"params": params, "stop_ids": stops}

    # Warm-up (graph capture, allocator, kernels) outside the timed runs: a few steps of each loop.
    first = next(iter(encoded.values()))[0]
    warm = min(max_new_tokens, 3 * block)
    autoregressive_generate(plain_runner, first, max_new_tokens=warm, graphs=plain_graphs, generator=gen_plain,
                            params=params)
    speculative_generate(spec_runner, proposer, first, max_new_tokens=warm, graphs=spec_graphs,
                         generator=gen_spec, params=params)

    results = {}
    for bench in suite:
        spec, plain = [], []
        for ids in tqdm(encoded[bench.name], desc=f"evaluate {bench.name}", unit="prompt"):
            plain.append(autoregressive_generate(plain_runner, ids, max_new_tokens=max_new_tokens,
                                                 graphs=plain_graphs, generator=gen_plain, **common))
            spec.append(speculative_generate(spec_runner, proposer, ids, max_new_tokens=max_new_tokens,
                                             graphs=spec_graphs, generator=gen_spec, **common))
        lookup = None
        if baseline_prompt_lookup:
            lookup = prompt_lookup(model, encoded[bench.name], max_new_tokens=max_new_tokens, params=params,
                                   stop_ids=stops, pad_id=tokenizer.pad_token_id or next(iter(stops), 0))
        results[bench.name] = _bench_report(bench, spec, plain, block, params, lookup)
        log.info("%s: tau %.2f (pooled), speedup %s, lossless %s", bench.name,
                 results[bench.name]["speculative"]["tau_pooled"] or 0, results[bench.name]["speedup"],
                 results[bench.name]["lossless"])

    settings = {
        "draft": str(draft),
        "target": target,
        "benchmarks": list(benches),
        "num_prompts": num_prompts,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "block_size": block,
        "draft_block_size": draft_config.block_size,
        "device": str(torch_device),
        "device_name": torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else "cpu",
        "dtype": str(torch_dtype).removeprefix("torch."),
        "seed": seed,
        "thinking": thinking,
        "cuda_graphs": {"asked": cuda_graphs, "speculative": spec_graphs.enabled, "plain": plain_graphs.enabled},
        "hybrid_target": spec_runner.recurrent is not None,
        # The Mamba-2 kernels decode and roll back too when they import; else the reference path.
        "target_fast_path": fast_path_status(target_config)["fast_path"],
        "stop_token_ids": sorted(stops),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "vllm": vllm,
    }
    if vllm:
        # vLLM takes the whole GPU: our loop's models go first.
        del spec_runner, plain_runner, proposer, spec_graphs, plain_graphs, draft_model, model, frozen
        if torch_device.type == "cuda":
            torch.cuda.empty_cache()
        measured = vllm_measure.measure(
            source.path, draft, {name: [ids[0].tolist() for ids in prompts] for name, prompts in encoded.items()},
            max_new_tokens=max_new_tokens, params=params, block_size=block, stop_ids=stops, seed=seed)
        for name, numbers in measured.items():
            results[name]["vllm"] = numbers

    report = {"settings": settings, "benchmarks": results}
    write_json(report, output)
    plots = plot(report, output.parent, output.stem)
    with step_run("evaluate", tracking_uri=tracking_uri) as run:
        run.log_params(report["settings"])
        flat = {}
        for name, r in results.items():
            flat[f"{name}.tau_pooled"] = r["speculative"]["tau_pooled"]
            flat[f"{name}.tau_mean_of_requests"] = r["speculative"]["tau_mean_of_requests"]
            flat[f"{name}.spec_tokens_per_s"] = r["speculative"]["tokens_per_second"]
            flat[f"{name}.plain_tokens_per_s"] = r["autoregressive"]["tokens_per_second"]
            flat[f"{name}.speedup"] = r["speedup"]
            if "vllm" in r:
                flat[f"{name}.vllm_tau_pooled"] = r["vllm"]["speculative"]["tau_pooled"]
                flat[f"{name}.vllm_speedup"] = r["vllm"]["speedup"]
            flat[f"{name}.lossless"] = r["lossless"]
        run.log_metrics({k: v for k, v in flat.items() if v is not None})
        run.log_artifact(output)
        for path in plots:
            run.log_artifact(path)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", required=True, help="draft checkpoint folder (draft-init / train export)")
    parser.add_argument("--target", required=True, help="target: hub id, HF folder, .gguf file or packaged:smollm2")
    parser.add_argument("--bench", nargs="+", required=True, metavar="BENCH",
                        help=f"benchmarks: {', '.join(NAMED)}, a .jsonl/.json prompt file, or a hub id org/name")
    parser.add_argument("--output", required=True, help="report JSON path; PNG plots are written next to it")
    parser.add_argument("--num-prompts", type=int, default=None, help="first N prompts of each benchmark")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless check)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--block-size", type=int, default=None, help="default: the draft's block size")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--thinking", choices=["on", "off"], default="off",
                        help="chat-template thinking mode; match the one the draft was trained with")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="run the decoding steps eagerly on GPU")
    parser.add_argument("--no-prompt-lookup", action="store_true", help="skip the prompt-lookup baseline")
    parser.add_argument("--vllm", action="store_true",
                        help="also measure with vLLM's DFlash speculative decoding (needs vllm and a GPU)")
    parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI)")


def main(args: argparse.Namespace) -> int:
    report = evaluate(
        draft=args.draft, target=args.target, benches=args.bench, output=args.output,
        num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, block_size=args.block_size, device=args.device, dtype=args.dtype,
        seed=args.seed, thinking=args.thinking == "on", cuda_graphs=not args.no_cuda_graphs,
        baseline_prompt_lookup=not args.no_prompt_lookup, vllm=args.vllm, tracking_uri=args.tracking_uri,
    )
    def num(value, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:.2f}{unit}"

    for name, r in report["benchmarks"].items():
        spec = r["speculative"]
        print(f"{name}: tau {num(spec['tau_pooled'])} pooled / {num(spec['tau_mean_of_requests'])} per request, "
              f"{num(spec['tokens_per_second'])} tok/s vs {num(r['autoregressive']['tokens_per_second'])} plain "
              f"(speedup {num(r['speedup'], 'x')}), lossless {r['lossless']}")
        if "vllm" in r:
            v = r["vllm"]
            print(f"{name} in vLLM: tau {num(v['speculative']['tau_pooled'])} pooled, "
                  f"{num(v['speculative']['tokens_per_second'])} tok/s vs {num(v['autoregressive']['tokens_per_second'])} "
                  f"plain (speedup {num(v['speedup'], 'x')})")
    print(f"report written to {args.output}")
    return 0
