"""Writes never remove what a user put somewhere: output folders that hold a user's files are refused
(with --overwrite offered where replacing makes sense), `.` and the home folder always; an earlier output
of the same command is replaced or resumed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flashdraft.cli import main
from tiny_models import save_tiny_draft
from train_helpers import alphabet_chats, tiny_train_args


def user_folder(path: Path) -> Path:
    path.mkdir()
    (path / "thesis.tex").write_text("years of work")
    return path


def run(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_draft_init_refuses_a_users_folder_and_replaces_an_earlier_draft(tiny_target, tmp_path, capsys):
    target = str(tiny_target("qwen3"))
    mine = user_folder(tmp_path / "mine")
    code, err = run(capsys, "draft-init", "--target", target, "--output", str(mine), "--num-layers", "1")
    assert code == 2 and "is not an earlier output of `flashdraft draft-init`" in err and "--overwrite" in err
    assert (mine / "thesis.tex").read_text() == "years of work" and sorted(os.listdir(mine)) == ["thesis.tex"]

    draft = tmp_path / "draft"
    assert run(capsys, "draft-init", "--target", target, "--output", str(draft), "--seed", "1")[0] == 0
    first = (draft / "model.safetensors").read_bytes()
    assert run(capsys, "draft-init", "--target", target, "--output", str(draft), "--seed", "2")[0] == 0
    assert (draft / "model.safetensors").read_bytes() != first  # an earlier draft is replaced
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left

    assert run(capsys, "draft-init", "--target", target, "--output", str(mine), "--overwrite")[0] == 0
    assert (mine / "config.json").is_file() and not (mine / "thesis.tex").exists()  # asked for


@pytest.mark.parametrize("where", [".", "~", "/"])
def test_the_working_home_and_root_folders_are_never_outputs(tiny_target, tmp_path, monkeypatch, capsys, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("keep")
    code, err = run(capsys, "draft-init", "--target", str(tiny_target("qwen3")), "--output", where, "--overwrite")
    assert code == 2 and "is the working, home or root folder" in err
    assert (tmp_path / "notes.txt").read_text() == "keep"


def test_a_file_where_a_folder_belongs(tiny_target, tmp_path, capsys):
    path = tmp_path / "draft"
    path.write_text("not a folder")
    code, err = run(capsys, "draft-init", "--target", str(tiny_target("qwen3")), "--output", str(path))
    assert code == 2 and "is a file; give a folder" in err and path.read_text() == "not a folder"


def test_train_does_not_write_into_a_users_folder(tiny_target, tmp_path, capsys):
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=8)
    mine = user_folder(tmp_path / "mine")
    code, err = run(capsys, "train", *tiny_train_args(tiny_target("qwen3"), data, mine))
    assert code == 2 and "train.output_dir" in err and "is not an earlier output of `flashdraft train`" in err
    assert sorted(os.listdir(mine)) == ["thesis.tex"]


def test_evaluate_output_must_be_a_file_path(tiny_target, tmp_path, capsys):
    draft = save_tiny_draft(tmp_path / "draft")
    folder = tmp_path / "reports"
    folder.mkdir()
    code, err = run(capsys, "evaluate", "--draft", str(draft), "--target", str(tiny_target("qwen3")),
                    "--bench", "gsm8k", "--output", str(folder))
    assert code == 2 and "is a folder; give a file path" in err
    assert list(folder.iterdir()) == [] and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_warmup_and_prepare_data_refuse_a_users_folder_without_offering_to_replace_it(tiny_target, tmp_path, capsys):
    mine = user_folder(tmp_path / "mine")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    for argv in (["warmup", "--target", str(tiny_target("qwen3")), "--prompts", str(prompts), "--output", str(mine)],
                 ["prepare-data", "--target", str(tiny_target("qwen3")), "--train", str(prompts), "--output",
                  str(mine)]):
        code, err = run(capsys, *argv)
        assert code == 2 and "is not an earlier output" in err and "--overwrite" not in err, argv
    assert sorted(os.listdir(mine)) == ["thesis.tex"]
