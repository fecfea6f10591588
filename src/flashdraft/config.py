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
    # A draft folder written by `flashdraft draft-init` (or an exported draft) to start training from;
    # None: the trainer builds a fresh draft from the fields above.
    init_from: str | None = None


def _at_least(section: Any, name: str, **minimums: float) -> None:
    for key, minimum in minimums.items():
        value = getattr(section, key)
        if value < minimum:
            raise UserError(f"{name}.{key} must be >= {minimum}, got {value}")


@dataclass(kw_only=True)
class DataConfig:
    """Chat datasets (OpenAI `messages` rows); specs as in `flashdraft.data.sources`."""

    train: str | list[str] = "packaged:chitchat"
    eval: str | list[str] | None = None  # held-out specs; None: hold out `eval_samples` train rows
    eval_samples: int = 0
    limit: int | None = None  # rows of the train mixture (None: all)
    max_length: int = 256  # tokens per sample; longer conversations are truncated
    # Pad each batch's length up to a multiple of this, so compiled GPU kernels see few shapes.
    pad_to_multiple: int = 1
    seed: int = 0  # mixture subsets, hold-out split and the per-epoch shuffle

    def __post_init__(self) -> None:
        _at_least(self, "data", eval_samples=0, max_length=2, pad_to_multiple=1)
        if self.limit is not None:
            _at_least(self, "data", limit=1)


@dataclass(kw_only=True)
class StrategyConfig:
    name: str = "dflash"  # dflash (more in flashdraft.objectives.STRATEGIES)
    num_anchors: int = 16  # blocks per sample and step
    gamma: float | None = None  # decay of the slot weights exp(-(k-1)/gamma); None: the block-size rule
    attention: str = "auto"  # flex | sdpa | auto (flex on CUDA; sdpa with a dense mask elsewhere)
    lm_head_chunk: int = 1024  # tokens per LM-head chunk; 0 = full logits (memory hungry)
    # dflash: torch.compile every draft layer (fuses norms, rotary, activations). Costs a compile per
    # padded batch length on the first steps, so it pays off in long runs of large drafts.
    compile_layers: bool = False
    # mdlm / hybrid (diffusion LMs): the model itself is trained; see strategies/mdlm.py, hybrid.py.
    mask_token_id: int | None = None  # None: the tokenizer's mask token
    mdlm_eps: float = 1e-3  # mask probability p = (1 - eps) t + eps, t ~ U(0, 1)
    allow_causal_model: bool = False  # mdlm: train a causal-only model type bidirectionally anyway
    alpha: float = 1.0  # hybrid: loss = alpha * diffusion + autoregressive
    masking: str = "uniform"  # hybrid: uniform (one t per sample) | block (one t per mask_block_size tokens)
    mask_block_size: int = 32

    def __post_init__(self) -> None:
        _at_least(self, "strategy", num_anchors=1, lm_head_chunk=0, alpha=0.0, mask_block_size=1)
        if not 0.0 < self.mdlm_eps < 1.0:
            raise UserError(f"strategy.mdlm_eps must be in (0, 1), got {self.mdlm_eps}")
        if self.masking not in ("uniform", "block"):
            raise UserError(f"strategy.masking: expected uniform or block, got {self.masking!r}")
        if self.attention not in ("auto", "flex", "sdpa"):
            raise UserError(f"strategy.attention: expected auto, flex or sdpa, got {self.attention!r}")
        if self.gamma is not None and not self.gamma > 0:
            raise UserError(f"strategy.gamma must be > 0 (or null for the block-size rule), got {self.gamma}")


@dataclass(kw_only=True)
class TrainConfig:
    output_dir: str = "runs/train"
    seed: int = 0
    micro_batch_size: int = 1  # samples per rank and forward
    grad_accum_steps: int = 1
    epochs: int = 1
    max_steps: int | None = None  # stops earlier than `epochs` when set
    lr: float = 6e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    warmup_ratio: float = 0.04
    warmup_steps: int | None = None  # overrides warmup_ratio when set
    grad_clip: float = 1.0
    eval_every: int = 0  # steps between evaluations (0: only after the last step)
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 1
    shard_target: bool = False  # FSDP2-shard the frozen target's layers instead of replicating it
    peak_tflops: float = 780.0  # one accelerator's dense bf16 matmul rate (H200, measured), for MFU

    def __post_init__(self) -> None:
        _at_least(self, "train", micro_batch_size=1, grad_accum_steps=1, epochs=1, eval_every=0,
                  checkpoint_every=1, keep_checkpoints=1, log_every=1, grad_clip=0.0)
        if self.max_steps is not None:
            _at_least(self, "train", max_steps=1)
        if self.warmup_steps is not None:
            _at_least(self, "train", warmup_steps=0)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise UserError(f"train.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not self.lr > 0:
            raise UserError(f"train.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise UserError(f"train.betas must be two numbers in [0, 1), got {self.betas}")


@dataclass(kw_only=True)
class TrackingConfig:
    uri: str | None = None  # MLflow tracking URI; None: MLFLOW_TRACKING_URI, or no tracking
    experiment: str | None = None


@dataclass(kw_only=True)
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`, converting only int -> float."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except UserError:
                pass  # try the next member of the union; the error below names them all
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
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads exponents without a dot (6e-4) as strings.
        try:
            return float(value)
        except ValueError:
            pass
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
