"""Regenerate the assistant turns of chat prompts with the target, resumably.

Drafts learn the target's own distribution, so the training answers must be the target's. The
original assistant turns are dropped; each conversation is answered turn by turn (the answer to the
first user turn is generated, appended, then the next user turn follows, ...).

Batches: a batch generates one round per turn of its longest conversation (a 100-turn chat among
one-turn prompts makes 99 rounds of near-empty batches, each a full sequential `generate`), and each
round pads to its longest prompt. The prompts therefore go in windows of WINDOW_BATCHES batches, and
within a window they are sorted by number of turns, then by the token length of the first turn,
before being cut into batches. The window bounds how many rows `assemble` holds while it restores
prompt order.

Resume: the batches are fixed (the sort is deterministic). Each finished batch is appended to
`<work>/completed.jsonl` as ONE line with its prompt indices, flushed and fsynced, so a kill loses at
most the batch in flight (a torn last line is discarded). A rerun skips finished batches and
regenerates the rest with the same batch composition and seeds, and the final file is assembled in
prompt order: the result equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flashdraft.errors import UserError
from flashdraft.data.vllm_sampling import vllm_sampling

log = logging.getLogger(__name__)

COMPLETED_NAME = "completed.jsonl"
WINDOW_BATCHES = 16


@dataclass(frozen=True)
class Sampling:
    """Decoding settings; temperature 0 means greedy. top_p 1.0 / top_k 0 switch those filters off."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_sampling(
    generation_config,
    max_new_tokens: int,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
) -> Sampling:
    """The target's recommended sampling (its generation_config), with explicit values taking precedence."""
    sampled = bool(getattr(generation_config, "do_sample", False))
    if temperature is None:
        temperature = (getattr(generation_config, "temperature", None) or 1.0) if sampled else 0.0
    if top_p is None:
        top_p = (getattr(generation_config, "top_p", None) or 1.0) if sampled else 1.0
    if top_k is None:
        top_k = (getattr(generation_config, "top_k", None) or 0) if sampled else 0
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise UserError(
            f"bad sampling: temperature {temperature} (>= 0), top_p {top_p} (in (0, 1]), top_k {top_k} (>= 0)"
        )
    return Sampling(max_new_tokens, float(temperature), float(top_p), int(top_k))


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # the answer, without the stop token
    finish_reason: str  # "stop" (a stop token) or "length" (max_new_tokens)


def _cut_at_stop(ids: Sequence[int], stop_ids: set[int]) -> Completion:
    for position, token in enumerate(ids):
        if token in stop_ids:
            return Completion(list(ids[:position]), "stop")
    return Completion(list(ids), "length")


class TransformersGenerator:
    """Batched `generate` with left padding and a KV cache."""

    def __init__(self, model, stop_ids: Sequence[int], pad_id: int):
        self.model = model.eval()
        self.stop_ids = set(stop_ids)
        self.pad_id = pad_id

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, seeds: Sequence[int]) -> list[Completion]:
        from transformers import GenerationConfig

        width = max(len(p) for p in prompts)
        device = self.model.device
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            temperature=sampling.temperature if not sampling.greedy else None,
            top_p=sampling.top_p if not sampling.greedy else None,
            top_k=sampling.top_k if not sampling.greedy else None,
            eos_token_id=sorted(self.stop_ids),
            pad_token_id=self.pad_id,
        )
        # One seed per batch: batches are fixed, so a resumed run draws the same samples.
        torch.manual_seed(seeds[0])
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
        )
        return [_cut_at_stop(row[width:].tolist(), self.stop_ids) for row in out.cpu()]


