"""Training data, prepared once: sources -> normalised chats -> chat template -> tokens + loss masks, saved as
Arrow under a cache key, with statistics. `flashdraft prepare-data` and the trainer share this code and
this cache, so a CPU step can prepare what GPU nodes then only read.

    <cache_dir>/<key>/train/     the tokenised training set (input_ids, loss_mask, num_tokens, num_supervised,
                                 source)
    <cache_dir>/<key>/eval/      the held-out set, when there is one
    <cache_dir>/<key>/stats.json rows, tokens, supervised tokens, dropped rows by reason, rows per source,
                                 length percentiles
    <cache_dir>/<key>/done       written last: the entry is complete

The key covers everything that decides the result: the data settings, the tokenizer's vocabulary and
chat template, the minimum of supervised tokens and each data file's name and content (not its folder:
a copy staged elsewhere finds the same entry). A second run with the same inputs reuses the entry; a
changed tokenizer, template or file builds a new one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc

from flashdraft import files
from flashdraft.config import DataConfig
from flashdraft.data.chat import check_tokenizer, tokenize_chat
from flashdraft.data.sources import PARALLEL_ROWS, load_chat_dataset, parse_spec
from flashdraft.errors import UserError

log = logging.getLogger(__name__)

# Bumped when the prepared layout or the tokenisation changes, so old cache entries are not reused.
PREPARE_VERSION = 2
TORCH_COLUMNS = ["input_ids", "loss_mask"]
PERCENTILES = (50, 90, 99)
# data settings that do not change the prepared rows
_NOT_IN_KEY = {"pad_to_multiple", "num_proc", "cache_dir"}


@dataclass(frozen=True)
class PreparedData:
    train: datasets.Dataset
    eval: datasets.Dataset | None
    folder: Path
    stats: dict


def cache_key(data: DataConfig, tokenizer, min_supervised: int) -> str:
    settings = {k: v for k, v in vars(data).items() if k not in _NOT_IN_KEY | {"train", "eval"}}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocabulary = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    source = json.dumps(
        [PREPARE_VERSION, settings, _specs_key(data.train), _specs_key(data.eval),
         hashlib.sha256(vocabulary.encode()).hexdigest(), len(tokenizer), tokenizer.chat_template, min_supervised],
        sort_keys=True, default=str,
    )
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _specs_key(specs: str | list[str] | None) -> list:
    """What identifies the data of some specs: a file by its name, weight and content (so a copy of it
    elsewhere, e.g. staged onto a job's volume, has the same key), anything else by its spec."""
    if specs is None:
        return []
    key = []
    for text in [specs] if isinstance(specs, str) else specs:
        spec = parse_spec(text)
        if spec.kind == "file":
            path = Path(spec.name)
            key.append(["file", path.name, spec.weight, _file_sha256(str(path.resolve()), *_stamp(path))])
        else:
            key.append(text)
    return key


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.cache
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's bytes, remembered per (path, size, modification time) within a process."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def prepare_datasets(
    data: DataConfig,
    tokenizer,
    *,
    min_supervised: int,
    cache_dir: Path,
    is_main: bool = True,
    barrier: Callable[[], None] = lambda: None,
) -> PreparedData:
    """The train and eval sets, built by the main process into `cache_dir` (or found there), read by all.

    The cache folder must be shared by every process that calls this (all nodes of a job).
    """
    folder = Path(cache_dir) / cache_key(data, tokenizer, min_supervised)
    if is_main and not (folder / "done").exists():
        _build(data, tokenizer, min_supervised, folder)
    barrier()
    if not (folder / "done").exists():
        raise UserError(f"prepared data not found at {folder}; the cache folder must be shared by all nodes")
    train = datasets.load_from_disk(str(folder / "train")).with_format("torch", columns=TORCH_COLUMNS)
    evaluation = None
    if (folder / "eval").exists():
        evaluation = datasets.load_from_disk(str(folder / "eval")).with_format("torch", columns=TORCH_COLUMNS)
    return PreparedData(train, evaluation, folder, json.loads((folder / "stats.json").read_text()))


