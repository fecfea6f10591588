"""The target-layer initialisation experiment: draft layers that start as exact copies of the target's,
what has no counterpart kept fresh, and bad layer choices refused before anything is written."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from dflash_helpers import write_draft
from tiny_models import save_tiny_target
from transformers import AutoModelForCausalLM

from flashdraft.model.check import check_draft
from flashdraft.model.modeling import DFlashDraftModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import target_layer_init  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    target = save_tiny_target(root / "target", "llama")
    return target, write_draft(target, root / "fresh")


def state(folder: Path, cls=DFlashDraftModel) -> dict[str, torch.Tensor]:
    return cls.from_pretrained(folder, dtype=torch.float32).state_dict()


def test_draft_layers_start_as_the_targets_last_layers(llama, tmp_path):
    target, fresh = llama
    out = tmp_path / "init"
    assert target_layer_init.main(["--draft", str(fresh), "--target", str(target), "--out", str(out)]) == 0
    ours, before = state(out), state(fresh)
    theirs = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).state_dict()
    for i, j in ((0, 4), (1, 5)):  # 2 draft layers, 6 target layers: the last two
        for name in ("self_attn.q_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight",
                     "input_layernorm.weight", "post_attention_layernorm.weight"):
            assert torch.equal(ours[f"layers.{i}.{name}"], theirs[f"model.layers.{j}.{name}"])
        # Llama has no per-head q/k norms: the fresh ones stay.
        assert torch.equal(ours[f"layers.{i}.self_attn.q_norm.weight"], before[f"layers.{i}.self_attn.q_norm.weight"])
    assert torch.equal(ours["norm.weight"], theirs["model.norm.weight"])
    assert torch.equal(ours["fc.weight"], before["fc.weight"])
    record = json.loads((out / "init.json").read_text())
    assert record["layers"] == [4, 5]
    assert "fc.weight" in record["kept"] and "layers.0.self_attn.k_norm.weight" in record["kept"]
    assert "layers.1.mlp.gate_proj.weight" in record["copied"] and "norm.weight" in record["copied"]
    check_draft(out, "draft.init_from")  # what training from it checks first


def test_chosen_layers_are_copied_in_order(llama, tmp_path):
    target, fresh = llama
    out = tmp_path / "init"
    assert target_layer_init.main(["--draft", str(fresh), "--target", str(target), "--out", str(out),
                                   "--layers", "3,1"]) == 0
    ours = state(out)
    theirs = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).state_dict()
    assert torch.equal(ours["layers.0.self_attn.v_proj.weight"], theirs["model.layers.3.self_attn.v_proj.weight"])
    assert torch.equal(ours["layers.1.self_attn.v_proj.weight"], theirs["model.layers.1.self_attn.v_proj.weight"])


@pytest.mark.parametrize("layers, message", [("4,6", r"\[6\] are not layers of the target, which has 6"),
                                             ("5", "names 1 target layers for a draft of 2 layers")])
def test_bad_layers_are_refused_and_nothing_is_written(llama, tmp_path, capsys, layers, message):
    target, fresh = llama
    out = tmp_path / "init"
    assert target_layer_init.main(["--draft", str(fresh), "--target", str(target), "--out", str(out),
                                   "--layers", layers]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_folder_of_the_users_is_not_written_into(llama, tmp_path, capsys):
    target, fresh = llama
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    assert target_layer_init.main(["--draft", str(fresh), "--target", str(target), "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep"


def test_a_hybrid_targets_mamba_layers_are_refused(tmp_path, capsys):
    target = save_tiny_target(tmp_path / "target", "nemotron_h")
    fresh = write_draft(target, tmp_path / "fresh")
    out = tmp_path / "init"
    assert target_layer_init.main(["--draft", str(fresh), "--target", str(target), "--out", str(out),
                                   "--layers", "0,3"]) == 2
    assert "no attention projections named like the draft's" in capsys.readouterr().err
    assert not out.exists()


def test_a_qwen3_targets_per_head_norms_are_copied_too(tmp_path):
    target = save_tiny_target(tmp_path / "target", "qwen3")
    out = tmp_path / "init"
    assert target_layer_init.main(["--draft", str(write_draft(target, tmp_path / "fresh")), "--target", str(target),
                                   "--out", str(out)]) == 0
    theirs = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).state_dict()
    assert torch.equal(state(out)["layers.1.self_attn.k_norm.weight"], theirs["model.layers.5.self_attn.k_norm.weight"])
    assert json.loads((out / "init.json").read_text())["kept"] == ["fc.weight", "hidden_norm.weight"]


def test_a_draft_of_other_layer_sizes_is_refused(llama, tmp_path, capsys):
    target, _ = llama
    fresh = write_draft(target, tmp_path / "fresh", intermediate_size=96)
    out = tmp_path / "init"
    assert target_layer_init.main(["--draft", str(fresh), "--target", str(target), "--out", str(out)]) == 2
    assert "has shape [96, 64], the target's [128, 64]" in capsys.readouterr().err
    assert not out.exists()


def test_a_draft_folder_without_a_card_is_taken(llama, tmp_path):
    target, fresh = llama
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((fresh / name).read_bytes())
    out = tmp_path / "init"
    assert target_layer_init.main(["--draft", str(bare), "--target", str(target), "--out", str(out)]) == 0
    assert not (out / "README.md").exists() and (out / "init.json").is_file()
