"""Hybrid (Mamba-2) targets: detection, and failing fast when a recipe needs the kernels but they are off."""

from __future__ import annotations

import pytest

from flashdraft.config import load_config
from flashdraft.errors import UserError
from flashdraft.target.fast_path import fast_path_status, mamba_kernel_errors
from flashdraft.target.frozen import FrozenTarget
from flashdraft.target.source import load_target_config
from tiny_models import tiny_config, tiny_tokenizer


def test_hybrid_detection(tiny_target):
    hybrid = fast_path_status(load_target_config(str(tiny_target("nemotron_h"))))
    assert hybrid["hybrid"] and hybrid["recurrent_layers"] == 2
    assert not fast_path_status(load_target_config(str(tiny_target("qwen3"))))["hybrid"]


@pytest.mark.skipif(not mamba_kernel_errors(), reason="the Mamba-2 kernels import here; nothing to refuse")
def test_required_fast_path_fails_before_any_weights_load(tmp_path):
    # Config and tokenizer only: if loading got as far as the weights, the error would be a different one.
    tiny_config("nemotron_h").save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(UserError, match="requires the Mamba-2 fast path.*mamba_ssm.*build_kernels.sh"):
        FrozenTarget.load(str(tmp_path), fast_path_required=True)


def test_pure_attention_target_is_unaffected_by_the_requirement(tiny_target):
    target = FrozenTarget.load(str(tiny_target("qwen3")), dtype="float32", fast_path_required=True)
    assert target.num_layers == 6


def test_nemotron_recipe_requires_the_fast_path():
    assert load_config("nemotron_nano30b_dflash").target.require_fast_path is True


@pytest.mark.skipif(not mamba_kernel_errors(), reason="the Mamba-2 kernels import here; nothing to refuse")
def test_training_refuses_before_reading_data_or_weights(tmp_path, capsys):
    from flashdraft.cli import main

    tiny_config("nemotron_h").save_pretrained(tmp_path / "target")  # config and tokenizer, no weights
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    code = main(["train", f"target.name_or_path={tmp_path / 'target'}", "target.require_fast_path=true",
                 f"data.train={tmp_path / 'missing.jsonl'}", f"train.output_dir={tmp_path / 'run'}"])
    assert code == 2
    assert "requires the Mamba-2 fast path" in capsys.readouterr().err  # not the missing data file
