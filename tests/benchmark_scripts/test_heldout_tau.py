"""benchmarks/heldout_tau.py scores an exported draft exactly as the trainer's evaluation did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from train_helpers import alphabet_chats, cpu_env, run_cli_here, tiny_train_args

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "heldout_tau.py"


def _score(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=cpu_env(),
                          timeout=300)


def test_export_scores_as_the_trainers_final_eval(tiny_target, tmp_path, capfd, caplog):
    target = tiny_target("qwen3")
    train = alphabet_chats(tmp_path / "train.jsonl", rows=16)
    held = alphabet_chats(tmp_path / "held.jsonl", rows=5, seed=1)
    run = tmp_path / "run"
    settings = {"train.max_steps": 6, "train.micro_batch_size": 2, "train.lr": 3e-3}
    done = run_cli_here(["train", *tiny_train_args(target, train, run, **settings, **{"data.eval": str(held)})],
                        capfd, caplog)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())

    out = tmp_path / "scores.json"
    done = _score("--draft", str(run / "export"), "--eval", f"held={held}", f"train={train}",
                  "--out", str(out), "--", f"target.name_or_path={target}", "objective.num_anchors=4")
    assert done.returncode == 0, done.stderr[-3000:]
    scores = json.loads(out.read_text())["results"]
    # The trainer scored the held-out set in batches of 2 with the weights in memory; the script loads
    # the export and scores one sample a batch: the same anchors, so the same numbers.
    assert scores["held"]["samples"] == 5
    for key in ("eval_loss", "eval_tau", "eval_acc_slot_1", "eval_acc_slot_3"):
        assert scores["held"][key] == pytest.approx(summary[key], abs=1e-5), key
    # Each set is scored on its own: the train set's numbers are not the held-out set's.
    assert scores["train"]["samples"] == 16 and scores["train"]["eval_loss"] != scores["held"]["eval_loss"]


@pytest.mark.parametrize("args,says", [
    (["--eval", "held"], "is not NAME=SPEC"),
    (["--eval", "a=x.jsonl", "a=y.jsonl"], "names 'a' twice"),
])
def test_bad_eval_argument_names_the_problem(tmp_path, args, says):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    done = _score("--draft", str(tmp_path / "draft"), *args, "--out", str(tmp_path / "s.json"))
    assert done.returncode != 0 and says in done.stderr and not (tmp_path / "s.json").exists()


def test_a_folder_without_a_draft_is_refused(tmp_path):
    done = _score("--draft", str(tmp_path), "--eval", "a=x.jsonl", "--out", str(tmp_path / "s.json"))
    assert done.returncode != 0 and "has no config.json" in done.stderr and not (tmp_path / "s.json").exists()


def test_anchor_rules_pick_the_tail_and_the_loops():
    import torch

    sys.path.insert(0, str(SCRIPT.parent))
    import heldout_tau

    from flashdraft.data.repetition import LOOP_WINDOW
    from flashdraft.objectives.dflash import valid_anchor_positions

    block, length = 4, 20
    mask = torch.zeros(24, dtype=torch.bool)
    mask[6:length] = True  # the answer: positions 6..19; 20.. is padding
    train = valid_anchor_positions(mask, length)
    assert train.tolist() == list(range(6, 19))  # every position whose token and next token are supervised
    assert heldout_tau.tail_anchors(train, None, mask, length, block).tolist() == [17, 18]

    # a 40-token phrase said twice after 10 distinct tokens: tokens 10 + 40 + 31 = 81.. repeat the first time
    ids = torch.tensor(list(range(1000, 1010)) + list(range(40)) * 2)
    length, first_looped = len(ids), 10 + 40 + LOOP_WINDOW - 1
    mask = torch.ones(length, dtype=torch.bool)
    train = valid_anchor_positions(mask, length)
    looped = heldout_tau.ANCHOR_RULES["looped"](train, ids, mask, length, block)
    unlooped = heldout_tau.ANCHOR_RULES["unlooped"](train, ids, mask, length, block)
    assert looped.tolist() == list(range(first_looped - 1, length - block + 1))  # slots 1..3 all looped, in range
    assert unlooped.tolist() == list(range(0, first_looped - block + 1))  # no token of the block looped


def test_looped_blocks_split_by_where_each_slots_copy_lies():
    """A 40-token phrase said twice, then a 5-token phrase said 20 times: with blocks of 8, the long loop's
    slots all repeat context (far), the short loop's slots 6 and 7 repeat the block itself (near)."""
    import torch

    sys.path.insert(0, str(SCRIPT.parent))
    import heldout_tau

    from flashdraft.data.repetition import repeat_distances
    from flashdraft.objectives.dflash import valid_anchor_positions

    block = 8
    long_end = 10 + 80
    ids = torch.tensor(list(range(1000, 1010)) + list(range(40)) * 2 + list(range(500, 505)) * 20)
    length = len(ids)
    distances = repeat_distances(ids.tolist())
    assert set(distances[10 + 40 + 31:long_end]) == {40} and set(distances[long_end + 36:]) == {5}
    mask = torch.ones(length, dtype=torch.bool)
    train = valid_anchor_positions(mask, length)
    looped = heldout_tau.ANCHOR_RULES["looped"](train, ids, mask, length, block).tolist()
    far = heldout_tau.ANCHOR_RULES["looped_far"](train, ids, mask, length, block).tolist()
    near = heldout_tau.ANCHOR_RULES["looped_near"](train, ids, mask, length, block).tolist()
    assert sorted(far + near) == looped and not set(far) & set(near)
    assert far and all(a + block - 1 < long_end for a in far)  # blocks inside the long loop
    assert near and all(a >= long_end for a in near)  # blocks inside the short loop
