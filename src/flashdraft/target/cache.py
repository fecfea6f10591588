"""Put a target where every later step can load it as a plain HF folder, once, and record what it is.

- A hub id is snapshotted into `<cache>/hub` (huggingface_hub's cache layout, so pods sharing the cache
  share the download): config, tokenizer, chat template and weights only. The commit is recorded.
- A local folder is used in place.
- A `.gguf` file is dequantised once into `<cache>/gguf/<sha256 of the file>/`; a rerun with the same
  file finds the folder and reuses it. The folder appears by an atomic rename, complete or not at all.

The returned manifest names the source, the revision, and each weight file's size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from flashdraft.errors import UserError
from flashdraft.files import atomic_dir, write_json
from flashdraft.target.source import TargetSource, check_weights, resolve_source

log = logging.getLogger(__name__)

CACHE_ENV = "FLASHDRAFT_CACHE"
MANIFEST_NAME = "flashdraft-target.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_HUB_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab.*",
    "merges.txt",
    "*.tiktoken",
    "*.model",
    "chat_template*",
    "*.safetensors",
    "*.safetensors.index.json",
]
# Only when a repository has no safetensors: the older pickle format.
_HUB_PICKLE_FILES = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


@dataclass(frozen=True)
class MaterialisedTarget:
    """An HF folder that loads with `from_pretrained(path)`, and the manifest describing it."""

    path: Path
    manifest: dict


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "flashdraft")


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def weight_files(folder: Path) -> dict[str, dict]:
    """{relative name: {"bytes", "sha256"}} for the weight files in a folder."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name.endswith(WEIGHT_SUFFIXES):
            files[str(path.relative_to(folder))] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return files


def materialise(
    spec: str,
    cache_dir: str | Path | None = None,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> MaterialisedTarget:
    """Resolve `spec` (hub id | folder | .gguf | packaged:NAME) to a loadable HF folder (module docstring)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    source = resolve_source(spec, revision, trust_remote_code=trust_remote_code)
    if source.gguf_file:
        return _dequantised(spec, Path(source.path) / source.gguf_file, cache / "gguf")
    if source.is_local:
        folder = Path(source.path)
        if not (folder / "config.json").is_file():
            raise UserError(f"target folder {folder} has no config.json; give an HF model folder")
        check_weights(source)
        manifest = {"source": spec, "kind": "folder", "path": str(folder), "revision": None,
                    "files": weight_files(folder)}
        return MaterialisedTarget(folder, _with_total(manifest))
    return _snapshot(spec, source.path, cache / "hub", revision, trust_remote_code)


def _with_total(manifest: dict) -> dict:
    if not manifest["files"]:
        raise UserError(f"target {manifest['source']} has no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    manifest["total_bytes"] = sum(f["bytes"] for f in manifest["files"].values())
    return manifest


def _snapshot(spec: str, repo: str, cache: Path, revision: str | None, trust_remote_code: bool) -> MaterialisedTarget:
    from huggingface_hub import snapshot_download

    patterns = _HUB_FILES + (["*.py"] if trust_remote_code else [])
    try:
        folder = Path(snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=patterns))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo, revision=revision, cache_dir=cache,
                                            allow_patterns=patterns + _HUB_PICKLE_FILES))
    except Exception as err:  # connection, offline mode, auth, missing repo or revision
        raise UserError(
            f"cannot fetch target {repo!r} from the hub ({type(err).__name__}: {err}). Offline? Download it "
            "where the hub is reachable (`hf download <id> --local-dir DIR`) and pass the folder, or pass "
            "a --cache-dir that already holds the snapshot"
        ) from err
    check_weights(TargetSource(str(folder)))
    # huggingface_hub's cache keeps each snapshot under snapshots/<commit sha>.
    manifest = {"source": spec, "kind": "hub", "path": str(folder), "repo": repo, "revision": folder.name,
                "files": weight_files(folder)}
    return MaterialisedTarget(folder, _with_total(manifest))


def _dequantised(spec: str, gguf: Path, cache: Path) -> MaterialisedTarget:
    digest = sha256_file(gguf)
    folder = cache / digest
    manifest_path = folder / MANIFEST_NAME
    if manifest_path.is_file():
        log.info("reusing dequantised %s from %s", gguf.name, folder)
        return MaterialisedTarget(folder, json.loads(manifest_path.read_text()))
    log.info("dequantising %s into %s (once)", gguf.name, folder)
    # A concurrent run that finished first is replaced by an identical folder.
    with atomic_dir(folder) as tmp:
        _write_dequantised(gguf, tmp)
        manifest = {"source": spec, "kind": "gguf", "path": str(folder), "revision": None,
                    "gguf": {"file": str(gguf), "bytes": gguf.stat().st_size, "sha256": digest},
                    "files": weight_files(tmp)}
        write_json(tmp / MANIFEST_NAME, _with_total(manifest))
    return MaterialisedTarget(folder, manifest)


def _write_dequantised(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kwargs = {"gguf_file": gguf.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        # dequantize=True unpacks every block into dense weights, so the result saves as a plain model.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True), **kwargs
        )
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read GGUF target {gguf}: {err}") from err
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
