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

Lengths: each turn may add up to `max_new_tokens`, and never more than the room its prompt leaves
under `context` (the conversation's limit, e.g. the training length): the answer is cut there
(finish_reason "length"). A turn whose prompt alone fills the context ends the conversation.

Shards and resume: the batches are fixed (the sort is deterministic). Rank r of `world` processes
answers the unfinished batches b with b % world == r. Each finished batch is appended to the rank's
`<work>/completed-<r>.jsonl` as ONE line with its prompt indices, flushed and fsynced, so a kill loses at
most the batch in flight (a torn last line is discarded). A rerun, on any number of ranks, skips every
batch some file holds and regenerates the rest with the same batch composition and seeds; the final
file is assembled in prompt order from all files: the result equals an uninterrupted one-process run's.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from flashdraft.data.repetition import LOOP_WINDOW, LOOPED_WARNING, looped_tokens
from flashdraft.data.sampling import Sampling
from flashdraft.errors import UserError
from flashdraft.files import atomic_path

log = logging.getLogger(__name__)

COMPLETED_GLOB = "completed-*.jsonl"
WINDOW_BATCHES = 16


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
                  max_new_tokens: int, seed: int, context: int | None, turns: str,
                  on_tokens: Callable[[int], None]) -> list[dict]:
    """Regenerate the turns of a batch of conversations (all, or only the first); `on_tokens` hears of each
    round's new tokens. See the module docstring for the limit on each turn."""
    groups = [turn_groups(row["messages"]) for row in rows]
    if turns == "first":
        groups = [group[:1] for group in groups]
    histories: list[list[dict]] = [[] for _ in rows]
    answered: list[list[dict]] = [[] for _ in rows]
    ended = [False] * len(rows)
    for round_ in range(max(len(g) for g in groups)):
        active, prompts, limits = [], [], []
        for i, group in enumerate(groups):
            if ended[i] or round_ >= len(group):
                continue
            prompt = render(histories[i] + group[round_])
            limit = max_new_tokens if context is None else min(max_new_tokens, context - len(prompt))
            if limit < 1:
                ended[i] = True
                continue
            histories[i].extend(group[round_])
            active.append(i)
            prompts.append(prompt)
            limits.append(limit)
        if not active:
            break
        seeds = [seed * 1_000_003 + i * 1_009 + round_ for i in active]
        completions = generator.generate(prompts, sampling, limits, seeds)
        for i, prompt, completion in zip(active, prompts, completions):
            histories[i].append({"role": "assistant", "content": decode(completion.token_ids)})
            answered[i].append({"finish_reason": completion.finish_reason, "prompt_tokens": len(prompt),
                                "completion_tokens": len(completion.token_ids),
                                "looped_tokens": looped_tokens(completion.token_ids)})
        on_tokens(sum(len(c.token_ids) for c in completions))
    out = []
    for row, history, row_turns in zip(rows, histories, answered):
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


def completed_path(work: Path, rank: int) -> Path:
    """The file where rank `rank` appends its finished batches."""
    return work / COMPLETED_GLOB.replace("*", str(rank))


def read_completed(work: Path) -> dict[int, tuple[Path, int]]:
    """{batch index: (file, byte offset of its record)} of the finished batches of every rank; a torn last
    line of a file is cut off."""
    found: dict[int, tuple[Path, int]] = {}
    for path in sorted(work.glob(COMPLETED_GLOB)):
        good = 0
        with open(path, "rb") as handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break
                found.setdefault(record["batch"], (path, good))
                good += len(line)
        if good < path.stat().st_size:
            log.warning("discarding a torn record at the end of %s (%d bytes)", path, path.stat().st_size - good)
            with open(path, "r+b") as handle:
                handle.truncate(good)
    return found


