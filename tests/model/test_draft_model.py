"""The draft is the z-lab DFlash model: same checkpoint, same numbers (oracle: PyPI `dflash==0.1.0`)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from flashdraft.cli import main
from flashdraft.model import DFlashDraftConfig, DFlashDraftModel
from flashdraft.target.frozen import FrozenTarget

zlab = pytest.importorskip("dflash.model", reason="the z-lab reference (pip install --no-deps dflash==0.1.0)")


@pytest.fixture(scope="module")
def draft_dir(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft") / "draft"
    code = main(["draft-init", "--target", str(tiny_target("qwen3")), "--output", str(out),
                 "--num-layers", "2", "--num-taps", "3", "--block-size", "4", "--seed", "3"])
    assert code == 0
    return out


def _draft_inputs(target: FrozenTarget, draft, ctx_ids: torch.Tensor, start: int, anchor: int):
    """Context features of `ctx_ids` at positions start.., and a [anchor, MASK..] block after them."""
    features = target.context_features(ctx_ids, draft.target_layer_ids)
    block = torch.full((1, draft.block_size), draft.mask_token_id)
    block[0, 0] = anchor
    noise = target.embedding(block)
    ctx_len = ctx_ids.shape[1]
    positions = torch.arange(start, start + ctx_len + draft.block_size)[None]
    return features, noise, positions


def test_zlab_loads_our_checkpoint_without_missing_or_unexpected_keys(draft_dir):
    ref, info = zlab.DFlashDraftModel.from_pretrained(draft_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = DFlashDraftModel.from_pretrained(draft_dir)
    assert ref.target_layer_ids == ours.target_layer_ids
    assert ref.mask_token_id == ours.mask_token_id and ref.block_size == ours.block_size == 4


def test_forward_matches_zlab_including_multi_step_kv_cache(draft_dir, tiny_target):
    torch.manual_seed(0)
    target = FrozenTarget.load(str(tiny_target("qwen3")), dtype=torch.float32)
    ours = DFlashDraftModel.from_pretrained(draft_dir).eval()
    ref = zlab.DFlashDraftModel.from_pretrained(draft_dir).eval()
    ours_cache, ref_cache = DynamicCache(config=ours.config), DynamicCache(config=ref.config)

    # Step 1: a 9-token prompt as context. Step 2: 3 newly accepted tokens as context after a crop,
    # exactly as a speculative decoding loop drives the draft.
    prompt = torch.randint(4, 260, (1, 9))
    accepted = torch.randint(4, 260, (1, 3))
    steps = [(prompt, 0, 77), (accepted, 9, 91)]
    with torch.no_grad():
        for ctx_ids, start, anchor in steps:
            features, noise, positions = _draft_inputs(target, ours, ctx_ids, start, anchor)
            a = ours(position_ids=positions, noise_embedding=noise, target_hidden=features,
                     past_key_values=ours_cache)
            b = ref(position_ids=positions, noise_embedding=noise, target_hidden=features,
                    past_key_values=ref_cache, use_cache=True)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            end = start + ctx_ids.shape[1]
            # transformers 5 crops by a negative count of tokens to drop.
            ours_cache.crop(end - ours_cache.get_seq_length())
            ref_cache.crop(end - ref_cache.get_seq_length())
            assert ours_cache.get_seq_length() == end
    # The same logits through the target's head, not just hidden states.
    torch.testing.assert_close(target.lm_head(a), target.lm_head(b), rtol=0, atol=1e-5)


def test_saved_config_is_the_zlab_format(draft_dir, tiny_target):
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": 260, "target_layer_ids": [1, 2, 3], "block_size": 4}
    assert config["block_size"] == 4
    assert config["num_target_layers"] == 6
    assert config["tie_word_embeddings"] is False
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    target_config = json.loads((tiny_target("qwen3") / "config.json").read_text())
    assert config["hidden_size"] == target_config["hidden_size"]
    assert config["vocab_size"] == target_config["vocab_size"]
    from safetensors import safe_open

    with safe_open(draft_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight",
            "layers.0.mlp.down_proj.weight", "layers.0.post_attention_layernorm.weight"} <= keys
    assert not any("embed" in k or "lm_head" in k for k in keys)


@pytest.mark.parametrize("where", ["top_level", "dflash_config", "both"])
def test_reads_released_checkpoints_with_block_size_anywhere(tmp_path, where):
    config = DFlashDraftConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, vocab_size=50, num_target_layers=8,
        dflash_config={"mask_token_id": 7, "target_layer_ids": [1, 5]},
    )
    DFlashDraftModel(config).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.pop("block_size")
    raw["dflash_config"].pop("block_size")
    if where in ("top_level", "both"):
        raw["block_size"] = 10
    if where in ("dflash_config", "both"):
        raw["dflash_config"]["block_size"] = 10
    (tmp_path / "config.json").write_text(json.dumps(raw))
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert loaded.block_size == 10 and loaded.mask_token_id == 7 and loaded.target_layer_ids == [1, 5]


def test_old_checkpoint_without_layer_ids_uses_the_default_rule(tmp_path):
    config = DFlashDraftConfig(
        hidden_size=32, num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, vocab_size=50, num_target_layers=36, dflash_config={"mask_token_id": 7},
    )
    DFlashDraftModel(config).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert "target_layer_ids" not in raw["dflash_config"]
    ref = zlab.DFlashDraftModel.from_pretrained(tmp_path)
    ours = DFlashDraftModel.from_pretrained(tmp_path)
    assert ours.target_layer_ids == ref.target_layer_ids == [1, 9, 17, 25, 33]
