"""`flashdraft evaluate`: tau, speedup and losslessness of a DFlash draft on benchmarks, plus baselines.

The measurement is `flashdraft.decoding.evaluate`; this stage logs its settings and headline numbers to
the step's MLflow run, with the report and its plots as artifacts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flashdraft.config import Config
from flashdraft.decoding.benchmarks import NAMED
from flashdraft.decoding.evaluate import evaluate
from flashdraft.stages.args import Flag, add_config_arguments, config_from_args, on_off, require
from flashdraft.tracking.runs import step_run

FLAGS = [
    Flag("--draft", "evaluate.draft", "draft checkpoint folder (draft-init / train export)"),
    Flag("--target", "target.name_or_path", "target: hub id, HF folder, .gguf file or packaged:smollm2"),
    Flag("--bench", "evaluate.benchmarks",
         f"benchmarks: {', '.join(NAMED)}, a .jsonl/.json prompt file, or a hub id org/name",
         {"nargs": "+", "metavar": "BENCH"}),
    Flag("--output", "evaluate.output", "report JSON path; PNG plots are written next to it"),
    Flag("--num-prompts", "evaluate.num_prompts", "first N prompts of each benchmark", {"type": int}),
    Flag("--max-new-tokens", "evaluate.max_new_tokens", "per prompt", {"type": int}),
    Flag("--temperature", "evaluate.temperature", "0 = greedy (lossless check)", {"type": float}),
    Flag("--top-p", "evaluate.top_p", "1 = off", {"type": float}),
    Flag("--top-k", "evaluate.top_k", "0 = off", {"type": int}),
    Flag("--block-size", "evaluate.block_size", "default: the draft's block size", {"type": int}),
    Flag("--device", "evaluate.device", "auto | cpu | cuda | cuda:N"),
    Flag("--dtype", "evaluate.dtype", "auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16"),
    Flag("--seed", "evaluate.seed", "sampling seed", {"type": int}),
    Flag("--thinking", "evaluate.thinking", "chat-template thinking mode; match the one the draft was trained with",
         {"type": on_off, "metavar": "on|off"}),
    Flag("--no-cuda-graphs", "evaluate.cuda_graphs", "run the decoding steps eagerly on GPU",
         {"action": "store_const", "const": False}),
    Flag("--no-prompt-lookup", "evaluate.prompt_lookup", "skip the prompt-lookup baseline",
         {"action": "store_const", "const": False}),
    Flag("--vllm", "evaluate.vllm", "also measure with vLLM's DFlash speculative decoding (needs vllm and a GPU)",
         {"action": "store_const", "const": True}),
    Flag("--tracking-uri", "tracking.uri", "MLflow tracking URI (default: $MLFLOW_TRACKING_URI)"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FLAGS)


def headline_metrics(report: dict) -> dict[str, float]:
    """Per benchmark: tau, tokens/s, plain ms a token and its ratio to the floor, speedup, lossless (and
    vLLM's tau and speedup), as MLflow metrics."""
    flat = {}
    for name, r in report["benchmarks"].items():
        flat[f"{name}.tau_pooled"] = r["speculative"]["tau_pooled"]
        flat[f"{name}.tau_mean_of_requests"] = r["speculative"]["tau_mean_of_requests"]
        flat[f"{name}.spec_tokens_per_s"] = r["speculative"]["tokens_per_second"]
        flat[f"{name}.plain_tokens_per_s"] = r["autoregressive"]["tokens_per_second"]
        flat[f"{name}.plain_ms_per_token"] = r["autoregressive"]["ms_per_step"]
        flat[f"{name}.plain_vs_floor"] = r["autoregressive"]["vs_floor"]
        flat[f"{name}.speedup"] = r["speedup"]
        if "vllm" in r:
            flat[f"{name}.vllm_tau_pooled"] = r["vllm"]["speculative"]["tau_pooled"]
            flat[f"{name}.vllm_speedup"] = r["vllm"]["speedup"]
        flat[f"{name}.lossless"] = r["lossless"]
    return {k: v for k, v in flat.items() if v is not None}


def run(config: Config) -> dict:
    """Evaluate `config.evaluate.draft` on `config.target`; returns the report (also written to
    `config.evaluate.output`), logged as the `evaluate` step."""
    require(config.evaluate.draft, "evaluate.draft", "--draft")
    output = Path(require(config.evaluate.output, "evaluate.output", "--output"))
    with step_run("evaluate", tracking_uri=config.tracking.uri, experiment=config.tracking.experiment) as tracker:
        tracker.log_config(config)
        report = evaluate(config.target, config.evaluate)
        tracker.log_params(report["settings"])
        tracker.log_metrics(headline_metrics(report))
        for name in (output.name, *report["plots"]):
            tracker.log_artifact(output.parent / name)
    return report


def _number(value, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    report = run(config)
    for name, r in report["benchmarks"].items():
        spec = r["speculative"]
        print(f"{name}: tau {_number(spec['tau_pooled'])} pooled / {_number(spec['tau_mean_of_requests'])} per "
              f"request, {_number(spec['tokens_per_second'])} tok/s vs "
              f"{_number(r['autoregressive']['tokens_per_second'])} plain (speedup {_number(r['speedup'], 'x')}), "
              f"lossless {r['lossless']}")
        if "vllm" in r:
            v = r["vllm"]
            print(f"{name} in vLLM: tau {_number(v['speculative']['tau_pooled'])} pooled, "
                  f"{_number(v['speculative']['tokens_per_second'])} tok/s vs "
                  f"{_number(v['autoregressive']['tokens_per_second'])} plain (speedup {_number(v['speedup'], 'x')})")
    print(f"report written to {config.evaluate.output}")
    return 0
