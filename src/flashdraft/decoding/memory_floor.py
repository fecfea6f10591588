"""How fast a decoding step could be: the bytes it must read over the device's measured bandwidth.

At batch 1 a step reads every weight it multiplies by once, and little else, so no engine beats
(weight bytes / memory bandwidth). Reporting a measured step next to that floor says how much of a
speedup comes from a slow baseline: a plain decoder at 3x its floor makes every speculative speedup
look up to 3x better than on a good engine.
"""

from __future__ import annotations

import time

import torch
from torch import nn


def parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def target_step_bytes(model: nn.Module) -> int:
    """Weight bytes one forward of a causal LM reads: every parameter except the input embedding table,
    of which only the looked-up rows are read (unless the output head is the same tensor)."""
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    gathered = 0 if head is not None and head.weight is embeddings.weight else parameter_bytes(embeddings)
    return parameter_bytes(model) - gathered


def speculative_step_bytes(target: nn.Module, draft: nn.Module) -> int:
    """One draft + verify step: the target's forward, the draft's layers, and the target's output head a
    second time (the draft's logits)."""
    return target_step_bytes(target) + parameter_bytes(draft) + parameter_bytes(target.get_output_embeddings())


def copy_bandwidth(device: torch.device, size: int | None = None, repeats: int = 5) -> float:
    """Bytes per second that a device-to-device copy moves (reads + writes): the best of `repeats`.

    The default size (256 MiB on a GPU, 64 MiB elsewhere) is far beyond any cache (an H200's L2 holds
    50 MB), so the copy runs at the memory's own speed, and small beside a loaded target: evaluation
    measures it with the target and draft already on the device.
    """
    size = size or (2**28 if device.type == "cuda" else 2**26)
    source = torch.empty(size // 2, dtype=torch.int16, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats + 1):  # the first copy also pays for first-touch of the pages
        _sync(device)
        began = time.perf_counter()
        target.copy_(source)
        _sync(device)
        best = min(best, time.perf_counter() - began)
    return 2 * size / best


def floor_ms(read_bytes: int, bandwidth: float) -> float:
    """The fastest a step that reads `read_bytes` can be, in milliseconds."""
    return 1000 * read_bytes / bandwidth


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
