"""Preparing training data: tokenising with drops and their counts, statistics, the cache shared by
`flashdraft prepare-data` and the trainer (reuse, and rebuilds on a changed tokenizer, template or file),
and determinism of mixtures in one process and over 2 gloo ranks."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import datasets
import pytest

from flashdraft.config import DataConfig
from flashdraft.data.prepare import prepare_datasets, tokenize_rows
from flashdraft.data.sources import load_chat_dataset
from flashdraft.errors import UserError
from tiny_models import CHAT, tiny_tokenizer


def tokenize(rows: datasets.Dataset, *, max_length: int, min_supervised: int, dropped: Counter | None = None):
    return tokenize_rows(rows, tiny_tokenizer(), data=DataConfig(max_length=max_length), min_supervised=min_supervised,
                         name="x", dropped=Counter() if dropped is None else dropped)


def rows_of(conversations) -> datasets.Dataset:
    return datasets.Dataset.from_list([{"messages": c, "source": "s"} for c in conversations])


def test_dataset_without_assistant_turns_is_an_error():
    rows = rows_of([[{"role": "user", "content": "hello"}]] * 3)
    with pytest.raises(UserError, match="no assistant turns"):
        tokenize(rows, max_length=64, min_supervised=8)


def test_all_samples_filtered_is_an_error():
    rows = rows_of([CHAT] * 3)
    with pytest.raises(UserError, match="fewer than 64 supervised"):
        tokenize(rows, max_length=512, min_supervised=64)
    # Truncation can also remove every reply.
    with pytest.raises(UserError, match="data.max_length=20"):
        tokenize(rows, max_length=20, min_supervised=2)


def test_short_samples_dropped_long_kept():
    long_reply = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "x" * 40}]
    rows = rows_of([CHAT, long_reply, CHAT])
    kept = tokenize(rows, max_length=512, min_supervised=32)
    assert len(kept) == 1 and sum(kept[0]["loss_mask"]) == 40 + 2  # + <|im_end|> and "\n"


def test_local_jsonl_and_parquet(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": CHAT, "extra": i}) + "\n" for i in range(5)))
    rows = load_chat_dataset(str(path))
    assert len(rows) == 5 and rows[0]["messages"][2]["content"] == "hello!"
    rows_of([CHAT] * 4).to_parquet(str(tmp_path / "chats.parquet"))
    assert len(load_chat_dataset(str(tmp_path / "chats.parquet"))) == 4


def chats(path, rows: int, offset: int = 0) -> str:
    lines = [{"messages": [{"role": "user", "content": f"question {offset + i}"},
                           {"role": "assistant", "content": "answer " * (1 + (offset + i) % 9)}]} for i in range(rows)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_stats_describe_the_prepared_rows(tmp_path):
    a, b = chats(tmp_path / "a.jsonl", 30), chats(tmp_path / "b.jsonl", 20, offset=100)
    (tmp_path / "bad.jsonl").write_text('{"messages": [{"role": "robot", "content": "x"}]}\n' + open(b).read())
    data = DataConfig(train=[a + "@2", str(tmp_path / "bad.jsonl") + "@1"], limit=24, max_length=64,
                      skip_bad_rows=True, eval_samples=4)
    prepared = prepare_datasets(data, tiny_tokenizer(), min_supervised=20, cache_dir=tmp_path / "cache")
    stats = prepared.stats
    train = prepared.train.with_format(None)
    assert stats == json.loads((prepared.folder / "stats.json").read_text())
    assert stats["rows"] == len(train) and stats["eval"]["rows"] == len(prepared.eval) == 4
    assert stats["tokens"] == sum(len(r["input_ids"]) for r in train)
    assert stats["supervised_tokens"] == sum(sum(r["loss_mask"]) for r in train)
    assert stats["per_source"] == dict(Counter(r["source"] for r in train))
    assert stats["dropped"]["bad_role"] == 1
    # "answer " x 1 is 7 supervised characters + the end marker: fewer than 20, dropped and counted
    assert stats["dropped"]["too_few_supervised_tokens"] == 24 - 4 - len(train)
    lengths = sorted(len(r["input_ids"]) for r in train)
    assert stats["tokens_per_row"]["max"] == lengths[-1] and stats["tokens_per_row"]["p50"] in lengths


def test_a_second_run_reuses_the_cache_and_changed_inputs_rebuild_it(tmp_path, monkeypatch):
    from flashdraft.data import prepare
    from tiny_models import CHATML

    path = chats(tmp_path / "c.jsonl", 12)
    data = DataConfig(train=path, max_length=64)
    first = prepare_datasets(data, tiny_tokenizer(), min_supervised=2, cache_dir=tmp_path / "cache")
    built, real_build = [], prepare._build
    monkeypatch.setattr(prepare, "_build", lambda *args: (built.append(args), real_build(*args)))
    again = prepare_datasets(data, tiny_tokenizer(), min_supervised=2, cache_dir=tmp_path / "cache")
    assert again.folder == first.folder and not built  # reused, nothing tokenised
    (tmp_path / "staged").mkdir()
    shutil.copy(path, tmp_path / "staged" / "c.jsonl")  # e.g. copied onto a training job's volume
    staged = DataConfig(train=str(tmp_path / "staged" / "c.jsonl"), max_length=64)
    assert prepare_datasets(staged, tiny_tokenizer(), min_supervised=2, cache_dir=tmp_path / "cache").folder == first.folder
    assert not built
    other_template = tiny_tokenizer(CHATML.replace("<|im_start|>", "<|im_start|> "))
    assert prepare_datasets(data, other_template, min_supervised=2, cache_dir=tmp_path / "cache").folder != first.folder
    other_vocab = tiny_tokenizer()
    other_vocab.add_tokens(["<|extra|>"])
    assert prepare_datasets(data, other_vocab, min_supervised=2, cache_dir=tmp_path / "cache").folder != first.folder
    chats(tmp_path / "c.jsonl", 13)  # the file changed
    rebuilt = prepare_datasets(data, tiny_tokenizer(), min_supervised=2, cache_dir=tmp_path / "cache")
    assert rebuilt.folder != first.folder and len(rebuilt.train) == 13
    assert len(built) == 3