class VllmGenerator:
    """vLLM offline inference on token-id prompts, with one sampling seed per request."""

    def __init__(self, model_path: str | Path, stop_ids: Sequence[int], seed: int, trust_remote_code: bool = False):
        from vllm import LLM

        self.llm = LLM(model=str(model_path), seed=seed, trust_remote_code=trust_remote_code)
        self.stop_ids = set(stop_ids)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, seeds: Sequence[int]) -> list[Completion]:
        params = [vllm_sampling(sampling, max_tokens=sampling.max_new_tokens, stop_ids=self.stop_ids, seed=seed)
                  for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        completions = []
        for output in outputs:
            ids = list(output.outputs[0].token_ids)
            if ids and ids[-1] in self.stop_ids:
                ids.pop()
            completions.append(Completion(ids, "stop" if output.outputs[0].finish_reason == "stop" else "length"))
        return completions


def turn_groups(messages: Sequence[dict]) -> list[list[dict]]:
    """The prompt's turns: runs of system/user messages that each get one generated answer.

    The original assistant messages only mark where a turn ends; a run without a user message (a lone
    system prompt) joins the next turn.
    """
    groups: list[list[dict]] = [[]]
    for message in messages:
        if message["role"] == "assistant":
            if any(m["role"] == "user" for m in groups[-1]):
                groups.append([])
        else:
            groups[-1].append({"role": message["role"], "content": message["content"]})
    if not any(m["role"] == "user" for m in groups[-1]):
        tail = groups.pop()
        if not groups:
            raise UserError("a conversation has no user turn to answer")
        groups[-1].extend(tail)  # a trailing system message is kept, unanswered
    return groups


class Renderer:
    """Chat messages -> prompt token ids through the target's chat template."""

    def __init__(self, tokenizer, thinking: bool | None = None):
        self.tokenizer = tokenizer
        self.template_kwargs = {} if thinking is None else {"enable_thinking": thinking}

    def __call__(self, messages: Sequence[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def _answer_batch(rows: list[dict], render: Renderer, decode: Callable, generator, sampling: Sampling,
                  seed: int, context: int | None, on_tokens: Callable[[int], None]) -> list[dict]:
    """Regenerate every turn of a batch of conversations; `on_tokens` hears of each round's new tokens.

    A turn whose prompt plus `max_new_tokens` exceeds the target's `context` is not generated: its
    conversation ends at the turn before, or is marked skipped when that was the first turn.
    """
    groups = [turn_groups(row["messages"]) for row in rows]
    histories: list[list[dict]] = [[] for _ in rows]
    turns: list[list[dict]] = [[] for _ in rows]
    ended = [False] * len(rows)
    for round_ in range(max(len(g) for g in groups)):
        active, prompts = [], []
        for i, group in enumerate(groups):
            if ended[i] or round_ >= len(group):
                continue
            prompt = render(histories[i] + group[round_])
            if context is not None and len(prompt) + sampling.max_new_tokens > context:
                ended[i] = True
                continue
            histories[i].extend(group[round_])
            active.append(i)
            prompts.append(prompt)
        if not active:
            break
        seeds = [seed * 1_000_003 + i * 1_009 + round_ for i in active]
        completions = generator.generate(prompts, sampling, seeds)
        for i, prompt, completion in zip(active, prompts, completions):
            histories[i].append({"role": "assistant", "content": decode(completion.token_ids)})
            turns[i].append({"finish_reason": completion.finish_reason, "prompt_tokens": len(prompt),
                             "completion_tokens": len(completion.token_ids)})
        on_tokens(sum(len(c.token_ids) for c in completions))
    out = []
    for row, history, row_turns in zip(rows, histories, turns):
        if not row_turns:
            out.append({"id": row["id"], "skipped": "prompt_too_long"})
            continue
        out.append({
            "id": row["id"],
            "source": row["source"],
            "messages": history,
            "finish_reason": row_turns[-1]["finish_reason"],
            "prompt_tokens": row_turns[0]["prompt_tokens"],
            "completion_tokens": sum(t["completion_tokens"] for t in row_turns),
            "turns": row_turns,
        })
    return out


def read_completed(work: Path) -> dict[int, int]:
    """{batch index: byte offset of its record} of the finished batches; a torn last line is cut off."""
    path = work / COMPLETED_NAME
    if not path.exists():
        return {}
    offsets: dict[int, int] = {}
    good = 0
    with open(path, "rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break
            offsets.setdefault(record["batch"], good)
            good += len(line)
    if good < path.stat().st_size:
        log.warning("discarding a torn record at the end of %s (%d bytes)", path, path.stat().st_size - good)
        with open(path, "r+b") as handle:
            handle.truncate(good)
    return offsets


def regenerate(
    prompts,
    *,
    tokenizer,
    generator,
    sampling: Sampling,
    work_dir: Path,
    batch_size: int,
    seed: int = 0,
    thinking: bool | None = None,
    context: int | None = None,
) -> dict:
    """Answer every prompt row (`id`, `source`, `messages`) with the target, into `work_dir`.

    Finished batches already in `work_dir` are skipped. A turn whose prompt plus max_new_tokens exceeds
    `context` is not generated (see `_answer_batch`). Returns this run's throughput; `assemble` writes
    the dataset.
    """
    render = Renderer(tokenizer, thinking)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    work_dir.mkdir(parents=True, exist_ok=True)
    done = read_completed(work_dir)
    n_batches = -(-len(prompts) // batch_size)

    def batching_key(index: int) -> tuple[int, int, int]:
        groups = turn_groups(prompts[index]["messages"])
        return len(groups), len(render(groups[0])), index

    window_size = WINDOW_BATCHES * batch_size
    resumed = sum(min(batch_size, len(prompts) - b * batch_size) for b in done if b < n_batches)
    generated = 0
    started = time.perf_counter()
    with (
        open(work_dir / COMPLETED_NAME, "a", encoding="utf-8") as log_file,
        tqdm(total=len(prompts), initial=resumed, desc="regenerate", unit="sample") as bar,
    ):
        def on_tokens(count: int) -> None:  # after every turn round, so long conversations show progress
            nonlocal generated
            generated += count
            bar.set_postfix(tok_s=f"{generated / (time.perf_counter() - started):.1f}")

        for start in range(0, len(prompts), window_size):
            first = start // batch_size
            batches = range(first, min(first + WINDOW_BATCHES, n_batches))
            if all(b in done for b in batches):
                continue
            window = range(start, min(start + window_size, len(prompts)))
            order = sorted(window, key=batching_key)
            for batch in batches:
                if batch in done:
                    continue
                indices = order[(batch - first) * batch_size : (batch - first + 1) * batch_size]
                answered = _answer_batch([prompts[i] for i in indices], render, decode, generator, sampling,
                                         seed * 100_003 + batch, context, on_tokens)
                record = {"batch": batch, "indices": indices, "rows": answered}
                log_file.write(json.dumps(record, ensure_ascii=False) + "\n")
                log_file.flush()
                os.fsync(log_file.fileno())
                bar.update(len(indices))
    seconds = time.perf_counter() - started
    return {"resumed_samples": resumed, "generated_tokens": generated, "seconds": round(seconds, 3),
            "tokens_per_second": round(generated / seconds, 2) if seconds > 0 and generated else None}


def assemble(work_dir: Path, path: Path, expected_ids: Sequence[str], sampling: Sampling) -> dict:
    """Write the finished batches as one dataset in prompt order (.jsonl or .parquet), atomically.

    Reads the batches one at a time and holds at most one window of rows (batches are length-sorted
    within a window), so memory does not grow with the dataset. Returns its stats.
    """
    offsets = read_completed(work_dir)
    expected = list(expected_ids)
    emitted = 0
    completion: list[int] = []
    prompt: list[int] = []
    reasons: Counter = Counter()
    counts = {"samples": 0, "skipped_too_long": 0}

    def in_prompt_order():
        nonlocal emitted
        pending: dict[int, dict] = {}
        with open(work_dir / COMPLETED_NAME, "rb") as handle:
            for batch in range(len(offsets)):
                if batch not in offsets:
                    raise RuntimeError(f"batch {batch} is missing from {handle.name}")
                handle.seek(offsets[batch])
                record = json.loads(handle.readline())
                if len(record.get("indices", ())) != len(record["rows"]):  # written by an older flashdraft
                    raise RuntimeError(f"{handle.name} has batches without prompt indices; remove the output, rerun")
                for index, row in zip(record["indices"], record["rows"]):
                    if index >= len(expected) or row["id"] != expected[index] or index < emitted:
                        raise RuntimeError(f"{handle.name} does not match the prompts; remove the output, rerun")
                    pending[index] = row
                while emitted in pending:
                    yield pending.pop(emitted)
                    emitted += 1

    def rows():
        for row in in_prompt_order():
            if "skipped" in row:
                counts["skipped_too_long"] += 1
                continue
            counts["samples"] += 1
            for turn in row["turns"]:
                completion.append(turn["completion_tokens"])
                prompt.append(turn["prompt_tokens"])
                reasons[turn["finish_reason"]] += 1
            yield row

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if path.suffix == ".parquet":
            _write_parquet(rows(), tmp)
        else:
            with open(tmp, "w", encoding="utf-8") as out:
                for row in rows():
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                out.flush()
                os.fsync(out.fileno())
        if emitted < len(expected):
            raise RuntimeError(f"{work_dir / COMPLETED_NAME} misses prompts; rerun the same command to finish")
        if not counts["samples"]:
            raise UserError(f"no prompt fits the target's context with max_new_tokens {sampling.max_new_tokens}; "
                            "lower --max-new-tokens")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if counts["skipped_too_long"]:
        log.warning("%d conversations skipped: their first prompt + max_new_tokens exceeds the target's context",
                    counts["skipped_too_long"])
    return {
        **counts,
        "turns": len(completion),
        "finish_reasons": dict(sorted(reasons.items())),
        "truncated_fraction": round(reasons.get("length", 0) / len(completion), 4),
        "completion_tokens": _summary(completion),
        "prompt_tokens": _summary(prompt),
        "sampling": asdict(sampling),
    }


def _parquet_schema():
    import pyarrow as pa

    turn = pa.struct([("finish_reason", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())])
    return pa.schema([
        ("id", pa.string()), ("source", pa.string()),
        ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("finish_reason", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("turns", pa.list_(turn)),
    ])


def _write_parquet(rows: Iterable[dict], path: Path, group: int = 1024) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _parquet_schema()
    with pq.ParquetWriter(str(path), schema) as writer:
        chunk: list[dict] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == group:
                writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                chunk = []
        if chunk:
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))


def _summary(values: Sequence[int]) -> dict:
    ordered = sorted(values)
    return {"total": sum(ordered), "mean": round(statistics.fmean(ordered), 2), "min": ordered[0],
            "p50": ordered[len(ordered) // 2], "p90": ordered[int(len(ordered) * 0.9)], "max": ordered[-1]}
