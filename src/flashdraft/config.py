"""The one config tree: typed dataclasses, loaded from recipe YAML plus `key=value` overrides.

Unknown keys and wrong types are errors that name the field. Defaults describe a tiny CPU job; named
recipes in `flashdraft/recipes/*.yaml` override them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flashdraft.errors import UserError

RECIPES_DIR = Path(__file__).parent / "recipes"


@dataclass(kw_only=True)
class TargetConfig:
    # hub id, local HF folder, .gguf file, or packaged:smollm2 (SmolLM2-135M-Instruct from PyPI)
    name_or_path: str = "packaged:smollm2"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    # Hybrid (Mamba-2) targets: refuse to start on transformers' slow reference path.
    require_fast_path: bool = False


@dataclass(kw_only=True)
class DraftConfig:
    """Shape of a fresh draft. Unset attention/MLP sizes are copied from the target's config."""

    num_layers: int = 1
    num_taps: int | None = None  # default: one tap per draft layer (the z-lab convention)
    target_layer_ids: list[int] | None = None
    block_size: int = 16
    mask_token_id: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    max_position_embeddings: int | None = None
    hidden_size: int | None = None  # only to check: it must equal the target's
    seed: int = 0


@dataclass(kw_only=True)
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`, converting only int -> float."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except UserError as err:
                errors.append(str(err))
        raise UserError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is Any:
        return value
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise UserError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    return value


def from_dict(cls: type, data: dict, where: str = "") -> Any:
    """Build dataclass `cls` from a mapping; unknown keys and wrong types raise UserError."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        raise UserError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid keys here: {', '.join(sorted(names))}"
        )
    kwargs = {
        key: _coerce(value, hints[key], f"{where}.{key}" if where else key)
        for key, value in data.items()
    }
    return cls(**kwargs)


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def recipe_path(name: str) -> Path:
    """A recipe by name (`nemotron_nano30b_dflash`, or the short `nemotron_nano30b`) or by YAML path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise UserError(f"recipe file {name!r} does not exist")
        return path
    for candidate in (RECIPES_DIR / f"{name}.yaml", RECIPES_DIR / f"{name}_dflash.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise UserError(f"unknown recipe {name!r}; known recipes: {', '.join(known)} (or give a YAML path)")


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"override {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict:
    """`a.b=value` strings -> nested dict; values are parsed as YAML (so 3, 1e-4, [1,2], true work)."""
    data: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r} is not of the form key=value (e.g. train.max_steps=10)")
        _set_dotted(data, key.strip(), yaml.safe_load(raw))
    return data


def merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of config sections, not {type(data).__name__}")
    return data


def load_config(recipe: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- recipe YAML <- `key=value` overrides, validated."""
    data = read_yaml(recipe_path(recipe)) if recipe else {}
    return from_dict(Config, merge(data, parse_overrides(overrides or [])))
