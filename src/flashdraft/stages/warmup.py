"""`flashdraft warmup`: materialise and check the target, then regenerate the training answers with it.

Output folder (later steps rely on it):
    manifest.json       written last, so its presence means the warmup finished: the target (source,
                        revision, path of the materialised HF folder, weight sizes and sha256), the
                        settings, and the names of the files below
    summary.json        the target check: architecture, tokenizer, chat template, mask-token
                        candidate, recurrent layers, a one-prompt generation smoke test
    chat_template.jinja the chat template the answers were generated with
    train.jsonl         the regenerated dataset (train.parquet with --format parquet): OpenAI `messages`
                        rows with per-sample finish_reason and token counts
    stats.json          lengths, finish reasons, throughput
While running, `.partial/` holds the resume state; rerunning the same command continues from it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from flashdraft.target.fast_path import fast_path_status
from flashdraft.target.source import load_target_config, load_tokenizer
from flashdraft.data import regenerate as regen
from flashdraft.data.sources import load_chat_dataset
from flashdraft.errors import UserError
from flashdraft.model.mask_token import resolve_mask_token
from flashdraft.target.cache import materialise
from flashdraft.tracking.runs import step_run

log = logging.getLogger(__name__)

BACKENDS = ("auto", "transformers", "vllm")
FORMATS = ("jsonl", "parquet")
DEFAULT_BATCH = {"transformers": 8, "vllm": 256}
WORK_DIR = ".partial"
SMOKE_PROMPT = [{"role": "user", "content": "What is 2 + 3? Answer in one sentence."}]
SMOKE_TOKENS = 8


@dataclass(frozen=True)
class WarmupResult:
    output: Path
    target_path: Path
    dataset: Path
    manifest: dict
    summary: dict
    stats: dict


def run_warmup(
    target: str,
    prompts: str | list[str],
    output: str | Path,
    *,
    num_samples: int | None = None,
    max_new_tokens: int = 2048,
    max_length: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    thinking: bool | None = None,
    batch_size: int | None = None,
    backend: str = "auto",
    seed: int = 0,
    cache_dir: str | Path | None = None,
    chat_template: str | Path | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    format: str = "jsonl",
) -> WarmupResult:
    """Materialise + check the target, regenerate the prompts' answers; resumable (module docstring).

    `thinking` None leaves the chat template's default; sampling values left None come from the
    target's generation_config (greedy when it does not sample). A conversation ends before the turn
    whose prompt plus `max_new_tokens` exceeds `max_length` tokens (default: the target's context);
    set it to the training max length, since tokens past it are never trained on.
    """
    output = Path(output).expanduser().resolve()
    backend = _resolve_backend(backend)
    if format not in FORMATS:
        raise UserError(f"unknown dataset format {format!r}; choose one of {', '.join(FORMATS)}")
    batch_size = batch_size or DEFAULT_BATCH[backend]
    if min(batch_size, num_samples or 1, max_length or 1) < 1:
        raise UserError("--batch-size, --num-samples and --max-length must be positive")
    _check_output_is_ours(output)
    specs = [prompts] if isinstance(prompts, str) else list(prompts)
    rows = load_chat_dataset(specs, split="train", limit=num_samples, seed=seed)

    materialised = materialise(target, cache_dir, revision=revision, trust_remote_code=trust_remote_code)
    path = materialised.path
    config = load_target_config(str(path), trust_remote_code=trust_remote_code)
    tokenizer = load_tokenizer(str(path), trust_remote_code=trust_remote_code)
    if len(tokenizer) > config.vocab_size:
        raise UserError(
            f"the tokenizer of {target} has {len(tokenizer)} tokens but the model only {config.vocab_size} "
            "embedding rows: they do not belong together; give the model's own tokenizer files"
        )
    template, template_origin = _chat_template(tokenizer, target, chat_template)
    tokenizer.chat_template = template
    if thinking is not None and "enable_thinking" not in template:
        raise UserError(
            f"--thinking {'on' if thinking else 'off'} was asked for, but the chat template of {target} has "
            "no `enable_thinking` switch; leave --thinking out (the template decides) or give a template "
            "that supports it with --chat-template"
        )
    limits = [n for n in (getattr(config, "max_position_embeddings", None), max_length) if n]
    context = min(limits) if limits else None
    generation_config = _generation_config(path)
    sampling = regen.target_sampling(generation_config, max_new_tokens, temperature, top_p, top_k)
    settings = {
        "target": {k: materialised.manifest.get(k) for k in ("source", "kind", "revision", "gguf", "files")},
        "prompts": specs, "num_samples": len(rows), "seed": seed, "sampling": asdict(sampling),
        "max_length": context,
        "thinking": thinking, "batch_size": batch_size, "backend": backend, "format": format,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
    }
    finished = _finished_result(output, settings)
    if finished is not None:
        log.info("warmup in %s already finished with these settings; nothing to do", output)
        return finished

    stop_ids = _stop_ids(tokenizer, generation_config)
    generator = _generator(backend, path, config, tokenizer, stop_ids, seed, trust_remote_code)
    summary = _summary(target, path, config, tokenizer, template_origin, template, stop_ids)
    summary["smoke"] = _smoke(generator, tokenizer, thinking, seed)

    with step_run("warmup") as tracker:
        tracker.log_params({"target": target, "target_revision": materialised.manifest.get("revision"),
                            **{k: v for k, v in settings.items() if k != "target"}})
        work = output / WORK_DIR
        fresh = not output.exists()
        _start_or_resume(work, settings)
        _write_json(output / "summary.json", summary)
        _write_text(output / "chat_template.jinja", template)
        dataset = output / f"train.{format}"
        try:
            run = regen.regenerate(
                rows, tokenizer=tokenizer, generator=generator, sampling=sampling, work_dir=work,
                batch_size=batch_size, seed=seed, thinking=thinking,
                context=context,
            )
            stats = {**regen.assemble(work, dataset, rows["id"], sampling), "run": {**run, "backend": backend}}
        except UserError:
            # Input that cannot work leaves nothing behind; a crash keeps `.partial` to resume from.
            if fresh:
                shutil.rmtree(output, ignore_errors=True)
            raise
        _write_json(output / "stats.json", stats)
        manifest = {
            "target": materialised.manifest, "target_path": str(path), "dataset": dataset.name,
            "summary": "summary.json", "stats": "stats.json", "chat_template": "chat_template.jinja",
            "settings": settings,
        }
        _write_json(output / "manifest.json", manifest)
        shutil.rmtree(work)
        tracker.log_metrics({
            "warmup.samples": stats["samples"], "warmup.truncated_fraction": stats["truncated_fraction"],
            "warmup.completion_tokens_mean": stats["completion_tokens"]["mean"],
            **({"warmup.tokens_per_second": run["tokens_per_second"]} if run["tokens_per_second"] else {}),
        })
        tracker.log_artifact(output / "summary.json")
        tracker.log_artifact(output / "stats.json")
    log.info("warmup done: %d samples in %s", stats["samples"], dataset)
    return WarmupResult(output, path, dataset, manifest, summary, stats)


def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if backend == "vllm" and not has_vllm:
        raise UserError(
            "--backend vllm needs vLLM: pip install vllm (on a CUDA machine), or use --backend transformers"
        )
    if backend == "auto":
        import torch

        return "vllm" if has_vllm and torch.cuda.is_available() else "transformers"
    return backend


def _check_output_is_ours(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {output} is a file; give a folder")
    if output.is_dir() and any(output.iterdir()):
        if not ((output / "manifest.json").is_file() or (output / WORK_DIR).is_dir()):
            raise UserError(
                f"--output {output} is not empty and holds no warmup; give a new or empty folder"
            )


def _finished_result(output: Path, settings: dict) -> WarmupResult | None:
    path = output / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    if manifest.get("settings") != settings:
        raise UserError(
            f"{output} holds a finished warmup with other settings; give a new --output or remove it"
        )
    return WarmupResult(
        output, Path(manifest["target_path"]), output / manifest["dataset"], manifest,
        json.loads((output / "summary.json").read_text()), json.loads((output / "stats.json").read_text()),
    )


def _start_or_resume(work: Path, settings: dict) -> None:
    state = work / "settings.json"
    if state.is_file():
        if json.loads(state.read_text()) != settings:
            raise UserError(
                f"{work.parent} holds an interrupted warmup with other settings; rerun it with the same "
                "options to resume, or give a new --output"
            )
        log.info("resuming the warmup in %s", work.parent)
        return
    work.mkdir(parents=True, exist_ok=True)
    _write_json(state, settings)


def _chat_template(tokenizer, target: str, override: str | Path | None) -> tuple[str, str]:
    if override is not None:
        path = Path(override).expanduser()
        if not path.is_file():
            raise UserError(f"--chat-template {path} does not exist; give a Jinja chat template file")
        template, origin = path.read_text(), str(path)
    else:
        template, origin = tokenizer.chat_template, "tokenizer"
        if isinstance(template, dict):  # several named templates: the default one is for chat
            template = template.get("default")
    if not template:
        raise UserError(
            f"target {target} has no chat template, so its prompts cannot be formatted; give one with "
            "--chat-template FILE (a Jinja template, e.g. the chat_template.jinja of the model's instruct "
            "version)"
        )
    try:
        tokenizer.apply_chat_template(SMOKE_PROMPT, tokenize=False, add_generation_prompt=True,
                                      chat_template=template)
    except Exception as err:  # jinja syntax or runtime errors
        raise UserError(f"the chat template ({origin}) does not render a simple chat: {err}") from err
    return template, origin


def _generation_config(path: Path):
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: transformers' defaults (greedy)
        return GenerationConfig()


def _stop_ids(tokenizer, generation_config) -> list[int]:
    ids = set()
    for value in (generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    if not ids:
        raise UserError("the target defines no eos token, so answers would never stop; fix its generation_config.json")
    return sorted(ids)


def _generator(backend: str, path: Path, config, tokenizer, stop_ids, seed: int, trust_remote_code: bool):
    if backend == "vllm":
        return regen.VllmGenerator(path, stop_ids, seed, trust_remote_code=trust_remote_code)
    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16 if cuda else torch.float32, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load target weights from {path}: {err}") from err
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    return regen.TransformersGenerator(model.to("cuda" if cuda else "cpu"), stop_ids, pad)


def _summary(target: str, path: Path, config, tokenizer, template_origin: str, template: str, stop_ids) -> dict:
    try:
        choice = resolve_mask_token(tokenizer, config)
        mask = {"id": choice.token_id, "token": tokenizer.convert_ids_to_tokens(choice.token_id)
                if choice.token_id < len(tokenizer) else None, "reason": choice.reason}
    except UserError as err:
        mask = {"id": None, "error": str(err)}
    return {
        "target": target,
        "path": str(path),
        "model_type": config.model_type,
        "architectures": getattr(config, "architectures", None),
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "tokenizer_size": len(tokenizer),
        "dtype": str(getattr(config, "dtype", None) or "unknown").removeprefix("torch."),
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "tie_word_embeddings": getattr(config, "tie_word_embeddings", None),
        "chat_template": {"origin": template_origin, "supports_thinking": "enable_thinking" in template},
        "stop_token_ids": stop_ids,
        "mask_token": mask,
        "recurrent": fast_path_status(config),
    }


def _smoke(generator, tokenizer, thinking: bool | None, seed: int) -> dict:
    """One short greedy answer: the target loads, formats a chat and generates."""
    prompt = regen.Renderer(tokenizer, thinking)(SMOKE_PROMPT)
    started = time.perf_counter()
    try:
        [completion] = generator.generate([prompt], regen.Sampling(SMOKE_TOKENS), [seed])
    except Exception as err:  # whatever breaks here breaks the whole regeneration
        raise UserError(f"the target failed to generate a one-prompt smoke test: {type(err).__name__}: {err}") from err
    seconds = time.perf_counter() - started
    return {"prompt": SMOKE_PROMPT[0]["content"], "answer": tokenizer.decode(completion.token_ids),
            "tokens": len(completion.token_ids), "finish_reason": completion.finish_reason,
            "seconds": round(seconds, 3)}


def _write_text(path: Path, text: str) -> None:
    """Write beside, fsync, rename: readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_json(path: Path, data: dict) -> None:
    _write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="hub id, local HF folder, .gguf file or packaged:smollm2")
    parser.add_argument("--prompts", required=True, nargs="+", metavar="SPEC",
                        help="dataset specs (a mixture when several): FILE.jsonl|.json|.parquet, "
                        "packaged:reasoning_gym, packaged:chitchat, org/name[/config][:split], each with "
                        "an optional @WEIGHT")
    parser.add_argument("--output", required=True, type=Path, help="warmup output folder (resumable)")
    parser.add_argument("--num-samples", type=int, help="prompts to answer (default: all of the mixture)")
    parser.add_argument("--max-new-tokens", type=int, default=2048, help="per answer (default 2048)")
    parser.add_argument("--max-length", type=int,
                        help="tokens per conversation: it ends before a turn whose prompt + max-new-tokens would "
                        "exceed this (default: the target's context; use the training max length)")
    parser.add_argument("--temperature", type=float, help="0 = greedy (default: the target's generation_config)")
    parser.add_argument("--top-p", type=float, help="default: the target's generation_config")
    parser.add_argument("--top-k", type=int, help="0 = off (default: the target's generation_config)")
    parser.add_argument("--thinking", choices=("on", "off"),
                        help="the chat template's enable_thinking switch (default: the template's own default)")
    parser.add_argument("--batch-size", type=int, help="prompts per generate call (default 8, or 256 with vLLM)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="auto: vLLM when installed and a GPU is present, else transformers")
    parser.add_argument("--seed", type=int, default=0, help="prompt mixture and sampling seed")
    parser.add_argument("--cache-dir", type=Path, help="where hub snapshots and dequantised GGUFs are kept "
                        "(default $FLASHDRAFT_CACHE or ~/.cache/flashdraft)")
    parser.add_argument("--chat-template", type=Path, help="a Jinja chat template file, for targets without one")
    parser.add_argument("--revision", help="hub revision (branch, tag or commit) of a hub target")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="dataset file format")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the target's own model code")


def main(args: argparse.Namespace) -> int:
    result = run_warmup(
        args.target, args.prompts, args.output, num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens, max_length=args.max_length, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k,
        thinking=None if args.thinking is None else args.thinking == "on", batch_size=args.batch_size,
        backend=args.backend, seed=args.seed, cache_dir=args.cache_dir, chat_template=args.chat_template,
        revision=args.revision, trust_remote_code=args.trust_remote_code, format=args.format,
    )
    stats = result.stats
    print(f"warmup: {stats['samples']} samples, {stats['completion_tokens']['total']} answer tokens, "
          f"{stats['truncated_fraction']:.1%} truncated -> {result.dataset}")
    return 0