def regenerate(
    prompts,
    *,
    tokenizer,
    generator,
    sampling: Sampling,
    max_new_tokens: int,
    work_dir: Path,
    batch_size: int,
    seed: int = 0,
    thinking: bool | None = None,
    context: int | None = None,
    turns: str = "all",
    rank: int = 0,
    world: int = 1,
) -> dict:
    """Answer this rank's share of the prompt rows (`id`, `source`, `messages`) with the target, into
    `work_dir` (see the module docstring). Returns this rank's throughput; `assemble` writes the dataset."""
    render = Renderer(tokenizer, thinking)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    work_dir.mkdir(parents=True, exist_ok=True)
    done = read_completed(work_dir)
    n_batches = -(-len(prompts) // batch_size)
    mine = [b for b in range(n_batches) if b % world == rank]

    def batch_rows(batch: int) -> int:
        return min(batch_size, len(prompts) - batch * batch_size)

    def batching_key(index: int) -> tuple[int, int, int]:
        groups = turn_groups(prompts[index]["messages"])
        return len(groups), len(render(groups[0])), index

    window_size = WINDOW_BATCHES * batch_size
    resumed = sum(batch_rows(b) for b in mine if b in done)
    generated = 0
    started = time.perf_counter()
    with (
        open(completed_path(work_dir, rank), "a", encoding="utf-8") as log_file,
        tqdm(total=sum(batch_rows(b) for b in mine), initial=resumed, desc=f"regenerate (rank {rank})",
             unit="sample", position=rank) as bar,
    ):
        def on_tokens(count: int) -> None:  # after every turn round, so long conversations show progress
            nonlocal generated
            generated += count
            bar.set_postfix(tok_s=f"{generated / (time.perf_counter() - started):.1f}")

        for start in range(0, len(prompts), window_size):
            first = start // batch_size
            window = range(first, min(first + WINDOW_BATCHES, n_batches))
            todo = [b for b in window if b % world == rank and b not in done]
            if not todo:
                continue
            order = sorted(range(start, min(start + window_size, len(prompts))), key=batching_key)
            for batch in todo:
                indices = order[(batch - first) * batch_size : (batch - first + 1) * batch_size]
                answered = _answer_batch([prompts[i] for i in indices], render, decode, generator, sampling,
                                         max_new_tokens, seed * 100_003 + batch, context, turns, on_tokens)
                record = {"batch": batch, "indices": indices, "rows": answered}
                log_file.write(json.dumps(record, ensure_ascii=False) + "\n")
                log_file.flush()
                os.fsync(log_file.fileno())
                bar.update(len(indices))
    seconds = time.perf_counter() - started
    return {"resumed_samples": resumed, "generated_tokens": generated, "seconds": round(seconds, 3),
            "tokens_per_second": round(generated / seconds, 2) if seconds > 0 and generated else None}


def assemble(work_dir: Path, path: Path, expected_ids: Sequence[str]) -> dict:
    """Write the finished batches of every rank as one dataset in prompt order (.jsonl or .parquet),
    atomically.

    Reads the batches one at a time and holds at most one window of rows (batches are length-sorted
    within a window), so memory does not grow with the dataset. Returns its stats.
    """
    records = read_completed(work_dir)
    expected = list(expected_ids)
    emitted = 0
    completion: list[int] = []
    prompt: list[int] = []
    looped: list[int | None] = []
    reasons: Counter = Counter()
    counts = {"samples": 0, "skipped_too_long": 0}

    def in_prompt_order():
        nonlocal emitted
        pending: dict[int, dict] = {}
        handles: dict[Path, object] = {}
        try:
            for batch in range(len(records)):
                if batch not in records:
                    raise RuntimeError(f"batch {batch} is missing from {work_dir}; rerun the same warmup to finish")
                file, offset = records[batch]
                handle = handles.get(file) or handles.setdefault(file, open(file, "rb"))
                handle.seek(offset)
                record = json.loads(handle.readline())
                for index, row in zip(record["indices"], record["rows"]):
                    if index >= len(expected) or row["id"] != expected[index] or index < emitted:
                        raise RuntimeError(f"{file} does not match the prompts; remove the output, rerun")
                    pending[index] = row
                while emitted in pending:
                    yield pending.pop(emitted)
                    emitted += 1
        finally:
            for handle in handles.values():
                handle.close()

    def rows():
        for row in in_prompt_order():
            if "skipped" in row:
                counts["skipped_too_long"] += 1
                continue
            counts["samples"] += 1
            for turn in row["turns"]:
                completion.append(turn["completion_tokens"])
                prompt.append(turn["prompt_tokens"])
                looped.append(turn.get("looped_tokens"))  # absent in batches an older version wrote
                reasons[turn["finish_reason"]] += 1
            yield row

    with atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            _write_parquet(rows(), tmp)
        else:
            with open(tmp, "w", encoding="utf-8") as out:
                out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows())
        if emitted < len(expected):
            raise RuntimeError(f"{work_dir} misses answers to some prompts; rerun the same warmup to finish")
        if not counts["samples"]:
            raise UserError("no prompt leaves room for an answer in the context (warmup.max_length, or the "
                            "target's context); raise warmup.max_length or use shorter prompts")
    if counts["skipped_too_long"]:
        log.warning("%d conversations skipped: their first prompt alone fills the context", counts["skipped_too_long"])
    looped_fraction = None if None in looped else round(sum(looped) / max(sum(completion), 1), 4)
    if looped_fraction is not None and looped_fraction > LOOPED_WARNING:
        log.warning("%.0f%% of the answer tokens repeat a %d-token run of the same answer verbatim: the target "
                    "loops at these sampling settings, so much of a draft's supervision would be repeats. Read "
                    "a few long answers; a higher warmup.temperature loops less", 100 * looped_fraction, LOOP_WINDOW)
    return {
        **counts,
        "turns": len(completion),
        "finish_reasons": dict(sorted(reasons.items())),
        "truncated_fraction": round(reasons.get("length", 0) / len(completion), 4),
        "looped_fraction": looped_fraction,
        "completion_tokens": _summary(completion),
        "prompt_tokens": _summary(prompt),
    }


def _parquet_schema():
    import pyarrow as pa

    turn = pa.struct([("finish_reason", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
                      ("looped_tokens", pa.int64())])
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
