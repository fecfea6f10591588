"""Tokenised chat data and the step-indexed batch plan: shuffle per epoch, shard per rank, resume by step.

The loader has no iterator state: the samples of global step s are a pure function of (seed, s), so
resuming at step s needs only s. Every optimizer step takes `global_batch = micro x accum x world` rows
of the epoch's permutation; rank r's micro-step m takes the slice starting at (m * world + r) * micro.
A sample draws the same anchors however a step is split (anchors are seeded by its dataset index).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import datasets
import torch

from flashdraft.config import DataConfig
from flashdraft.data import Batch
from flashdraft.data.chat import check_tokenizer, tokenize_chat
from flashdraft.data.sources import load_chat_dataset
from flashdraft.errors import UserError

log = logging.getLogger(__name__)


def load_rows(spec: str | Sequence[str], *, limit: int | None = None, seed: int = 0) -> datasets.Dataset:
    """Chat rows (`messages`) for dataset spec(s): local jsonl/parquet, hub ids, packaged sources."""
    return load_chat_dataset(spec, split="train", limit=limit, seed=seed)


def tokenize_rows(
    rows: datasets.Dataset, tokenizer, *, max_length: int, min_supervised: int, name: str
) -> datasets.Dataset:
    """Columns input_ids / loss_mask; drops samples with fewer than `min_supervised` supervised tokens.

    Raises UserError when no row has an assistant turn or every row is dropped.
    """
    check_tokenizer(tokenizer)
    has_assistant = sum(any(m["role"] == "assistant" for m in msgs) for msgs in rows["messages"])
    if has_assistant == 0:
        raise UserError(
            f"dataset {name} has no assistant turns, so there is nothing to learn from; give conversations "
            "with assistant replies (e.g. the output of `flashdraft warmup`, which regenerates them)"
        )

    def encode(batch: dict) -> dict:
        out: dict[str, list] = {"input_ids": [], "loss_mask": [], "num_supervised": []}
        for messages in batch["messages"]:
            ids, mask = tokenize_chat(tokenizer, messages, max_length)
            out["input_ids"].append(ids)
            out["loss_mask"].append(mask)
            out["num_supervised"].append(sum(mask))
        return out

    workers = min(8, os.cpu_count() or 1) if len(rows) >= 20_000 else None
    tokenized = rows.map(
        encode, batched=True, remove_columns=rows.column_names, num_proc=workers, desc=f"tokenise {name}"
    )
    kept = tokenized.filter(lambda n: n >= min_supervised, input_columns="num_supervised")
    if len(kept) == 0:
        raise UserError(
            f"all {len(rows)} samples of {name} have fewer than {min_supervised} supervised (assistant) tokens "
            f"after truncation to data.max_length={max_length}; raise data.max_length or use longer replies"
        )
    log.info("%s: %d of %d samples kept (>= %d supervised tokens)", name, len(kept), len(rows), min_supervised)
    return kept.with_format("torch", columns=["input_ids", "loss_mask"])


def prepare_datasets(
    data: DataConfig, tokenizer, *, min_supervised: int, cache_dir: Path, is_main: bool, barrier
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Train and eval sets, tokenised once by the main process into `cache_dir`, then read by all ranks.

    The cache key covers the data config, the tokenizer and `min_supervised`, so a resumed run skips
    tokenisation and a changed config tokenises again.
    """
    key_source = json.dumps(
        [vars(data), tokenizer.name_or_path, len(tokenizer), tokenizer.chat_template, min_supervised],
        sort_keys=True,
        default=str,
    )
    folder = cache_dir / hashlib.sha256(key_source.encode()).hexdigest()[:16]
    if is_main and not (folder / "done").exists():
        train_rows = load_rows(data.train, limit=data.limit, seed=data.seed)
        if data.eval is not None:
            eval_rows = load_rows(data.eval, seed=data.seed)
        elif data.eval_samples:
            if data.eval_samples >= len(train_rows):
                raise UserError(
                    f"data.eval_samples={data.eval_samples} leaves no training rows of {len(train_rows)}; "
                    "lower it or give data.eval"
                )
            split = train_rows.train_test_split(test_size=data.eval_samples, seed=data.seed, shuffle=True)
            train_rows, eval_rows = split["train"], split["test"]
        else:
            eval_rows = None
        sets = {"train": tokenize_rows(train_rows, tokenizer, max_length=data.max_length,
                                       min_supervised=min_supervised, name=f"data.train {data.train}")}
        if eval_rows is not None:
            sets["eval"] = tokenize_rows(eval_rows, tokenizer, max_length=data.max_length,
                                         min_supervised=min_supervised, name="data.eval")
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        for name, dataset in sets.items():
            dataset.save_to_disk(str(tmp / name))
        (tmp / "done").write_text("")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    barrier()
    if not (folder / "done").exists():
        raise UserError(f"tokenised data not found at {folder}; the output dir must be shared by all nodes")
    train = datasets.load_from_disk(str(folder / "train")).with_format("torch", columns=["input_ids", "loss_mask"])
    eval_path = folder / "eval"
    evaluation = (
        datasets.load_from_disk(str(eval_path)).with_format("torch", columns=["input_ids", "loss_mask"])
        if eval_path.exists()
        else None
    )
    return train, evaluation


