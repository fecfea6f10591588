"""`flashdraft warmup`: materialise and check the target, then regenerate the training answers with it.

The output folder is described in `flashdraft.data.warmup`; this stage adds `config.yaml`, the resolved
config it ran with. Rerunning the same command resumes an interrupted warmup or finds a finished one.
"""

from __future__ import annotations

import argparse
import os

from flashdraft.config import WARMUP_BACKENDS, Config, to_yaml
from flashdraft.data.warmup import WarmupResult, run_warmup
from flashdraft.files import write_text
from flashdraft.stages.args import Flag, add_config_arguments, config_from_args, on_off, require
from flashdraft.tracking.runs import step_run

FLAGS = [
    Flag("--target", "target.name_or_path", "hub id, local HF folder, .gguf file or packaged:smollm2"),
    Flag("--prompts", "warmup.prompts",
         "dataset specs (a mixture when several): FILE.jsonl|.json|.parquet, packaged:reasoning_gym, "
         "packaged:chitchat, org/name[/config][:split], each with an optional @WEIGHT",
         {"nargs": "+", "metavar": "SPEC"}),
    Flag("--output", "warmup.output_dir", "warmup output folder (resumable)"),
    Flag("--num-samples", "warmup.num_samples", "prompts to answer (default: all of the mixture)", {"type": int}),
    Flag("--max-new-tokens", "warmup.max_new_tokens", "per answer", {"type": int}),
    Flag("--max-length", "warmup.max_length",
         "tokens per conversation: each answer stops there (default: the target's context; use the training "
         "length, data.max_length)", {"type": int}),
    Flag("--temperature", "warmup.temperature", "0 = greedy (default: the target's generation_config)",
         {"type": float}),
    Flag("--top-p", "warmup.top_p", "default: the target's generation_config", {"type": float}),
    Flag("--top-k", "warmup.top_k", "0 = off (default: the target's generation_config)", {"type": int}),
    Flag("--thinking", "warmup.thinking",
         "the chat template's enable_thinking switch (default: the template's own default)",
         {"type": on_off, "metavar": "on|off"}),
    Flag("--batch-size", "warmup.batch_size",
         "prompts per generate call (default: static 8 on a CPU, 64 on a GPU; graphed 64; others 512)",
         {"type": int}),
    Flag("--rows", "warmup.rows",
         "graphed backend: prompts of a call decoded at once, a finished row taking the next (default: all)",
         {"type": int}),
    Flag("--backend", "warmup.backend", "auto: vLLM when installed on a GPU, else graphed batches on a GPU "
         "(attention-only targets; continuous batching where they have sliding windows), else static batches",
         {"choices": WARMUP_BACKENDS}),
    Flag("--turns", "warmup.turns", "answer each conversation's first user turn, or all of them",
         {"choices": ("first", "all")}),
    Flag("--seed", "warmup.seed", "prompt mixture and sampling seed", {"type": int}),
    Flag("--cache-dir", "target.cache_dir",
         "where hub snapshots and dequantised GGUFs are kept (default $FLASHDRAFT_CACHE or ~/.cache/flashdraft)"),
    Flag("--chat-template", "target.chat_template", "a Jinja chat template file, for targets without one"),
    Flag("--revision", "target.revision", "hub revision (branch, tag or commit) of a hub target"),
    Flag("--format", "warmup.format", "dataset file format", {"choices": ("jsonl", "parquet")}),
    Flag("--trust-remote-code", "target.trust_remote_code", "allow the target's own model code",
         {"action": "store_const", "const": True}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FLAGS)


def run(config: Config) -> WarmupResult:
    """Warm up `config.target` on `config.warmup` (output_dir required), logged as the `warmup` step.

    Under torchrun (one process per GPU, on one or many nodes) every process answers its shard of the
    prompts; rank 0 assembles the dataset and logs to MLflow.
    """
    require(config.warmup.output_dir, "warmup.output_dir", "--output")
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        with step_run("warmup", tracking_uri=config.tracking.uri, experiment=config.tracking.experiment) as tracker:
            tracker.log_config(config)
            return _logged(tracker, config, run_warmup(config.target, config.warmup))
    from flashdraft.train.distributed import setup, teardown

    dist = setup()
    shard = {"rank": dist.rank, "world": dist.world, "barrier": dist.barrier, "device": dist.device}
    try:
        if not dist.is_main:
            return run_warmup(config.target, config.warmup, **shard)
        with step_run("warmup", tracking_uri=config.tracking.uri, experiment=config.tracking.experiment) as tracker:
            tracker.log_config(config)
            return _logged(tracker, config, run_warmup(config.target, config.warmup, **shard))
    finally:
        teardown()


def _logged(tracker, config: Config, result: WarmupResult) -> WarmupResult:
    resolved = write_text(result.output / "config.yaml", to_yaml(config))
    settings = {k: v for k, v in result.manifest["settings"].items() if k != "target"}
    tracker.log_params({"target_revision": result.revision, **settings})
    stats = result.stats
    tokens_per_second = stats["run"]["tokens_per_second"]
    tracker.log_metrics({
        "warmup.samples": stats["samples"], "warmup.truncated_fraction": stats["truncated_fraction"],
        "warmup.completion_tokens_mean": stats["completion_tokens"]["mean"],
        # None, or absent from a finished output an older version wrote, when not every turn was counted.
        **({"warmup.looped_fraction": stats["looped_fraction"]} if stats.get("looped_fraction") is not None else {}),
        **({"warmup.tokens_per_second": tokens_per_second} if tokens_per_second else {}),
    })
    for path in (result.output / "summary.json", result.output / "stats.json", resolved):
        tracker.log_artifact(path)
    return result


def main(args: argparse.Namespace) -> int:
    result = run(config_from_args(args))
    stats = result.stats
    looped = "" if stats.get("looped_fraction") is None else f", {stats['looped_fraction']:.1%} looped"
    print(f"warmup: {stats['samples']} samples, {stats['completion_tokens']['total']} answer tokens, "
          f"{stats['truncated_fraction']:.1%} truncated{looped} -> {result.dataset}")
    return 0
