"""Baseline in the same run: transformers' prompt-lookup decoding (n-gram drafts from the prompt).

It runs inside `generate`, so we measure it from outside: a hook on the model's forward counts the
forwards and marks the end of the first one (the prefill, which also verifies the first lookup).
Every forward emits its accepted candidates + 1, so tau = new tokens / forwards exactly; decode
tokens/s counts the tokens after the first one over the time after the first forward.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import torch
from torch import nn

from flashdraft.data.sampling import Sampling

LOOKUP_TOKENS = 10


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def prompt_lookup(
    model: nn.Module,
    prompts: Sequence[torch.Tensor],
    *,
    max_new_tokens: int,
    params: Sampling,
    stop_ids: Collection[int],
    pad_id: int,
) -> dict:
    """Decode tokens/s and tau of prompt-lookup decoding over the prompts, or the reason it cannot run."""
    device = model.get_input_embeddings().weight.device
    state = {"calls": 0, "prefill_end": 0.0}

    def count(_module, _args, _output):
        state["calls"] += 1
        if state["calls"] == 1:
            state["prefill_end"] = _sync(device)

    sampling = (
        {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or None}
        if not params.greedy
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    handle = model.register_forward_hook(count)
    tokens = steps = new = 0
    seconds = 0.0
    try:
        for ids in prompts:
            state["calls"] = 0
            out = model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                prompt_lookup_num_tokens=LOOKUP_TOKENS,
                eos_token_id=sorted(stop_ids) or None,
                pad_token_id=pad_id,
                **sampling,
            )
            seconds += _sync(device) - state["prefill_end"]
            new += out.shape[1] - ids.shape[1]
            tokens += max(out.shape[1] - ids.shape[1] - 1, 0)
            steps += state["calls"]
    except (ValueError, RuntimeError, NotImplementedError) as err:
        # e.g. hybrid (Mamba) targets before transformers 5.25: its assisted decoding refused stateful models.
        return {"supported": False, "reason": f"{type(err).__name__}: {err}"}
    finally:
        handle.remove()
    return {
        "supported": True,
        "lookup_tokens": LOOKUP_TOKENS,
        "decode_tokens": tokens,
        "decode_seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "tau_pooled": new / steps if steps else None,
        "forwards": steps,
    }
