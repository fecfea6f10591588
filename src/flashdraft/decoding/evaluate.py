"""Evaluation of a DFlash draft: tau, speedup and losslessness on benchmarks, plus baselines.

On every prompt, in one harness (same caches, same CUDA graphs, prefill excluded, device synced):
plain autoregressive decoding of the target and speculative decoding with the draft; then, as an
outside baseline, transformers' prompt-lookup decoding. At temperature 0 the speculative output must
equal the plain greedy output (the `lossless` fraction; 1.0 in float32).

Each loop's time a step is set beside its floor, the weight bytes the step reads over the device's
measured bandwidth (`memory_floor`): a plain baseline far above its floor inflates every speedup.

The report (JSON) holds every number, the settings as measured, the resolved `target` and `evaluate`
config sections, and the names of its PNG plots, which are written next to it. Finished benchmarks are
saved as they finish, and an interrupted evaluation, run again, resumes (`partial_report`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from tqdm import tqdm

from flashdraft.config import EvaluateConfig, TargetConfig, to_dict
from flashdraft.data.sampling import Sampling
from flashdraft.decoding import metrics, vllm_measure
from flashdraft.decoding.benchmarks import Benchmark, load_benchmark
from flashdraft.decoding.decoding import Generation, generate
from flashdraft.decoding.harness import DecodingHarness, check_pair
from flashdraft.decoding.memory_floor import copy_bandwidth, floor_ms, speculative_step_bytes, target_step_bytes
from flashdraft.decoding.partial_report import PartialReport, fingerprint
from flashdraft.decoding.plots import plot
from flashdraft.decoding.prompt_lookup import prompt_lookup
from flashdraft.errors import UserError
from flashdraft.files import check_output_file, write_json
from flashdraft.target.fast_path import fast_path_status
from flashdraft.target.source import load_tokenizer

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device} asked for, but CUDA is not available here; use --device cpu")
    return resolved


def ieee_float32_dots() -> None:
    """Make Triton's float32 dots IEEE for this process (an explicit setting wins).

    Lossless here means bit-exact greedy output. Triton's default float32 dot is TF32 (10-bit mantissa),
    so in the Mamba-2 kernels a 16-token verify and a 1-token decode could differ at TF32's ~1e-3
    precision and flip near-ties; IEEE float32 dots keep them within rounding.
    """
    os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise UserError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


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
                  params: Sampling, lookup: dict | None, floors: dict[str, float]) -> dict:
    spec_speed, plain_speed = metrics.throughput(spec), metrics.throughput(plain)
    spec_speed |= metrics.step_time(spec_speed["decode_seconds"], sum(len(g.emitted) for g in spec),
                                    floors["speculative"])
    plain_speed |= metrics.step_time(plain_speed["decode_seconds"], plain_speed["decode_tokens"], floors["plain"])
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


def evaluate(target: TargetConfig, evaluation: EvaluateConfig) -> dict:
    """Run the evaluation, write the report JSON (+ PNG plots next to it) and return the report."""
    draft, output = evaluation.draft, check_output_file(evaluation.output, "evaluate.output (--output)")
    max_new_tokens, seed = evaluation.max_new_tokens, evaluation.seed
    params = Sampling(evaluation.temperature, evaluation.top_p, evaluation.top_k)
    trust_remote_code = target.trust_remote_code
    # Everything that can be wrong with the inputs is checked before any weights are loaded.
    source, draft_config, target_config = check_pair(target, Path(draft), "evaluate.draft")
    if evaluation.vllm:
        vllm_measure.require_vllm()
        if source.gguf_file:
            raise UserError("--vllm needs the target as an HF folder or hub id, not a .gguf; `flashdraft warmup` "
                            "materialises a GGUF into a folder (its manifest.json names it as target_path)")
    block = evaluation.block_size or draft_config.block_size
    if not 2 <= block <= draft_config.block_size:
        raise UserError(f"evaluate.block_size {block} is outside 2..{draft_config.block_size}: the draft was trained "
                        f"for blocks of {draft_config.block_size} (leave it unset to use that)")
    suite = [load_benchmark(spec, evaluation.num_prompts) for spec in evaluation.benchmarks]
    names = [b.name for b in suite]
    if len(set(names)) != len(names):
        raise UserError(f"benchmark names repeat: {names}; give each benchmark once")
    torch_device = resolve_device(evaluation.device)
    torch_dtype = resolve_dtype(evaluation.dtype, torch_device)
    if torch_dtype == torch.float32:
        ieee_float32_dots()
    torch.manual_seed(seed)

    tokenizer = load_tokenizer(source, trust_remote_code=trust_remote_code)
    encoded = {
        b.name: [torch.tensor([encode(tokenizer, m, evaluation.thinking)], device=torch_device) for m in b.prompts]
        for b in suite
    }
    device_name = torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else "cpu"
    # The resolved device and dtype too: `auto` on another machine is another evaluation (and other timings).
    settings_key = {"target": to_dict(target), "evaluate": to_dict(evaluation) | {"output": None},
                    "device": device_name, "dtype": str(torch_dtype)}
    done = PartialReport(output, fingerprint(settings_key, Path(draft), encoded))
    longest = max(ids.shape[1] for prompts in encoded.values() for ids in prompts)
    max_len = longest + max_new_tokens + block + 1
    # Prompt lookup (transformers' generate, a growing cache) runs outside the harness's fast path, on the
    # eager layers.
    harness = DecodingHarness.load(source, Path(draft), dtype=torch_dtype, device=torch_device,
                                   trust_remote_code=trust_remote_code, max_len=max_len, block=block,
                                   compile=evaluation.compile, cuda_graphs=evaluation.cuda_graphs)
    model, spec_runner, plain_runner, proposer = (harness.model, harness.spec_runner, harness.plain_runner,
                                                  harness.proposer)
    spec_graphs, plain_graphs = harness.spec_graphs, harness.plain_graphs
    stops = stop_token_ids(tokenizer, model)
    gen_spec = torch.Generator(torch_device).manual_seed(seed)
    gen_plain = torch.Generator(torch_device).manual_seed(seed)
    common = {"params": params, "stop_ids": stops}

    # Warm-up (graph capture, allocator, kernels) outside the timed runs: a few steps of each loop.
    first = next(iter(encoded.values()))[0]
    warm = min(max_new_tokens, 3 * block)
    with harness.fast():
        generate(plain_runner, first, max_new_tokens=warm, graphs=plain_graphs, generator=gen_plain, params=params)
        generate(spec_runner, first, proposer=proposer, max_new_tokens=warm, graphs=spec_graphs,
                 generator=gen_spec, params=params)

    # How fast a step could be on this device: the weight bytes it reads over the measured bandwidth.
    bandwidth = copy_bandwidth(torch_device)
    floors = {"plain": floor_ms(target_step_bytes(model), bandwidth),
              "speculative": floor_ms(speculative_step_bytes(model, harness.draft), bandwidth)}
    results = {}
    for bench in suite:
        if bench.name in done.results:
            results[bench.name] = done.results[bench.name]
            continue
        # Each benchmark draws from the seed afresh: a resumed evaluation samples as an uninterrupted one.
        gen_spec.manual_seed(seed)
        gen_plain.manual_seed(seed)
        spec, plain = [], []
        with harness.fast():
            for ids in tqdm(encoded[bench.name], desc=f"evaluate {bench.name}", unit="prompt"):
                plain.append(generate(plain_runner, ids, max_new_tokens=max_new_tokens,
                                      graphs=plain_graphs, generator=gen_plain, **common))
                spec.append(generate(spec_runner, ids, proposer=proposer, max_new_tokens=max_new_tokens,
                                     graphs=spec_graphs, generator=gen_spec, **common))
        lookup = None
        if evaluation.prompt_lookup:
            lookup = prompt_lookup(model, encoded[bench.name], max_new_tokens=max_new_tokens, params=params,
                                   stop_ids=stops, pad_id=tokenizer.pad_token_id or next(iter(stops), 0))
        results[bench.name] = _bench_report(bench, spec, plain, block, params, lookup, floors)
        log.info("%s: tau %.2f (pooled), speedup %s, lossless %s", bench.name,
                 results[bench.name]["speculative"]["tau_pooled"] or 0, results[bench.name]["speedup"],
                 results[bench.name]["lossless"])
        done.save(bench.name, results[bench.name])

    settings = {
        "draft": str(draft),
        "target": target.name_or_path,
        "benchmarks": list(evaluation.benchmarks),
        "num_prompts": evaluation.num_prompts,
        "max_new_tokens": max_new_tokens,
        "temperature": evaluation.temperature,
        "top_p": evaluation.top_p,
        "top_k": evaluation.top_k,
        "block_size": block,
        "draft_block_size": draft_config.block_size,
        "device": str(torch_device),
        "device_name": device_name,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "seed": seed,
        "thinking": evaluation.thinking,
        "cuda_graphs": {"asked": evaluation.cuda_graphs, "speculative": spec_graphs.enabled,
                        "plain": plain_graphs.enabled},
        "compiled": harness.compiled,
        "fused_projection_groups": harness.fused_projection_groups,
        "flex_decode_attention": harness.flex_decode_attention,
        "target_attention": harness.attention,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "floor_ms_per_step": floors,
        "hybrid_target": harness.hybrid,
        # The Mamba-2 kernels decode and roll back too when they import; else the reference path.
        "target_fast_path": fast_path_status(target_config)["fast_path"],
        "stop_token_ids": sorted(stops),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "vllm": evaluation.vllm,
    }
    if evaluation.vllm:
        # vLLM takes the whole GPU: our loop's models go first.
        del spec_runner, plain_runner, proposer, spec_graphs, plain_graphs, model, harness
        if torch_device.type == "cuda":
            torch.cuda.empty_cache()
        measured = vllm_measure.measure(
            source, draft, {name: [ids[0].tolist() for ids in prompts] for name, prompts in encoded.items()},
            max_new_tokens=max_new_tokens, params=params, block_size=block, stop_ids=stops, seed=seed,
            trust_remote_code=trust_remote_code)
        for name, numbers in measured.items():
            results[name]["vllm"] = numbers

    report = {"settings": settings, "benchmarks": results,
              "config": {"target": to_dict(target), "evaluate": to_dict(evaluation)}}
    # Plots first: the report, written last, means the evaluation finished.
    report["plots"] = [path.name for path in plot(report, output.parent, output.stem)]
    write_json(output, report)
    done.finish()
    return report
