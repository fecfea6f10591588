"""Target sources: revisions only for hub ids, remote code only at a pinned commit, and weight files that
are checked whole before anything heavy starts."""

import json
import shutil

import pytest

from flashdraft.config import TargetConfig
from flashdraft.errors import UserError
from flashdraft.target.source import check_weights, resolve_source, source_of

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_revision_is_for_hub_ids_and_reaches_the_loaders(tiny_target):
    with pytest.raises(UserError, match="applies to hub ids only.*drop target.revision"):
        resolve_source(str(tiny_target("llama")), "main")
    source = source_of(TargetConfig(name_or_path="org/model", revision="v1.0"))
    assert not source.is_local and source.hf_kwargs() == {"revision": "v1.0"}


@pytest.mark.parametrize("revision", [None, "main", SHA[:12]])
def test_remote_code_from_the_hub_needs_a_pinned_commit(revision):
    with pytest.raises(UserError, match="must pin a commit .40 hex digits.*target.revision=<sha>"):
        source_of(TargetConfig(name_or_path="org/model", trust_remote_code=True, revision=revision))
    assert source_of(TargetConfig(name_or_path="org/model", trust_remote_code=True, revision=SHA)).revision == SHA


def test_local_remote_code_needs_no_pin(tiny_target):
    assert source_of(TargetConfig(name_or_path=str(tiny_target("llama")), trust_remote_code=True)).is_local


def test_the_llada2_recipe_asks_for_the_pin():
    from flashdraft.config import load_config

    with pytest.raises(UserError, match="must pin a commit"):
        source_of(load_config("llada2_sft").target)


def _copy(tiny_target, tmp_path):
    folder = tmp_path / "target"
    shutil.copytree(tiny_target("llama"), folder)
    return folder


def test_whole_weights_pass_and_cut_off_ones_fail(tiny_target, tmp_path):
    folder = _copy(tiny_target, tmp_path)
    check_weights(resolve_source(str(folder)))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(UserError, match="model.safetensors is truncated or padded"):
        check_weights(resolve_source(str(folder)))
    weights.write_bytes(b"not a safetensors file at all")
    with pytest.raises(UserError, match="is not a safetensors file"):
        check_weights(resolve_source(str(folder)))


def test_sharded_weights_need_every_shard(tiny_target, tmp_path):
    folder = _copy(tiny_target, tmp_path)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="lacks model-00002-of-00002.safetensors .* copy the target folder again"):
        check_weights(resolve_source(str(folder)))
    (folder / "model.safetensors.index.json").write_text("{")
    with pytest.raises(UserError, match="is not a safetensors index"):
        check_weights(resolve_source(str(folder)))
