"""A run killed after step k and resumed ends with exactly the weights of an uninterrupted run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from flashdraft.model import DFlashDraftModel
from train_helpers import alphabet_chats, read_metrics, run_cli, run_cli_here, tiny_train_args

DETERMINISTIC = ("loss", "tau", "accuracy", "grad_norm", "lr", "eval_loss", "eval_tau")


@pytest.mark.slow
def test_killed_and_resumed_equals_uninterrupted(tiny_target, tmp_path, capfd, caplog):
    target = tiny_target("qwen3")
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=28)
    common = dict(
        **{"train.max_steps": 6, "train.checkpoint_every": 2, "train.keep_checkpoints": 2},
        **{"train.micro_batch_size": 2, "train.grad_accum_steps": 2, "data.eval_samples": 4, "train.eval_every": 3},
    )
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    # Only the crash needs a process of its own; the other runs are in this one.
    done = run_cli_here(["train", *tiny_train_args(target, data, whole, **common)], capfd, caplog)
    assert done.returncode == 0, done.stderr[-3000:]

    # An earlier run without checkpoints left a log in the folder: the fresh run must not append to it.
    broken.mkdir()
    (broken / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 123.0}) + "\n")
    crashed = run_cli(["train", *tiny_train_args(target, data, broken, **common)],
                      env={"FLASHDRAFT_CRASH_AFTER_STEP": "3"}, cpu=True)
    assert crashed.returncode == 17, crashed.stderr[-3000:]
    assert sorted(p.name for p in (broken / "checkpoints").iterdir()) == ["step-2"]  # step 3 was lost
    assert not (broken / "export").exists()
    resumed = run_cli_here(["train", *tiny_train_args(target, data, broken, **common)], capfd, caplog)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr

    # Bitwise equal weights: same data order and anchors (functions of the step), DCP restores the
    # fp32 weights and AdamW moments exactly, and the CPU kernels are deterministic.
    a, b = load_file(whole / "export" / "model.safetensors"), load_file(broken / "export" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # The resumed run's log replaces the lost step 3 and matches the uninterrupted one line by line.
    ma, mb = read_metrics(whole), read_metrics(broken)
    assert [m["step"] for m in ma] == [m["step"] for m in mb]
    for x, y in zip(ma, mb):
        assert {k: x[k] for k in DETERMINISTIC if k in x} == {k: y[k] for k in DETERMINISTIC if k in y}

    # Layout: the newest checkpoints only, a loadable export, a summary with the headline numbers.
    assert sorted(p.name for p in (whole / "checkpoints").iterdir()) == ["step-4", "step-6"]
    summary = json.loads((broken / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["resumed_from_step"] == 2
    for key in ("loss", "tau", "tokens_per_s", "eval_tau", "config"):
        assert key in summary
    trainer_state = json.loads((broken / "checkpoints" / "step-6" / "trainer.json").read_text())
    assert trainer_state["data"]["step_in_epoch"] == 6 % (24 // 4)
    draft = DFlashDraftModel.from_pretrained(whole / "export")
    assert draft.config.block_size == 4 and draft.config.num_hidden_layers == 1
