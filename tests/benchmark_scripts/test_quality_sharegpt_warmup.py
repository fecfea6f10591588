"""`quality_sharegpt.sh warmup`: one warmup answers all of a DATA's prompt files into a folder named after them;
over an --exclude chain a second DATA's answers join the WORK of the first, which keeps its answers to the
second-turn conversations (the same conversation file's content in both DATA, the same target: the warmup compares
them by content), also where the WORK moved without its DATA; other conversations or another target are refused
rather than mixed in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from train_helpers import cpu_env

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality_sharegpt.sh"
CONVERSATION = [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "red"},
                {"role": "user", "content": "and another"}]


def write_data(folder: Path, shard: int, second_turn: list[dict], shards: int = 1) -> Path:
    folder.mkdir()
    for number in range(shard, shard + shards):
        prompts = ({"messages": [{"role": "user", "content": f"prompt {number} {i}"}]} for i in range(3))
        (folder / f"prompts_{number}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in prompts))
    (folder / "sharegpt_second_turn_source.jsonl").write_text(json.dumps({"messages": second_turn}) + "\n")
    return folder


def warmup(target: Path, data: Path, work: Path, **env: str) -> subprocess.CompletedProcess:
    env = cpu_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                  WARMUP_BACKEND="static", MAX_LENGTH="48", EVAL_NEW_TOKENS="4", WARMUP_BATCH="2", **env)
    return subprocess.run(["bash", str(SCRIPT), "warmup", str(target), str(data), str(work)],
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_second_data_adds_its_shards_and_keeps_the_second_turn_answers(tiny_target, tmp_path):
    target, work = tiny_target("qwen3"), tmp_path / "work"
    first = warmup(target, write_data(tmp_path / "data", 0, CONVERSATION), work)
    assert first.returncode == 0, first.stderr
    second_turn = (work / "warmup_second_turn" / "train.jsonl").read_bytes()

    # Shards 1, 2, ..., 10 of the second DATA: named in number order (ls would put 10 before 2).
    second = warmup(target, write_data(tmp_path / "data2", 1, CONVERSATION, shards=10), work)
    assert second.returncode == 0, second.stderr
    assert "already finished with these settings" in (work / "warmup_second_turn.log").read_text()
    assert (work / "sharegpt_second_turn.jsonl").read_bytes() == second_turn
    assert sorted(p.name for p in work.glob("warmup_prompts_*") if p.is_dir()) == \
        ["warmup_prompts_0", "warmup_prompts_1-10"]
    assert len((work / "warmup_prompts_0" / "train.jsonl").read_text().splitlines()) == 3
    asked = {json.loads(line)["messages"][0]["content"]
             for line in (work / "warmup_prompts_1-10" / "train.jsonl").read_text().splitlines()}
    assert asked == {f"prompt {shard} {i}" for shard in range(1, 11) for i in range(3)}  # every file, once each
    assert (Path((work / "target_path").read_text().strip()) / "config.json").is_file()

    other = [*CONVERSATION[:2], {"role": "user", "content": "a different second turn"}]
    refused = warmup(target, write_data(tmp_path / "data3", 11, other), work)
    assert refused.returncode != 0
    assert "holds a finished warmup with other settings" in (work / "warmup_second_turn.log").read_text()
    assert (work / "sharegpt_second_turn.jsonl").read_bytes() == second_turn


def test_a_moved_work_keeps_its_second_turn_answers_only_for_the_same_target(tiny_target, tmp_path):
    """The answers travel to another machine without the DATA they came from or the target caches: a new
    DATA of the chain keeps the second-turn answers and takes target_path from its own answers; the same
    conversations asked of another target are refused."""
    target, work = tiny_target("qwen3"), tmp_path / "work"
    assert warmup(target, write_data(tmp_path / "data", 0, CONVERSATION), work).returncode == 0
    second_turn = (work / "warmup_second_turn" / "train.jsonl").read_bytes()
    moved = tmp_path / "moved"
    shutil.copytree(work, moved, ignore=shutil.ignore_patterns("cache_*"))
    shutil.rmtree(work)
    shutil.rmtree(tmp_path / "data")

    result = warmup(target, write_data(tmp_path / "data2", 1, CONVERSATION), moved)
    assert result.returncode == 0, result.stderr
    assert "already finished with these settings" in (moved / "warmup_second_turn.log").read_text()
    assert (moved / "sharegpt_second_turn.jsonl").read_bytes() == second_turn
    shard = json.loads((moved / "warmup_prompts_1" / "manifest.json").read_text())
    assert (moved / "target_path").read_text().strip() == shard["target_path"]

    other = warmup(tiny_target("llama"), write_data(tmp_path / "data3", 2, CONVERSATION), moved)
    assert other.returncode != 0
    assert "holds a finished warmup with other settings" in (moved / "warmup_second_turn.log").read_text()
    assert (moved / "sharegpt_second_turn.jsonl").read_bytes() == second_turn


def test_a_data_of_second_turns_gets_every_turn_answered(tiny_target, tmp_path):
    """A DATA drawn with --sharegpt-second-turns (its counts.json says so) has its shards warmed up with every
    user turn answered, as its manifest records; a DATA without them answers first turns only. (That a
    warmup of all turns answers the second after its own first answer: tests/stages/test_warmup.py.)"""
    target = tiny_target("qwen3")
    for name, second_turns, turns in (("turns", 1, "all"), ("firsts", 0, "first")):
        data = write_data(tmp_path / f"data_{name}", 0, CONVERSATION)
        (data / "prompts_0.jsonl").write_text(json.dumps({"messages": CONVERSATION}) + "\n")
        (data / "counts.json").write_text(json.dumps({"sharegpt_second_turns": second_turns}))
        work = tmp_path / f"work_{name}"
        result = warmup(target, data, work)
        assert result.returncode == 0, result.stderr
        assert json.loads((work / "warmup_prompts_0" / "manifest.json").read_text())["settings"]["turns"] == turns


def test_counts_that_are_not_json_are_refused_before_the_warmup_starts(tiny_target, tmp_path):
    data = write_data(tmp_path / "data", 0, CONVERSATION)
    (data / "counts.json").write_text("{not json")
    result = warmup(tiny_target("qwen3"), data, tmp_path / "work")
    assert result.returncode != 0
    assert f"error: {data / 'counts.json'} is not the counts a quality_sharegpt_prepare.py run wrote" in result.stderr
    assert not (tmp_path / "work" / "warmup_prompts_0").exists()


def test_the_former_shard_settings_are_refused_with_their_new_names(tiny_target, tmp_path):
    """SHARD_BATCH and SHARD_ROWS set a warmup process a shard; a command of an earlier run that sets them would
    otherwise run with the new defaults without a word."""
    data = write_data(tmp_path / "data", 0, CONVERSATION)
    for old, new in (("SHARD_BATCH", "WARMUP_BATCH"), ("SHARD_ROWS", "WARMUP_ROWS")):
        result = warmup(tiny_target("qwen3"), data, tmp_path / "work", **{old: "128"})
        assert result.returncode == 2
        assert f"error: {old} is now {new}" in result.stderr
        assert not (tmp_path / "work" / "warmup_prompts_0").exists()


def test_a_data_without_prompt_files_is_refused_before_any_target_loads(tiny_target, tmp_path):
    (tmp_path / "empty").mkdir()
    result = warmup(tiny_target("qwen3"), tmp_path / "empty", tmp_path / "work")
    assert result.returncode == 2
    assert f"error: {tmp_path / 'empty'} holds no prompts_*.jsonl; make it with quality_sharegpt_prepare.py" \
        in result.stderr
    assert not list((tmp_path / "work").glob("warmup_*"))
