"""Dataset specs -> chat rows: formats, mixtures, the packaged sources and their splits, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import datasets
import pytest

from flashdraft.data import packaged
from flashdraft.data.sources import chitchat_eval_prompts, load_chat_dataset, parse_spec
from flashdraft.errors import UserError


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _chat(i):
    return {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}


def test_parse_spec_syntax(tmp_path):
    hub = parse_spec("nvidia/Nemotron-Post-Training-Dataset-v2:chat@0.5")
    assert (hub.kind, hub.name, hub.config, hub.split, hub.weight) == (
        "hub", "nvidia/Nemotron-Post-Training-Dataset-v2", None, "chat", 0.5)
    cfg = parse_spec("org/name/cfg:test")
    assert (cfg.name, cfg.config, cfg.split, cfg.weight) == ("org/name", "cfg", "test", None)
    assert parse_spec("org/name").split == "train"
    assert parse_spec("org/name:train[:10%]@2").split == "train[:10%]"
    local = parse_spec(_write_jsonl(tmp_path / "a.jsonl", [_chat(0)]) + "@2")
    assert (local.kind, local.weight) == ("file", 2.0)
    assert parse_spec("packaged:chitchat").kind == "packaged"
    for bad, needle in [("x.jsonl", "does not exist"), ("packaged:nope", "unknown packaged"),
                        ("org/name@zero", "not a number"), ("org/name@-1", "positive"), ("", "empty")]:
        with pytest.raises(UserError, match=needle):
            parse_spec(bad)


def test_file_formats_agree(tmp_path):
    rows = [_chat(i) for i in range(5)]
    jsonl = _write_jsonl(tmp_path / "d.jsonl", rows)
    (tmp_path / "d.json").write_text(json.dumps(rows))
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    loaded = [load_chat_dataset(p)["messages"] for p in (jsonl, str(tmp_path / "d.json"), str(tmp_path / "d.parquet"))]
    assert loaded[0] == loaded[1] == loaded[2] == [r["messages"] for r in rows]


def test_other_layouts_become_messages(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "h"},
                           {"from": "gpt", "value": "g"}]},
        {"instruction": "do it", "output": "done"},
        {"prompt": "just a prompt"},
    ])
    assert load_chat_dataset(path)["messages"] == [
        [{"role": "system", "content": "s"}, {"role": "user", "content": "h"}, {"role": "assistant", "content": "g"}],
        [{"role": "user", "content": "do it"}, {"role": "assistant", "content": "done"}],
        [{"role": "user", "content": "just a prompt"}],
    ]


@pytest.mark.parametrize("content, needle", [
    ("", "is empty"),
    ("\n\n", "is empty"),
    ('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n', "line 2 is not valid JSON"),
    ('{"text": "hello"}\n', "row 1: no conversation format fits the columns text"),
    ('{"messages": [{"role": "robot", "content": "x"}]}\n', "role 'robot'"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}\n', "no user turn"),
    ('{"messages": [{"role": "user", "content": 3}]}\n', "must be a string"),
    ("[1, 2]\n", "expected a JSON object"),
])
def test_malformed_files_name_the_problem(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=needle):
        load_chat_dataset(str(path))


def test_limit_and_weights_are_deterministic(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", [_chat(i) for i in range(40)])
    b = _write_jsonl(tmp_path / "b.jsonl", [_chat(100 + i) for i in range(40)])
    mix = load_chat_dataset([a + "@3", b + "@1"], limit=20, seed=7)
    assert mix["id"] == load_chat_dataset([a + "@3", b + "@1"], limit=20, seed=7)["id"]
    assert mix["id"] != load_chat_dataset([a + "@3", b + "@1"], limit=20, seed=8)["id"]
    from_a = sum(i.startswith("a.jsonl") for i in mix["id"])
    assert (len(mix), from_a, len(set(mix["id"]))) == (20, 15, 20)
    # Without a limit: as large as possible with no repeats (b's 40 rows are a quarter of 160).
    assert len(load_chat_dataset([a + "@3", b + "@1"])) == 53  # a limits it: 40 / 0.75
    assert len(load_chat_dataset([a, b])) == 80
    one = load_chat_dataset(a, limit=10, seed=1)["id"]
    assert one == sorted(one, key=lambda i: int(i.split(":")[1]))  # a subset keeps the file order
    with pytest.raises(UserError, match="to every spec of a mixture or to none"):
        load_chat_dataset([a + "@1", b])
    with pytest.raises(UserError, match="lower its weight or the limit"):
        load_chat_dataset([a + "@1", b + "@1"], limit=100)


def test_chitchat_train_and_eval_split():
    train = load_chat_dataset("packaged:chitchat")
    evaluation = load_chat_dataset("packaged:chitchat", split="eval")
    keys = sorted(packaged.chitchat_conversations("train") + packaged.chitchat_conversations("eval"))
    assert not set(train["id"]) & set(evaluation["id"])
    assert len(train) + len(evaluation) == len(keys) > 7000
    positions = {key: i for i, key in enumerate(sorted(k for k, _ in keys))}
    assert all(positions[i.removeprefix("chitchat/")] % 10 == 0 for i in evaluation["id"])
    for messages in train["messages"][:200]:
        roles = [m["role"] for m in messages]
        assert roles[0] == "user" and all(r != s for r, s in zip(roles, roles[1:]))
    prompts = chitchat_eval_prompts(limit=5, turns=2)
    assert len(prompts) == 5
    assert all(p[-1]["role"] == "user" and sum(m["role"] == "user" for m in p) == 2 for p in prompts)
    eval_texts = {m["content"] for ms in evaluation["messages"] for m in ms}
    assert all(p[0]["content"] in eval_texts for p in prompts)
    with pytest.raises(UserError, match="only packaged:chitchat, packaged:word_problems, packaged:sharegpt have an eval split"):
        load_chat_dataset("packaged:reasoning_gym", split="eval")


def test_reasoning_gym_is_seeded_and_mixed():
    first = load_chat_dataset("packaged:reasoning_gym", limit=30, seed=3)
    assert first["messages"] == load_chat_dataset("packaged:reasoning_gym", limit=30, seed=3)["messages"]
    assert first["messages"] != load_chat_dataset("packaged:reasoning_gym", limit=30, seed=4)["messages"]
    tasks = {i.split("/")[1] for i in first["id"]}
    assert tasks == set(packaged.REASONING_GYM_TASKS) and "gsm_symbolic" not in tasks
    assert len({m[0]["content"] for m in first["messages"]}) == 30
    # a longer run starts with the same problems, so growing --num-samples keeps earlier prompts
    longer = load_chat_dataset("packaged:reasoning_gym", limit=45, seed=3)
    assert set(first["id"]) <= set(longer["id"])


def test_stdlib_code_prompts_are_stubs_disjoint_from_humaneval():
    import ast

    from flashdraft.decoding.benchmarks import load_benchmark

    rows = load_chat_dataset("packaged:stdlib_code", limit=200, seed=1)
    assert rows["messages"] == load_chat_dataset("packaged:stdlib_code", limit=200, seed=1)["messages"]
    assert rows["messages"] != load_chat_dataset("packaged:stdlib_code", limit=200, seed=2)["messages"]
    assert len(set(rows["id"])) == 200
    for (message,) in rows["messages"]:
        code = message["content"].split("```python\n", 1)[1].removesuffix("\n```")
        functions = [n for n in ast.walk(ast.parse(code)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        # exactly one public function, its body only the docstring: the answer has to write it
        assert len(functions) == 1 and not functions[0].name.startswith("_")
        assert len(functions[0].body) == 1 and ast.get_docstring(functions[0])
    stubs = "\n".join(stub for _, stub in packaged._stdlib_stubs())
    assert len(packaged._stdlib_stubs()) > 2000
    for (message,) in load_benchmark("humaneval").prompts:
        signature = next(line for line in message["content"].splitlines() if line.startswith("def "))
        assert signature not in stubs
    with pytest.raises(UserError, match="only packaged:chitchat, packaged:word_problems, packaged:sharegpt have an eval split"):
        load_chat_dataset("packaged:stdlib_code", split="eval")


def test_word_problems_are_whole_number_problems_disjoint_from_gsm8k():
    from flashdraft.data.word_problems import TEMPLATES, word_problem
    from flashdraft.decoding.benchmarks import load_benchmark

    # Every template, many draws: the story never goes negative and the answer is a whole number
    # (a template that let the pizza guests eat more slices than there are would fail here).
    for split in ("train", "eval"):
        for i in range(300 * len(TEMPLATES)):
            problem = word_problem(split, 0, i)
            assert type(problem.answer) is int and problem.answer > 0, problem
            assert not re.search(r"(?<![\w.])-\d", problem.question), problem  # no negative quantities
    train = load_chat_dataset("packaged:word_problems", limit=2000, seed=0)
    assert train["messages"] == load_chat_dataset("packaged:word_problems", limit=2000, seed=0)["messages"]
    assert {i.split("/")[-1] for i in train["id"][: len(TEMPLATES)]} == {str(i) for i in range(len(TEMPLATES))}
    assert {word_problem("train", 0, i).template for i in range(len(TEMPLATES))} == set(TEMPLATES)
    questions = {m[0]["content"] for m in train["messages"]}
    assert len(questions) > 1950  # names and numbers vary enough that repeats are rare
    evaluation = load_chat_dataset("packaged:word_problems", split="eval", limit=2000, seed=0)
    assert not questions & {m[0]["content"] for m in evaluation["messages"]}
    # a longer stream starts with the same problems
    assert load_chat_dataset("packaged:word_problems", limit=50, seed=0)["messages"] == train["messages"][:50]
    gsm8k = {m[0]["content"] for m in load_benchmark("gsm8k").prompts}
    assert not any(q in p for q in questions for p in gsm8k)


def test_unreachable_hub_dataset_offline(tmp_path):
    code = (
        "from flashdraft.data.sources import load_chat_dataset\n"
        "from flashdraft.errors import UserError\n"
        "try:\n    load_chat_dataset('no-such-org/no-such-dataset:train')\n"
        "except UserError as err:\n    print('USERERROR', err)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "USERERROR cannot load hub dataset 'no-such-org/no-such-dataset'" in out.stdout, out.stderr
    assert "Offline?" in out.stdout
