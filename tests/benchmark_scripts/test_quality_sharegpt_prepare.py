"""`quality_sharegpt_prepare.py --exclude`: a run's prompts grow across machine windows with new prompts only,
in shards numbered after the earlier ones, beside the same benchmarks; bad folders are refused before any
work, and nothing the user had is replaced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from quality_sharegpt_prepare import fresh  # noqa: E402
from smollm2_prepare import step_by_step  # noqa: E402

SMALL = ["--sharegpt", "24", "--mix", "24", "--eval-prompts", "2"]


def prepare(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / "quality_sharegpt_prepare.py"), "--out", str(out),
                           *SMALL, *args], check=False, capture_output=True, text=True, timeout=300)


def prompts(folder: Path) -> dict[str, list[str]]:
    return {path.name: [json.dumps(json.loads(line)["messages"]) for line in path.read_text().splitlines()]
            for path in sorted(folder.glob("prompts_*.jsonl"))}


def test_excluded_prompts_are_not_drawn_again_and_the_shards_follow_theirs(tmp_path):
    first = tmp_path / "first"
    assert prepare(first, "--shards", "2").returncode == 0
    grown = tmp_path / "grown"
    result = prepare(grown, "--shards", "3", "--exclude", str(first))
    assert result.returncode == 0, result.stderr
    earlier = {p for shard in prompts(first).values() for p in shard}
    new = prompts(grown)
    assert sorted(new) == ["prompts_2.jsonl", "prompts_3.jsonl", "prompts_4.jsonl"]
    drawn = [p for shard in new.values() for p in shard]
    assert not set(drawn) & earlier
    counts = json.loads((grown / "counts.json").read_text())
    assert (counts["sharegpt"], counts["mix"], counts["first_shard"]) == (24, 24, 2)
    assert len(drawn) == 48 - counts["dropped_as_held_out"]
    for name in ("gsm8k", "humaneval", "chat", "sharegpt_first_turn", "sharegpt_second_turn_source"):
        assert (grown / f"{name}.jsonl").read_bytes() == (first / f"{name}.jsonl").read_bytes()

    # Both earlier folders left out: a third draw is new against either, numbered after the last.
    third = tmp_path / "third"
    assert prepare(third, "--shards", "1", "--exclude", str(first), str(grown)).returncode == 0
    (shard,) = prompts(third).items()
    assert shard[0] == "prompts_5.jsonl" and not set(shard[1]) & (earlier | set(drawn))


def test_a_question_asked_in_its_other_form_earlier_counts_as_asked():
    """The mix adds the step-by-step instruction to every other reasoning prompt by its place in the draw, so
    a later draw may hold an earlier question in the other form: it is not new."""
    question = [{"role": "user", "content": "What is 3 + 4?"}]
    other = [{"role": "user", "content": "Name a prime."}]
    earlier = {json.dumps(step_by_step(question))}
    candidates = [(question, step_by_step(question)), (other, step_by_step(other))]
    assert fresh(candidates, earlier, 1, "mix") == [other]
    with pytest.raises(SystemExit, match="only 1 mix prompts are left after the 1 of --exclude; lower --mix to "
                                         "at most 1"):
        fresh(candidates, earlier, 2, "mix")
    with pytest.raises(SystemExit, match="only 2 sharegpt prompts are in the source; lower --sharegpt"):
        fresh(candidates, set(), 3, "sharegpt")


def test_excluding_the_output_folder_is_refused_and_its_prompts_kept(tmp_path):
    first = tmp_path / "first"
    assert prepare(first, "--shards", "2").returncode == 0
    before = prompts(first)
    result = prepare(first, "--exclude", str(first))
    assert result.returncode != 0 and f"--exclude {first} is --out" in result.stderr
    assert prompts(first) == before


@pytest.mark.parametrize("rows, message", [
    (None, "holds no prompts_K.jsonl; give a folder this script wrote"),
    ('{"messages": []}\n{"prompt": "hi"}\n', "prompts_0.jsonl:2 is not a prompt row of this script"),
    ('{"messages": []}\nnot json\n', "prompts_0.jsonl:2 is not a prompt row of this script"),
])
def test_a_folder_that_is_no_earlier_output_is_refused_before_any_work(tmp_path, rows, message):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    if rows is not None:
        (earlier / "prompts_0.jsonl").write_text(rows)
    out = tmp_path / "out"
    result = prepare(out, "--exclude", str(earlier))
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert not out.exists()


def training_prompts(folder: Path) -> list[str]:
    return [json.loads(p)[0]["content"] for shard in prompts(folder).values() for p in shard]


def test_the_mix_weights_choose_the_sources(tmp_path):
    """Word problems alone: every prompt asks for step-by-step reasoning; stdlib code alone: none does. The
    weights are recorded in counts.json."""
    instruction = "Please reason step by step"
    words = tmp_path / "words"
    result = prepare(words, "--sharegpt", "0", "--mix-weights", "word_problems=1", "--shards", "2")
    assert result.returncode == 0, result.stderr
    drawn = training_prompts(words)
    assert len(drawn) == 24 and all(instruction in p for p in drawn)
    assert json.loads((words / "counts.json").read_text())["mix_weights"] == {"word_problems": 1.0}
    code = tmp_path / "code"
    assert prepare(code, "--sharegpt", "0", "--mix-weights", "stdlib_code=1").returncode == 0
    drawn = training_prompts(code)
    assert len(drawn) == 24 and not any(instruction in p for p in drawn)


@pytest.mark.parametrize("args, message", [
    (["--mix-weights", "word_problems=0"], "'word_problems=0': the weight must be a finite number above 0"),
    (["--mix-weights", "word_problems=many"], "'word_problems=many': the weight must be a finite number above 0"),
    (["--mix-weights", "word_problems=inf"], "'word_problems=inf': the weight must be a finite number above 0"),
    (["--mix-weights", "poems=1"], "'poems=1': each of reasoning_gym, stdlib_code, word_problems may be named once"),
    (["--mix-weights", "stdlib_code=1,stdlib_code=2"], "'stdlib_code=2': each of reasoning_gym"),
    (["--sharegpt", "0", "--mix", "0"], "--sharegpt, --sharegpt-second-turns and --mix are all 0"),
    (["--sharegpt-second-turns", "-2"], "--sharegpt-second-turns must be >= 0, got -2"),
    # More second turns than the train split has conversations with one: refused before any file.
    (["--sharegpt-second-turns", "20000"], "error: only 12745 sharegpt-second-turns prompts are in the source; "
                                           "lower --sharegpt-second-turns to at most 12745"),
    (["--mix", "-1"], "--mix must be >= 0, got -1"),
    # More code prompts than the standard library has functions: refused by the loader, before any file.
    (["--mix", "9000", "--mix-weights", "stdlib_code=1"], "error: packaged:stdlib_code@1 has "),
])
def test_a_bad_mix_is_refused_before_any_file_is_written(tmp_path, args, message):
    out = tmp_path / "out"
    result = prepare(out, *args)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_second_turns_are_conversations_of_two_user_turns_and_new_to_later_draws(tmp_path):
    """--sharegpt-second-turns draws train-split conversations cut after their second user turn (the warmup
    answers both, quality_sharegpt.sh reading the count in counts.json), not the held-out ones of the
    second-turn benchmark, and a later draw with --exclude takes others."""
    first = tmp_path / "first"
    result = prepare(first, "--sharegpt", "0", "--mix", "0", "--sharegpt-second-turns", "6", "--shards", "2")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(p) for shard in prompts(first).values() for p in shard]
    assert len(rows) == 6
    assert all([m["role"] for m in row if m["role"] != "system"] == ["user", "assistant", "user"] for row in rows)
    assert json.loads((first / "counts.json").read_text())["sharegpt_second_turns"] == 6
    held_out = [json.loads(line)["messages"] for line in
                (first / "sharegpt_second_turn_source.jsonl").read_text().splitlines()]
    assert not any(row in held_out for row in rows)
    later = tmp_path / "later"
    result = prepare(later, "--sharegpt", "2", "--mix", "0", "--sharegpt-second-turns", "6", "--exclude", str(first))
    assert result.returncode == 0, result.stderr
    drawn = [json.loads(p) for shard in prompts(later).values() for p in shard]
    assert len(drawn) == 8 and not any(row in rows for row in drawn)
