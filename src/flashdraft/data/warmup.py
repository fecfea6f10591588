"""The target warmup: materialise and check the target, then regenerate the training answers with it.

Output folder (later steps rely on it):
    manifest.json       written last, so its presence means the warmup finished: the target (source,
                        revision, path of the materialised HF folder, weight sizes and sha256), the
                        settings (the prompt files' sha256 among them), and the names of the files below
    summary.json        the target check: architecture, tokenizer, chat template, mask-token
                        candidate, recurrent layers, a one-prompt generation smoke test
    chat_template.jinja the chat template the answers were generated with
    train.jsonl         the regenerated dataset (train.parquet with format parquet): OpenAI `messages`
                        rows with per-sample finish_reason and token counts
    stats.json          lengths, finish reasons, sampling, throughput
While running, `.partial/` holds the resume state; running the same warmup again continues from it.

A finished or interrupted warmup is taken up again only with the same settings, compared by content where
content decides the answers: a local target by its weights' sha256, a prompt file by its own, so a folder moved
to another path or machine is still the same warmup, and a prompt file edited in place is not. (Manifests
written before the prompt files' sha256 were recorded compare those files by path, as they were written.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from flashdraft.config import TargetConfig, WarmupConfig, check_warmup_rows
from flashdraft.data import regenerate as regen
from flashdraft.data.generation import default_batch, load_generator, resolve_backend
from flashdraft.data.sampling import Sampling, target_sampling
from flashdraft.data.sources import load_chat_dataset, parse_spec
from flashdraft.errors import UserError
from flashdraft.files import check_output_dir, write_json, write_text
from flashdraft.model.mask_token import resolve_mask_token
from flashdraft.target.cache import MaterialisedTarget, materialise, sha256_file
from flashdraft.target.fast_path import fast_path_status
from flashdraft.target.source import load_target_config, load_tokenizer

log = logging.getLogger(__name__)

WORK_DIR = ".partial"
SMOKE_PROMPT = [{"role": "user", "content": "What is 2 + 3? Answer in one sentence."}]
SMOKE_TOKENS = 8


@dataclass(frozen=True)
class WarmupResult:
    output: Path
    target_path: Path  # the materialised HF folder every later step loads
    dataset: Path
    revision: str | None  # the hub commit of a hub target; None for folders and GGUF files
    manifest: dict
    summary: dict
    stats: dict


def run_warmup(
    target: TargetConfig,
    warmup: WarmupConfig,
    *,
    rank: int = 0,
    world: int = 1,
    barrier: Callable[[], None] = lambda: None,
    device: torch.device | None = None,
) -> WarmupResult:
    """Materialise + check the target, regenerate the prompts' answers; resumable (module docstring).

    `warmup.thinking` None leaves the chat template's default; sampling values left None come from the
    target's generation_config (greedy when it does not sample). Each turn adds at most `max_new_tokens`
    and stops at `max_length` tokens (default: the target's context). With `world` > 1 every rank calls
    this with its `rank` (and `barrier` syncs them): each answers its shard of the batches, rank 0
    materialises the target first and assembles the dataset last; the result is the one-process result.
    """
    if not warmup.output_dir:
        raise UserError("warmup.output_dir is not set; give the folder the warmup writes to")
    output = Path(warmup.output_dir).expanduser().resolve()
    name = target.name_or_path
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_output_dir(output, "warmup", overwrite=None, produced=_is_warmup)
    rows = load_chat_dataset(warmup.prompts, split="train", limit=warmup.num_samples, seed=warmup.seed)

    if rank == 0:  # the cache is shared: one download or dequantisation, the others find it
        materialised = materialise(name, target.cache_dir, revision=target.revision,
                                   trust_remote_code=target.trust_remote_code)
    barrier()
    if rank != 0:
        materialised = materialise(name, target.cache_dir, revision=target.revision,
                                   trust_remote_code=target.trust_remote_code)
    path = materialised.path
    config = load_target_config(str(path), trust_remote_code=target.trust_remote_code)
    tokenizer = load_tokenizer(str(path), trust_remote_code=target.trust_remote_code)
    if len(tokenizer) > config.vocab_size:
        raise UserError(
            f"the tokenizer of {name} has {len(tokenizer)} tokens but the model only {config.vocab_size} "
            "embedding rows: they do not belong together; give the model's own tokenizer files"
        )
    template, template_origin = _chat_template(tokenizer, name, target.chat_template)
    tokenizer.chat_template = template
    if warmup.thinking is not None and "enable_thinking" not in template:
        raise UserError(
            f"warmup.thinking {'on' if warmup.thinking else 'off'} was asked for, but the chat template of {name} "
            "has no `enable_thinking` switch; leave it unset (the template decides) or give a template that "
            "supports it as target.chat_template (--chat-template)"
        )
    backend = resolve_backend(warmup.backend, config, device)
    check_warmup_rows(warmup.rows, backend)
    batch_size = warmup.batch_size or default_batch(backend, device)
    limits = [n for n in (getattr(config, "max_position_embeddings", None), warmup.max_length) if n]
    context = min(limits) if limits else None
    generation_config = _generation_config(path)
    sampling = target_sampling(generation_config, warmup.temperature, warmup.top_p, warmup.top_k)
    settings = {
        "target": {k: materialised.manifest.get(k) for k in ("source", "kind", "revision", "gguf", "files")},
        "prompts": list(warmup.prompts), "prompt_sha256": _prompt_digests(warmup.prompts),
        "num_samples": len(rows), "seed": warmup.seed,
        "sampling": {"max_new_tokens": warmup.max_new_tokens, **asdict(sampling)},
        "max_length": context,
        "thinking": warmup.thinking, "turns": warmup.turns, "batch_size": batch_size, "backend": backend,
        # Only where set: the settings of a run begun before the option existed still match.
        **({"rows": warmup.rows} if warmup.rows is not None else {}),
        "format": warmup.format,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
    }
    finished = _finished_result(output, settings, materialised, update=rank == 0)
    if finished is not None:
        log.info("warmup in %s already finished with these settings; nothing to do", output)
        return finished

    stop_ids = stop_token_ids(tokenizer, generation_config)
    # This rank's share of the batches, each up to max_new_tokens decode steps (the first turns' count).
    decode_steps = -(-len(rows) // (min(warmup.rows or batch_size, batch_size) * world)) * warmup.max_new_tokens
    generator = load_generator(backend, path, tokenizer, stop_ids, seed=warmup.seed, device=device,
                               decode_steps=decode_steps, rows=warmup.rows,
                               trust_remote_code=target.trust_remote_code)
    work = output / WORK_DIR
    fresh = not output.exists()
    dataset = output / f"train.{warmup.format}"
    try:
        if rank == 0:
            summary = _summary(name, path, config, tokenizer, template_origin, template, stop_ids)
            summary["smoke"] = _smoke(generator, tokenizer, warmup.thinking, warmup.seed)
            _start_or_resume(work, settings)
            write_json(output / "summary.json", summary)
            write_text(output / "chat_template.jinja", template)
        barrier()
        run = regen.regenerate(
            rows, tokenizer=tokenizer, generator=generator, sampling=sampling,
            max_new_tokens=warmup.max_new_tokens, work_dir=work, batch_size=batch_size, seed=warmup.seed,
            thinking=warmup.thinking, context=context, turns=warmup.turns, rank=rank, world=world,
        )
        generator.close()
        barrier()
        if rank != 0:
            return _wait_for_result(output, barrier)
        stats = {**regen.assemble(work, dataset, rows["id"]), "sampling": settings["sampling"],
                 "run": {**run, "backend": backend, "ranks": world}}
    except UserError:
        # Input that cannot work leaves nothing behind; a crash keeps `.partial` to resume from.
        if fresh and rank == 0:
            shutil.rmtree(output, ignore_errors=True)
        raise
    write_json(output / "stats.json", stats)
    manifest = {
        "target": materialised.manifest, "target_path": str(path), "dataset": dataset.name,
        "summary": "summary.json", "stats": "stats.json", "chat_template": "chat_template.jinja",
        "settings": settings,
    }
    write_json(output / "manifest.json", manifest)
    shutil.rmtree(work)
    barrier()
    log.info("warmup done: %d samples in %s", stats["samples"], dataset)
    return _result(output, manifest, summary, stats)


def _wait_for_result(output: Path, barrier: Callable[[], None]) -> WarmupResult:
    """A rank other than 0: wait for rank 0 to assemble the dataset, then read what it wrote."""
    barrier()
    manifest = json.loads((output / "manifest.json").read_text())
    return _result(output, manifest, json.loads((output / "summary.json").read_text()),
                   json.loads((output / "stats.json").read_text()))


def _result(output: Path, manifest: dict, summary: dict, stats: dict) -> WarmupResult:
    return WarmupResult(output, Path(manifest["target_path"]), output / manifest["dataset"],
                        manifest["target"].get("revision"), manifest, summary, stats)


def _is_warmup(folder: Path) -> bool:
    """An earlier warmup's output: finished (its manifest) or interrupted (its resume state)."""
    return (folder / "manifest.json").is_file() or (folder / WORK_DIR).is_dir()


def _prompt_digests(specs: list[str]) -> list[str | None]:
    """The sha256 of each local prompt file; None for packaged and hub sources (named, not held here)."""
    parsed = [parse_spec(text) for text in specs]
    return [sha256_file(Path(spec.name)) if spec.kind == "file" else None for spec in parsed]


def _by_content(settings: dict) -> dict:
    """`settings` without the paths that only say where content lay: a local target (GGUF file or folder) is
    its weights' sha256, a prompt file with a recorded sha256 that digest and its mixture weight."""
    target = dict(settings.get("target", {}))
    if target.get("kind") in ("gguf", "folder"):
        target.pop("source", None)
        if target.get("gguf"):
            target["gguf"] = {key: value for key, value in target["gguf"].items() if key != "file"}
    prompts = settings.get("prompts")
    if "prompt_sha256" in settings:
        digests = settings["prompt_sha256"]
        prompts = [text if digest is None else _weight_of(text) for text, digest in zip(prompts, digests)]
    return {**settings, "target": target, "prompts": prompts}


def _weight_of(spec: str) -> str:
    """A file spec's '@WEIGHT' ('' without one): it follows the last '@' (sources.parse_spec), and the stored
    path is not parsed, as it may not exist any more."""
    return "@" + spec.rpartition("@")[2] if "@" in spec else ""


def _same_settings(earlier: dict, now: dict) -> bool:
    if "prompt_sha256" not in earlier:  # recorded before the prompt files' sha256: their paths decide
        now = {key: value for key, value in now.items() if key != "prompt_sha256"}
    return _by_content(earlier) == _by_content(now)


def _other_settings(folder: Path, earlier: dict, what: str, fix: str) -> UserError:
    why = "" if "prompt_sha256" in earlier else (
        " (its manifest predates the prompt files' sha256, so prompt files at other paths count as other settings)")
    return UserError(f"{folder} holds {what} with other settings{why}; {fix}")


def _finished_result(output: Path, settings: dict, materialised: MaterialisedTarget,
                     update: bool) -> WarmupResult | None:
    path = output / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    earlier = manifest.get("settings", {})
    if not _same_settings(earlier, settings):
        raise _other_settings(output, earlier, "a finished warmup", "give a new output folder or remove it")
    if manifest["target_path"] != str(materialised.path):
        # The same answers where the target was materialised elsewhere (a moved folder, another machine): later
        # steps load the target from the manifest's path, so it names the one that exists now (rank 0 writes it).
        manifest = {**manifest, "target": materialised.manifest, "target_path": str(materialised.path)}
        if update:
            write_json(path, manifest)
    return _result(output, manifest, json.loads((output / "summary.json").read_text()),
                   json.loads((output / "stats.json").read_text()))


def _start_or_resume(work: Path, settings: dict) -> None:
    state = work / "settings.json"
    if state.is_file():
        earlier = json.loads(state.read_text())
        if not _same_settings(earlier, settings):
            raise _other_settings(work.parent, earlier, "an interrupted warmup",
                                  "rerun it with the same settings to resume, or give a new output folder")
        log.info("resuming the warmup in %s", work.parent)
        return
    work.mkdir(parents=True, exist_ok=True)
    write_json(state, settings)


def _chat_template(tokenizer, target: str, override: str | None) -> tuple[str, str]:
    if override is not None:
        path = Path(override).expanduser()
        if not path.is_file():
            raise UserError(f"target.chat_template {path} does not exist; give a Jinja chat template file")
        template, origin = path.read_text(), str(path)
    else:
        template, origin = tokenizer.chat_template, "tokenizer"
        if isinstance(template, dict):  # several named templates: the default one is for chat
            template = template.get("default")
    if not template:
        raise UserError(
            f"target {target} has no chat template, so its prompts cannot be formatted; give one as "
            "target.chat_template (--chat-template FILE): a Jinja template, e.g. the chat_template.jinja of "
            "the model's instruct version"
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


def stop_token_ids(tokenizer, generation_config) -> list[int]:
    """The ids that end an answer: the generation config's eos ids and the tokenizer's."""
    ids = set()
    for value in (generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    if not ids:
        raise UserError("the target defines no eos token, so answers would never stop; fix its generation_config.json")
    return sorted(ids)


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
        [completion] = generator.generate([prompt], Sampling(), [SMOKE_TOKENS], [seed])
    except Exception as err:  # whatever breaks here breaks the whole regeneration
        raise UserError(f"the target failed to generate a one-prompt smoke test: {type(err).__name__}: {err}") from err
    seconds = time.perf_counter() - started
    return {"prompt": SMOKE_PROMPT[0]["content"], "answer": tokenizer.decode(completion.token_ids),
            "tokens": len(completion.token_ids), "finish_reason": completion.finish_reason,
            "seconds": round(seconds, 3)}