def collate(rows: list[dict], sample_ids: list[int], pad_id: int, pad_to_multiple: int) -> Batch:
    """Right-pad rows to the longest (rounded up to `pad_to_multiple`)."""
    longest = max(len(r["input_ids"]) for r in rows)
    length = -(-longest // pad_to_multiple) * pad_to_multiple
    n = len(rows)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros(n, length, dtype=torch.long)
    loss_mask = torch.zeros(n, length, dtype=torch.bool)
    for i, row in enumerate(rows):
        size = len(row["input_ids"])
        ids[i, :size] = row["input_ids"]
        attention[i, :size] = 1
        loss_mask[i, :size] = row["loss_mask"]
    return Batch(ids, attention, loss_mask, torch.tensor(sample_ids, dtype=torch.long))


class StepLoader:
    """The micro-batches of one rank for any global step (see the module docstring)."""

    def __init__(
        self,
        dataset: datasets.Dataset,
        *,
        micro_batch: int,
        accum: int,
        rank: int,
        world: int,
        seed: int,
        pad_id: int,
        pad_to_multiple: int = 1,
    ):
        self.dataset = dataset
        self.micro, self.accum, self.rank, self.world = micro_batch, accum, rank, world
        self.seed, self.pad_id, self.pad_to_multiple = seed, pad_id, pad_to_multiple
        self.global_batch = micro_batch * accum * world
        self.steps_per_epoch = len(dataset) // self.global_batch
        if self.steps_per_epoch == 0:
            raise UserError(
                f"the training set has {len(dataset)} usable samples, fewer than one global batch "
                f"({micro_batch} micro x {accum} accumulation x {world} ranks = {self.global_batch}); "
                "use more data or a smaller train.micro_batch_size / train.grad_accum_steps"
            )
        self._epoch, self._order = -1, None

    def order(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(len(self.dataset), generator=gen)
        return self._order

    def position(self, step: int) -> dict[str, int]:
        """Where global step `step` reads (stored in checkpoints)."""
        return {"epoch": step // self.steps_per_epoch, "step_in_epoch": step % self.steps_per_epoch,
                "samples": len(self.dataset), "global_batch": self.global_batch}

    def micro_batches(self, step: int) -> list[Batch]:
        """This rank's `accum` micro-batches of global step `step` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self.order(epoch)
        start = within * self.global_batch
        out = []
        for m in range(self.accum):
            first = start + (m * self.world + self.rank) * self.micro
            ids = order[first : first + self.micro].tolist()
            out.append(collate([self.dataset[i] for i in ids], ids, self.pad_id, self.pad_to_multiple))
        return out


def eval_batches(dataset: datasets.Dataset, *, micro_batch: int, rank: int, world: int, pad_id: int,
                 pad_to_multiple: int = 1) -> list[Batch]:
    """This rank's share of the eval set: samples rank, rank + world, ... so that the ranks together see
    every sample once and the eval numbers do not depend on the number of GPUs. Every rank runs the same
    number of batches (sharded models run collectives in every forward): a rank one sample short gets a
    blank row, a copy of a sample with nothing supervised, which adds nothing to the sums."""
    if len(dataset) == 0:
        return []
    per_rank = -(-len(dataset) // world)
    ids = list(range(rank, len(dataset), world))
    rows = [dataset[i] for i in ids]
    if len(rows) < per_rank:
        blank = dataset[0]
        rows.append({"input_ids": blank["input_ids"], "loss_mask": torch.zeros(len(blank["input_ids"]), dtype=torch.bool)})
        ids.append(0)
    return [
        collate(rows[s : s + micro_batch], ids[s : s + micro_batch], pad_id, pad_to_multiple)
        for s in range(0, per_rank, micro_batch)
    ]
