"""Materialising targets: local folders in place with hashed weights, hub ids offline, bad paths."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from flashdraft.errors import UserError
from flashdraft.target.cache import materialise


def test_local_folder_is_used_in_place(tiny_target, tmp_path):
    folder = tiny_target("llama")
    result = materialise(str(folder), tmp_path / "cache")
    assert result.path == folder.resolve()
    assert not (tmp_path / "cache").exists()  # nothing copied
    weights = result.manifest["files"]
    assert list(weights) == ["model.safetensors"]
    data = (folder / "model.safetensors").read_bytes()
    assert weights["model.safetensors"] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert result.manifest["total_bytes"] == len(data)
    assert (result.manifest["kind"], result.manifest["revision"]) == ("folder", None)


def test_bad_local_targets(tiny_target, tmp_path):
    with pytest.raises(UserError, match="revision .* applies to hub ids only"):
        materialise(str(tiny_target("llama")), tmp_path, revision="main")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no config.json"):
        materialise(str(tmp_path / "empty"), tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="not a .gguf"):
        materialise(str(tmp_path / "notes.txt"), tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        materialise(str(tmp_path / "missing"), tmp_path)


def test_unreachable_hub_id_offline(tmp_path):
    code = (
        "from flashdraft.target.cache import materialise\n"
        "from flashdraft.errors import UserError\n"
        "try:\n    materialise('no-such-org/no-such-model', 'CACHE')\n"
        "except UserError as err:\n    print('USERERROR', err)\n"
    ).replace("CACHE", str(tmp_path / "cache"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "USERERROR cannot fetch target 'no-such-org/no-such-model' from the hub" in out.stdout, out.stderr
    assert "hf download" in out.stdout
    assert not list((tmp_path / "cache").rglob("*.safetensors"))
