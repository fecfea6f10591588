"""Chat datasets by name: local files, hub datasets and packaged offline sources -> Arrow rows of `messages`.

A dataset spec is one string; a list of specs is a mixture.

    SPEC    := SOURCE [ "@" WEIGHT ]
    SOURCE  := FILE                         a local .jsonl / .json / .parquet file
             | "packaged:" NAME             packaged, offline (flashdraft.data.packaged): reasoning_gym |
                                            stdlib_code | word_problems | chitchat | sharegpt
             | ORG "/" NAME [ "/" CONFIG ] [ ":" SPLIT ]     a hub dataset (split defaults to train)

Examples: `prompts.jsonl`, `packaged:chitchat@0.3`, `HuggingFaceH4/ultrachat_200k:train_sft`,
`nvidia/Nemotron-Post-Training-Dataset-v2:chat@0.5`, `org/name/config:test`, `org/name:train[:10%]`
(a hub split takes `datasets`' slice syntax).

Every row comes out as `{"id", "source", "messages"}` with OpenAI-style messages (`role` in system /
user / assistant, `content` a string): the formats of `flashdraft.data.formats`, detected row by row
(`format="auto"`) or forced. A row that is no conversation is an error naming the file and row, or, with
`skip_bad_rows`, dropped and counted.

Everything stays in Arrow: files load through `datasets.load_dataset` (memory-mapped), hub datasets with
a limit stream, rows are normalised with `.map(num_proc=...)`, and subsets and mixtures are index
selections. Peak memory does not grow with the number of rows.

Mixtures: either no spec carries a weight (the sources are concatenated, so each counts with its size)
or all do (each source gets the share WEIGHT / sum of weights). With a `limit` the mixture has `limit`
rows, split by share with largest-remainder rounding; without one it is as large as it can be without
repeating a row. The rows of each source are a seeded random subset (all rows if it is used whole); a
single source keeps its own order, a mixture is interleaved in a seeded random order. The same specs,
split, limit and seed always give the same dataset, in any process.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from flashdraft.data import formats, packaged
from flashdraft.data.formats import EXPECTED_DROPS, FORMATS, BadRow
from flashdraft.errors import UserError

log = logging.getLogger(__name__)

PACKAGED_PREFIX = "packaged:"
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
SPLITS = ("train", "eval")
# Rows per source above which normalising and tokenising use several processes (when not set).
PARALLEL_ROWS = 20_000
HUB_SHUFFLE_BUFFER = 10_000

_HUB = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?:/(?P<config>[\w.-]+))?(?::(?P<split>[\w.\[\]%:-]+))?$")
CHAT_FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "source": datasets.Value("string"),
    "messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
})
_NORMALISED = datasets.Features({**CHAT_FEATURES, "bad": datasets.Value("string"), "bad_kind": datasets.Value("string")})


@dataclass(frozen=True)
class DatasetSpec:
    """One parsed spec: `kind` is file, packaged or hub."""

    text: str
    kind: str
    name: str
    config: str | None = None
    split: str | None = None
    weight: float | None = None


def parse_spec(text: str) -> DatasetSpec:
    """Parse one dataset spec (see the module docstring); a UserError names what is wrong."""
    spec = text.strip()
    weight = None
    if "@" in spec:
        spec, _, raw = spec.rpartition("@")
        try:
            weight = float(raw)
        except ValueError:
            raise UserError(f"dataset spec {text!r}: weight {raw!r} after '@' is not a number") from None
        if not (weight > 0 and math.isfinite(weight)):
            raise UserError(f"dataset spec {text!r}: weight must be a positive number, got {raw}")
    if not spec:
        raise UserError("empty dataset spec; give a .jsonl/.json/.parquet file, packaged:NAME or org/name")
    if spec.startswith(PACKAGED_PREFIX):
        name = spec[len(PACKAGED_PREFIX) :]
        if name not in packaged.PACKAGED:
            raise UserError(f"unknown packaged dataset {name!r}; known: {', '.join(packaged.PACKAGED)}")
        return DatasetSpec(text, "packaged", name, weight=weight)
    if spec.endswith(FILE_SUFFIXES) or Path(spec).expanduser().exists():
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UserError(f"dataset file {spec!r} does not exist")
        if not spec.endswith(FILE_SUFFIXES):
            raise UserError(f"dataset file {spec!r} must end in {', '.join(FILE_SUFFIXES)}")
        return DatasetSpec(text, "file", str(path), weight=weight)
    match = _HUB.match(spec)
    if not match:
        raise UserError(
            f"dataset spec {text!r} is neither an existing file, packaged:NAME, nor a hub id "
            "org/name[/config][:split]"
        )
    return DatasetSpec(text, "hub", match["repo"], match["config"], match["split"] or "train", weight=weight)


def load_chat_dataset(
    spec: str | Sequence[str],
    split: str = "train",
    limit: int | None = None,
    seed: int = 0,
    *,
    format: str = "auto",
    skip_bad_rows: bool = False,
    num_proc: int | None = None,
    dropped: Counter | None = None,
) -> datasets.Dataset:
    """Rows `{"id", "source", "messages"}` for one spec or a mixture (see the module docstring).

    `split` picks the partition of the packaged sources ("train" or "eval"; see `packaged.EVAL_SPLIT_SOURCES`).
    Files and hub datasets are used as the spec names them. Dropped rows are counted by reason into
    `dropped` when given.
    """
    if split not in SPLITS:
        raise UserError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if limit is not None and limit < 1:
        raise UserError(f"limit must be a positive number of rows, got {limit}")
    if format != "auto" and format not in FORMATS:
        raise UserError(f"data.format must be auto or one of {', '.join(FORMATS)}, got {format!r}")
    texts = [spec] if isinstance(spec, str) else list(spec)
    if not texts:
        raise UserError("no dataset spec given")
    specs = [parse_spec(t) for t in texts]
    weighted = [s.weight is not None for s in specs]
    if any(weighted) and not all(weighted):
        raise UserError("give a weight (@W) to every spec of a mixture or to none: " + ", ".join(texts))
    if split == "eval":
        bad = [s.text for s in specs if not (s.kind == "packaged" and s.name in packaged.EVAL_SPLIT_SOURCES)]
        if bad:
            names = ", ".join(PACKAGED_PREFIX + n for n in packaged.EVAL_SPLIT_SOURCES)
            raise UserError(f"only {names} have an eval split; {', '.join(bad)} are used as their spec names them")
    counts = Counter() if dropped is None else dropped
    reader = _Reader(format, skip_bad_rows, num_proc, counts)
    sources = [reader.open(s, split, seed, limit) for s in specs]
    shares = _shares(sources, limit, all(weighted))
    parts = [source.take(count, [seed, index]) for index, (source, count) in enumerate(zip(sources, shares))]
    rows = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(parts) > 1:
        rows = rows.select(np.random.default_rng([seed, len(parts), 7]).permutation(len(rows)))
    if len(rows) == 0:
        raise UserError(f"dataset {', '.join(texts)} has no rows")
    return rows


def normalize_messages(row: dict, where: str) -> list[dict]:
    """OpenAI messages from a row in any of the accepted formats; a UserError says which row is bad."""
    try:
        return formats.to_messages(row, _row_format(row))
    except BadRow as err:
        raise UserError(f"{where}: {err}") from None


def chitchat_eval_prompts(limit: int | None = None, turns: int = 1) -> list[list[dict]]:
    """Chat prompts from the EVAL split of `packaged:chitchat`, in sorted-key order.

    Each prompt holds a conversation's first `turns` user turns with the human replies between them,
    so it ends with a user turn for the model to answer. Conversations with fewer user turns are
    skipped. These conversations never appear in training or warmup data.
    """
    if turns < 1:
        raise UserError(f"turns must be at least 1, got {turns}")
    prompts: list[list[dict]] = []
    for _, messages in packaged.chitchat_conversations("eval"):
        user_seen = 0
        for end, message in enumerate(messages):
            user_seen += message["role"] == "user"
            if user_seen == turns and message["role"] == "user":
                prompts.append(messages[: end + 1])
                break
        if limit is not None and len(prompts) == limit:
            break
    return prompts


def _row_format(row: dict) -> str:
    """The format of one row, by which of the keys it actually holds (a file may mix layouts)."""
    return formats.detect_format(key for key, value in row.items() if value is not None)


class _Source:
    """`size` rows; `take(count, seed)` is a seeded subset of `count` of them (all when count == size)."""

    def __init__(self, spec: DatasetSpec, size: int, take: Callable[[int, list[int]], datasets.Dataset]):
        self.spec, self.size, self._take = spec, size, take

    def take(self, count: int, seed: list[int]) -> datasets.Dataset:
        return self._take(count, seed)


def _subset(rows: datasets.Dataset, count: int, seed: list[int]) -> datasets.Dataset:
    """`count` rows chosen by `seed`, in their original order."""
    if count == len(rows):
        return rows
    chosen = np.random.default_rng(seed).choice(len(rows), size=count, replace=False)
    return rows.select(np.sort(chosen))


@dataclass
class _Reader:
    format: str
    skip_bad_rows: bool
    num_proc: int | None
    dropped: Counter

    def open(self, spec: DatasetSpec, split: str, seed: int, limit: int | None) -> _Source:
        if spec.kind == "packaged":
            return self._packaged(spec, split, seed, limit)
        raw = _read_file(spec) if spec.kind == "file" else _read_hub(spec, limit, seed)
        rows = self._normalise(raw, spec)
        return _Source(spec, len(rows), lambda count, pick: _subset(rows, count, pick))

    def _packaged(self, spec: DatasetSpec, split: str, seed: int, limit: int | None) -> _Source:
        make_rows, generated = packaged.PACKAGED[spec.name]
        if split == "eval" and spec.name not in packaged.EVAL_SPLIT_SOURCES:
            raise UserError(f"packaged:{spec.name} has no eval split")

        def build(count: int) -> datasets.Dataset:
            return _generated(make_rows, spec, split=split, seed=seed, count=count)

        if generated:
            return _Source(spec, max(packaged.GENERATED_SIZE, limit or 0), lambda count, pick: build(count))
        rows = build(0)
        return _Source(spec, len(rows), lambda count, pick: _subset(rows, count, pick))

    def _normalise(self, raw: datasets.Dataset, spec: DatasetSpec) -> datasets.Dataset:
        where = spec.name if spec.kind == "file" else f"{spec.name} {spec.split}"
        prefix = Path(spec.name).name if spec.kind == "file" else f"{spec.name}:{spec.split}"
        workers = self.num_proc if self.num_proc is not None else (min(8, _cpus()) if len(raw) >= PARALLEL_ROWS else None)
        normalised = raw.map(
            _normalise_batch, batched=True, with_indices=True, remove_columns=raw.column_names,
            features=_NORMALISED, num_proc=workers, desc=f"normalise {spec.text}",
            fn_kwargs={"format": self.format, "source": spec.text, "prefix": prefix},
        )
        bad = normalised.filter(lambda kind: kind != "", input_columns="bad_kind")
        if len(bad):
            errors = [(kind, text) for kind, text in zip(bad["bad_kind"], bad["bad"]) if kind not in EXPECTED_DROPS]
            if errors and not self.skip_bad_rows:
                raise UserError(
                    f"{where} {errors[0][1]} ({len(errors)} bad row(s) in all); fix the data, or set "
                    "data.skip_bad_rows=true to drop such rows and count them"
                )
            self.dropped.update(kind for kind in bad["bad_kind"])
            log.warning("%s: dropped %d rows (%s)", where, len(bad), dict(Counter(bad["bad_kind"])))
            normalised = normalised.filter(lambda kind: kind == "", input_columns="bad_kind")
        if len(normalised) == 0:
            raise UserError(f"dataset {spec.text} has no usable rows")
        return normalised.remove_columns(["bad", "bad_kind"])


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _normalise_batch(batch: dict, indices: list[int], *, format: str, source: str, prefix: str) -> dict:
    out: dict[str, list] = {"id": [], "source": [], "messages": [], "bad": [], "bad_kind": []}
    columns = list(batch)
    for position, index in enumerate(indices):
        row = {key: batch[key][position] for key in columns}
        try:
            messages = formats.to_messages(row, _row_format(row) if format == "auto" else format)
            bad, kind = "", ""
        except (BadRow, UserError) as err:
            messages, bad = [], f"row {index + 1}: {err}"
            kind = err.kind if isinstance(err, BadRow) else "unknown_format"
        out["id"].append(f"{prefix}:{index}")
        out["source"].append(source)
        out["messages"].append(messages)
        out["bad"].append(bad)
        out["bad_kind"].append(kind)
    return out


def _generated(make_rows: Callable, spec: DatasetSpec, *, split: str, seed: int, count: int) -> datasets.Dataset:
    """A packaged source's rows as an Arrow dataset, cached by datasets under a fingerprint of everything
    that decides them (the generating code included, so a changed template is never served stale)."""
    code = hashlib.sha256((inspect.getsource(packaged) + inspect.getsource(packaged.word_problem)).encode())
    key = json.dumps([spec.name, spec.text, split, seed, count, code.hexdigest()])
    return datasets.Dataset.from_generator(
        _packaged_generator, features=CHAT_FEATURES, fingerprint=hashlib.sha256(key.encode()).hexdigest()[:32],
        gen_kwargs={"name": spec.name, "source": spec.text, "split": split, "seed": seed, "count": count},
    )


def _packaged_generator(name: str, source: str, split: str, seed: int, count: int):
    make_rows, _ = packaged.PACKAGED[name]
    for row in make_rows(split, seed, count):
        yield {**row, "source": source}


def _read_file(spec: DatasetSpec) -> datasets.Dataset:
    path = Path(spec.name)
    if path.stat().st_size == 0 or (path.suffix != ".parquet" and not _first_text(path).strip()):
        raise UserError(f"dataset file {path} is empty; it needs one chat per row")
    builder = "parquet" if path.suffix == ".parquet" else "json"
    try:
        rows = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as err:  # pyarrow and datasets raise many types for a broken file
        problem = _json_problem(path) if builder == "json" else None
        raise UserError(problem or (
            f"cannot read {path}: {_root_cause(err)}. If its rows disagree on the type of a field (a string in "
            "one row, a number or list in another), make each field one type in every row")) from err
    # datasets wraps JSON values that are not objects into a "text" column: say what is wrong instead.
    if builder == "json" and rows.column_names == ["text"] and (problem := _json_problem(path)):
        raise UserError(problem)
    if len(rows) == 0:
        raise UserError(f"dataset file {path} is empty; it needs one chat per row")
    return rows


def _first_text(path: Path, size: int = 4096) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read(size)
        while text and not text.strip():
            more = handle.read(size)
            if not more:
                break
            text = more
        return text


def _json_problem(path: Path) -> str | None:
    """What makes a JSON (lines) file unreadable as rows of objects: its first bad line or row, if any."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        if path.suffix == ".json" and _first_text(path).lstrip().startswith("["):
            try:
                items = enumerate(json.load(handle), start=1)
            except json.JSONDecodeError as err:
                return f"{path} is not valid JSON ({err}); give a JSON list of rows or JSON lines"
            unit = "row"
        else:
            items = ((number, line) for number, line in enumerate(handle, start=1) if line.strip())
            unit = "line"
        for number, item in items:
            if unit == "line":
                try:
                    item = json.loads(item)
                except json.JSONDecodeError as err:
                    return f"{path} line {number} is not valid JSON: {err}"
            if not isinstance(item, dict):
                return f"{path} {unit} {number}: expected a JSON object, got {type(item).__name__}"
    return None


def _root_cause(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {err}"


def _read_hub(spec: DatasetSpec, limit: int | None, seed: int) -> datasets.Dataset:
    try:
        if limit is None:
            return datasets.load_dataset(spec.name, spec.config, split=spec.split)
        # A limit reads only a seeded, shuffled window of the stream, never the whole split.
        stream = datasets.load_dataset(spec.name, spec.config, split=spec.split, streaming=True)
        window = stream.shuffle(seed=seed, buffer_size=HUB_SHUFFLE_BUFFER).take(limit)
        key = json.dumps([spec.text, spec.config, spec.split, limit, seed])
        return datasets.Dataset.from_generator(_stream_rows, gen_kwargs={"stream": window},
                                               fingerprint=hashlib.sha256(key.encode()).hexdigest()[:32])
    except Exception as err:  # network, auth, missing split: all mean "cannot read this dataset"
        raise UserError(
            f"cannot load hub dataset {spec.name!r} (config {spec.config}, split {spec.split}): "
            f"{type(err).__name__}: {err}. Offline? Save it as .jsonl/.parquet where you can reach the "
            "hub and pass the file, or use a packaged: source"
        ) from err


def _stream_rows(stream):
    yield from stream


def _shares(sources: list[_Source], limit: int | None, weighted: bool) -> list[int]:
    """Rows taken from each source (see the module docstring for the rule)."""
    if not weighted:
        sizes = [s.size for s in sources]
        total = sum(sizes)
        if limit is None or limit >= total:
            return sizes
        weights = [float(size) for size in sizes]
    else:
        weights = [s.spec.weight for s in sources]
    total_weight = sum(weights)
    if limit is None:
        limit = min(math.floor(s.size * total_weight / w + 1e-9) for s, w in zip(sources, weights))
    exact = [limit * w / total_weight for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: limit - sum(counts)]:
        counts[i] += 1
    for source, count in zip(sources, counts):
        if count > source.size:
            raise UserError(
                f"{source.spec.text} has {source.size} rows but its share of the {limit}-row mixture is "
                f"{count}; lower its weight or the limit"
            )
    return counts
