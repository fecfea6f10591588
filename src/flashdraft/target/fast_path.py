"""Hybrid targets (Mamba-2 / linear-attention layers): which layers are recurrent, and whether the fused
kernels that make them fast import here."""

from __future__ import annotations

from flashdraft.errors import UserError

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
