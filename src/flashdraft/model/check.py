"""Check an exported draft folder without loading it: its config parses as a DFlash draft, its safetensors
file is whole (the header parses and the data runs to the last tensor's end), and every weight has the
name and shape the config implies. What promotion and evaluation read before anything is registered or
loaded."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from flashdraft.errors import UserError
from flashdraft.model.config import DFlashDraftConfig
from flashdraft.model.modeling import DFlashDraftModel

WEIGHTS = "model.safetensors"
_HEADER_LIMIT = 100 << 20  # a header larger than this is not a safetensors header


@dataclass(frozen=True)
class CheckedDraft:
    config: DFlashDraftConfig
    weights_sha256: str


def read_draft_config(folder: str | Path, key: str) -> DFlashDraftConfig:
    """The config of the draft folder that config key `key` names (for the error message)."""
    fix = "give a folder that `flashdraft draft-init` or `flashdraft train` wrote"
    if not (Path(folder) / "config.json").is_file():
        raise UserError(f"{key}: {str(folder)!r} is not a draft folder (no config.json); {fix}")
    try:
        config = DFlashDraftConfig.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as err:
        raise UserError(f"{key}: {str(folder)!r} is not a draft folder (its config.json: {err}); {fix}") from err
    if config.mask_token_id is None:
        raise UserError(f"{key}: {str(folder)!r} is not a DFlash draft (no dflash_config.mask_token_id); {fix}")
    return config


def safetensors_header(path: Path) -> dict:
    """The tensor table of a safetensors file; a UserError when the file is not one or is cut short."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise UserError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", head)
        if length > min(_HEADER_LIMIT, size - 8):
            raise UserError(f"{path} is not a safetensors file, or is cut off inside its header")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UserError(f"{path} is not a safetensors file (its header is not JSON: {err})") from err
    header.pop("__metadata__", None)
    end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
    if 8 + length + end != size:
        raise UserError(f"{path} is truncated or padded: its tensors end at byte {8 + length + end}, the file has "
                        f"{size}; write or copy it again")
    return header


def check_draft(folder: str | Path, key: str) -> CheckedDraft:
    """The config and the weights' sha256 of the draft folder `key` names, after every check of the module
    docstring."""
    folder = Path(folder)
    config = read_draft_config(folder, key)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise UserError(f"{folder} has no {WEIGHTS}; give the folder `flashdraft train` exported")
    header = safetensors_header(weights)
    with torch.device("meta"):
        expected = {name: list(t.shape) for name, t in DFlashDraftModel(config).state_dict().items()}
    found = {name: entry["shape"] for name, entry in header.items()}
    if found != expected:
        missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
        wrong = sorted(n for n in set(found) & set(expected) if found[n] != expected[n])
        raise UserError(f"{weights} does not match its config: missing {missing[:5]}, unexpected {extra[:5]}, "
                        f"wrong shapes {[(n, found[n], expected[n]) for n in wrong[:3]]}")
    digest = hashlib.sha256()
    with open(weights, "rb") as handle:
        while block := handle.read(1 << 24):
            digest.update(block)
    return CheckedDraft(config, digest.hexdigest())
