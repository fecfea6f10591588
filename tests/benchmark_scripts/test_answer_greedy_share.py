"""benchmarks/answer_greedy_share.py: the share of answer tokens that are the target's greedy choice."""

from __future__ import annotations

import json
import random
import string
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_config, tiny_tokenizer
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import answer_greedy_share  # noqa: E402

LETTERS = string.ascii_letters


@pytest.fixture(scope="module")
def letters_target(tmp_path_factory):
    """A tiny random target whose argmax is always an ASCII letter (the other tokens' head rows are zero,
    so their logits are 0 and a letter with a positive logit wins): its greedy answers are letters, which
    the byte-level tokenizer reads back as the same ids."""
    path = tmp_path_factory.mktemp("letters-target")
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen3"))
    letter_ids = tokenizer.convert_tokens_to_ids(list(LETTERS))
    with torch.no_grad():
        keep = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)
        keep[letter_ids] = True
        model.lm_head.weight[~keep] = 0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model.eval(), tokenizer


def greedy_answer(model, tokenizer, question: str, length: int) -> str:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                           tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer = []
    for _ in range(length):
        with torch.no_grad():
            token = int(model(torch.tensor([ids + answer])).logits[0, -1].argmax())
        answer.append(token)
    text = tokenizer.decode(answer)
    assert set(text) <= set(LETTERS)
    return text


def write_rows(path: Path, pairs: list[tuple[str, str]]) -> Path:
    rows = ({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in pairs)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(target: Path, answers: Path, out: Path, *sampling: str) -> dict:
    answer_greedy_share.main(["--target", str(target), "--answers", str(answers), "--samples", "8",
                              "--sampling", *sampling, "--out", str(out)])
    return json.loads(out.read_text())


def test_greedy_answers_score_near_one_and_random_answers_near_chance(letters_target, tmp_path):
    path, model, tokenizer = letters_target
    questions = [f"question {i}" for i in range(4)]
    greedy = write_rows(tmp_path / "greedy.jsonl", [(q, greedy_answer(model, tokenizer, q, 24)) for q in questions])
    rng = random.Random(0)
    noise = write_rows(tmp_path / "noise.jsonl",
                       [(q, "".join(rng.choice(LETTERS) for _ in range(24))) for q in questions])
    scored = run(path, greedy, tmp_path / "greedy.json", "0.01", "1.0,0.5")
    # Every answer letter is the argmax; the turn's two closing tokens (supervised, not letters) are not.
    assert scored["tokens"] == 4 * 26 and scored["greedy_share"] == pytest.approx(24 / 26)
    near_greedy, hot = (s["share"] for s in scored["expected_greedy_share"])
    assert near_greedy > 0.95 and hot < 0.5 * near_greedy
    assert run(path, noise, tmp_path / "noise.json")["greedy_share"] < 0.2


@pytest.mark.parametrize("args, says", [
    (["--sampling", "0"], "temperature 0"),
    (["--sampling", "0.2,x"], "is not T"),
    (["--sampling", "0.2,1.5"], "top-p"),
])
def test_bad_sampling_settings_name_the_problem(letters_target, tmp_path, args, says):
    answers = write_rows(tmp_path / "a.jsonl", [("q", "abc")])
    with pytest.raises(SystemExit, match=says):
        answer_greedy_share.main(["--target", str(letters_target[0]), "--answers", str(answers), *args])


def test_a_row_without_messages_is_named(letters_target, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi"}\n')
    with pytest.raises(SystemExit, match="bad.jsonl:1"):
        answer_greedy_share.main(["--target", str(letters_target[0]), "--answers", str(bad)])
