"""Bad input to `flashdraft train` fails with a clear error before any weights are loaded."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from dflash_helpers import write_draft
from flashdraft import cli
from tiny_models import save_tiny_target
from train_helpers import alphabet_chats, tiny_train_args


@pytest.fixture
def no_weights(monkeypatch):
    """Loading the target's weights is the first heavy step; reaching it fails the test."""

    def forbidden(*_args, **_kwargs):
        raise AssertionError("target weights were loaded before the bad input was reported")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", forbidden)


def train_error(capsys, args: list[str]) -> str:
    assert cli.main(["train", *args]) == 2
    return capsys.readouterr().err


def write_chats(path, conversations):
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return path


def test_unknown_key_and_wrong_type(capsys, no_weights):
    assert "unknown config key(s) train.max_stepz" in train_error(capsys, ["train.max_stepz=3"])
    err = train_error(capsys, ["train.max_steps=many"])
    assert "train.max_steps: expected int" in err and "many" in err
    assert "objective.attention must be one of auto, flex, sdpa, got 'dense'" in train_error(
        capsys, ["objective.attention=dense"])
    assert "objective.name: unknown objective 'eagle'" in train_error(capsys, ["objective.name=eagle"])


def test_renamed_keys_name_their_new_names(capsys, no_weights):
    err = train_error(capsys, ["train.warmup_steps=10"])
    assert "train.warmup_steps was renamed to train.lr_warmup_steps" in err
    assert "train.lr_warmup_ratio" in train_error(capsys, ["train.warmup_ratio=0.1"])
    assert "section 'strategy' was renamed to 'objective'" in train_error(capsys, ["strategy.num_anchors=4"])


def test_dataset_without_assistant_turns(capsys, no_weights, tiny_target, tmp_path):
    data = write_chats(tmp_path / "prompts.jsonl", [[{"role": "user", "content": "hi"}]] * 4)
    err = train_error(capsys, tiny_train_args(tiny_target("qwen3"), data, tmp_path / "out"))
    assert "has no assistant turns" in err


def test_all_samples_filtered(capsys, no_weights, tiny_target, tmp_path):
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    data = write_chats(tmp_path / "short.jsonl", [short] * 4)
    err = train_error(capsys, tiny_train_args(tiny_target("qwen3"), data, tmp_path / "out"))
    assert "fewer than 8 supervised (assistant) tokens" in err  # 2 x block size 4


def test_draft_that_does_not_fit(capsys, no_weights, tiny_target, tmp_path):
    target = tiny_target("qwen3")
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=8)
    err = train_error(capsys, tiny_train_args(target, data, tmp_path / "out", **{"draft.hidden_size": 96}))
    assert "draft hidden size 96 != target hidden size 64" in err
    other = save_tiny_target(tmp_path / "other", "qwen3", vocab_size=320)
    draft = write_draft(other, tmp_path / "draft", num_layers=1, block_size=4, target_layer_ids=[1])
    err = train_error(capsys, tiny_train_args(target, data, tmp_path / "out", **{"draft.init_from": draft}))
    assert "draft vocab 320 != target vocab 288" in err
    err = train_error(capsys, tiny_train_args(target, data, tmp_path / "out", **{"draft.init_from": tmp_path / "nope"}))
    assert "draft.init_from" in err and "not a draft folder" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="flex attention is valid where CUDA is")
def test_flex_attention_needs_a_gpu(capsys, no_weights, tiny_target, tmp_path):
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=8)
    err = train_error(capsys, tiny_train_args(tiny_target("qwen3"), data, tmp_path / "out",
                                              **{"objective.attention": "flex"}))
    assert "needs a CUDA device" in err


def test_init_from_of_another_shape_is_refused_not_overridden(capsys, no_weights, tiny_target, tmp_path):
    target = tiny_target("qwen3")
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=8)
    draft = write_draft(target, tmp_path / "draft", num_layers=1, block_size=8, target_layer_ids=[1])
    err = train_error(capsys, tiny_train_args(target, data, tmp_path / "out", **{"draft.init_from": draft}))
    assert "draft.block_size=4 (the folder has 8)" in err and "drop draft.init_from" in err
    assert not (tmp_path / "out" / "tokenized").exists()  # refused before the data work
    weights = draft / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    err = train_error(capsys, tiny_train_args(target, data, tmp_path / "out2",
                                              **{"draft.init_from": draft, "draft.block_size": 8}))
    assert "model.safetensors is truncated" in err