def _build(data: DataConfig, tokenizer, min_supervised: int, folder: Path) -> None:
    check_tokenizer(tokenizer)
    dropped: Counter = Counter()
    options = {"seed": data.seed, "format": data.format, "skip_bad_rows": data.skip_bad_rows, "num_proc": data.num_proc}
    train_rows = load_chat_dataset(data.train, limit=data.limit, dropped=dropped, **options)
    eval_rows = None
    if data.eval is not None:
        eval_rows = load_chat_dataset(data.eval, split="eval" if _packaged_eval(data.eval) else "train", **options)
    elif data.eval_samples:
        if data.eval_samples >= len(train_rows):
            raise UserError(
                f"data.eval_samples={data.eval_samples} leaves no training rows of {len(train_rows)}; "
                "lower it or give data.eval"
            )
        split = train_rows.train_test_split(test_size=data.eval_samples, seed=data.seed, shuffle=True)
        train_rows, eval_rows = split["train"], split["test"]
    sets = {"train": tokenize_rows(train_rows, tokenizer, data=data, min_supervised=min_supervised,
                                   name=f"data.train {data.train}", dropped=dropped)}
    if eval_rows is not None:
        sets["eval"] = tokenize_rows(eval_rows, tokenizer, data=data, min_supervised=min_supervised,
                                     name="data.eval", dropped=Counter())
    stats = {**split_stats(sets["train"]), "dropped": dict(sorted(dropped.items()))}
    if "eval" in sets:
        stats["eval"] = split_stats(sets["eval"])
    with files.atomic_dir(folder) as tmp:
        for name, dataset in sets.items():
            dataset.save_to_disk(str(tmp / name))
        files.write_json(tmp / "stats.json", stats)
        (tmp / "done").write_text("")
    log.info("prepared %d training rows (%d tokens, %d supervised) into %s", stats["rows"], stats["tokens"],
             stats["supervised_tokens"], folder)


def _packaged_eval(spec: str | list[str]) -> bool:
    """data.eval names packaged sources with an eval split: read that split (their train split is training data)."""
    from flashdraft.data.packaged import EVAL_SPLIT_SOURCES

    texts = [spec] if isinstance(spec, str) else spec
    parsed = [parse_spec(t) for t in texts]
    return all(p.kind == "packaged" and p.name in EVAL_SPLIT_SOURCES for p in parsed)


def tokenize_rows(
    rows: datasets.Dataset, tokenizer, *, data: DataConfig, min_supervised: int, name: str, dropped: Counter
) -> datasets.Dataset:
    """Columns input_ids / loss_mask / num_tokens / num_supervised / source; samples with fewer than
    `min_supervised` supervised tokens after truncation to data.max_length are dropped and counted."""
    workers = data.num_proc if data.num_proc is not None else (
        min(8, os.cpu_count() or 1) if len(rows) >= PARALLEL_ROWS else None)
    tokenized = rows.map(
        _encode_batch, batched=True, remove_columns=[c for c in rows.column_names if c != "source"],
        num_proc=workers, desc=f"tokenise {name}", fn_kwargs={"tokenizer": tokenizer, "max_length": data.max_length},
    )
    if not _column(tokenized, "has_reply").any():
        raise UserError(
            f"dataset {name} has no assistant turns, so there is nothing to learn from; give conversations "
            "with assistant replies (e.g. the output of `flashdraft warmup`, which regenerates them)"
        )
    kept = tokenized.filter(lambda n: n >= min_supervised, input_columns="num_supervised").remove_columns("has_reply")
    if len(kept) < len(tokenized):
        dropped["too_few_supervised_tokens"] += len(tokenized) - len(kept)
    if len(kept) == 0:
        raise UserError(
            f"all {len(rows)} samples of {name} have fewer than {min_supervised} supervised (assistant) tokens "
            f"after truncation to data.max_length={data.max_length}; raise data.max_length or use longer replies"
        )
    log.info("%s: %d of %d samples kept (>= %d supervised tokens)", name, len(kept), len(rows), min_supervised)
    return kept


def _encode_batch(batch: dict, *, tokenizer, max_length: int) -> dict:
    out: dict[str, list] = {"input_ids": [], "loss_mask": [], "num_tokens": [], "num_supervised": [], "has_reply": []}
    for messages in batch["messages"]:
        ids, mask = tokenize_chat(tokenizer, messages, max_length)
        out["has_reply"].append(any(m["role"] == "assistant" for m in messages))
        out["input_ids"].append(ids)
        out["loss_mask"].append(mask)
        out["num_tokens"].append(len(ids))
        out["num_supervised"].append(sum(mask))
    return out


def split_stats(rows: datasets.Dataset) -> dict:
    """Counts and length percentiles of a tokenised split, from its columns (no row is materialised)."""
    tokens, supervised = _column(rows, "num_tokens"), _column(rows, "num_supervised")
    counts = pc.value_counts(rows.with_format("arrow")["source"])
    sources = {str(item["values"]): int(item["counts"]) for item in counts.to_pylist()}
    return {
        "rows": len(rows),
        "tokens": int(tokens.sum()),
        "supervised_tokens": int(supervised.sum()),
        "per_source": dict(sorted(sources.items())),
        "tokens_per_row": _percentiles(tokens),
        "supervised_tokens_per_row": _percentiles(supervised),
    }


def _column(rows: datasets.Dataset, name: str) -> np.ndarray:
    # Through Arrow in one piece: `rows.with_format("numpy")[name]` is a lazy Column that numpy would read
    # row by row (minutes at millions of rows).
    return rows.with_format("arrow")[name].to_numpy()


def _percentiles(values: np.ndarray) -> dict:
    out = {f"p{p}": int(np.percentile(values, p, method="lower")) for p in PERCENTILES}
    return {"mean": round(float(values.mean()), 2), **out, "max": int(values.max())}
