"""Optional second opinion: the same prompts decoded by vLLM's own DFlash speculative decoding.

vLLM (with DFlash support: speculative method "dflash") loads the draft checkpoint unchanged and runs
batch 1 (max_num_seqs=1), like our harness. Per benchmark it reports vLLM's acceptance counters (tau =
1 + accepted drafts / verify steps, and per-slot acceptance) and decode tokens/s with and without the
draft, so its speedup has its own plain baseline. Prefill is excluded the same way for both: each
prompt is also run for a single token, and that time is subtracted (prefix caching is off, so both runs
prefill in full).
"""

from __future__ import annotations

import gc
import importlib.util
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from flashdraft.data.sampling import Sampling, vllm_sampling
from flashdraft.errors import UserError
from flashdraft.target.source import TargetSource

_DRAFTS = "vllm:spec_decode_num_drafts"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise UserError("--vllm needs the vllm package (a release with DFlash speculative decoding) on a GPU "
                        "machine; install it or drop --vllm")


def _counters(llm) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for metric in llm.get_metrics():
        if metric.name in (_DRAFTS, _ACCEPTED):
            out[metric.name] = [float(metric.value)]
        elif metric.name == _PER_POSITION:
            out[metric.name] = [float(v) for v in metric.values]
    return out


def _decode(llm, prompts: Sequence[list[int]], max_new_tokens: int, params: Sampling, stop_ids: set[int],
            seed: int) -> tuple[list[list[int]], int, float]:
    """Batch-1 decoding of each prompt: (outputs, decode tokens, decode seconds)."""
    outputs, tokens, seconds = [], 0, 0.0
    for ids in prompts:
        request = [{"prompt_token_ids": list(ids)}]
        began = time.perf_counter()
        llm.generate(request, vllm_sampling(params, max_tokens=1, stop_ids=stop_ids, seed=seed), use_tqdm=False)
        prefill = time.perf_counter() - began
        began = time.perf_counter()
        sampling = vllm_sampling(params, max_tokens=max_new_tokens, stop_ids=stop_ids, seed=seed)
        (result,) = llm.generate(request, sampling, use_tqdm=False)
        total = time.perf_counter() - began
        out = list(result.outputs[0].token_ids)
        outputs.append(out)
        tokens += max(len(out) - 1, 0)
        seconds += max(total - prefill, 0.0)
    return outputs, tokens, seconds


def _run(target: TargetSource, speculative: dict | None, encoded: Mapping[str, Sequence[list[int]]],
         max_new_tokens: int, params: Sampling, stop_ids: set[int], seed: int,
         trust_remote_code: bool) -> dict[str, dict]:
    from vllm import LLM

    llm = LLM(model=target.path, revision=target.revision, trust_remote_code=trust_remote_code,
              speculative_config=speculative, max_num_seqs=1, seed=seed, enable_prefix_caching=False,
              disable_log_stats=False)
    try:
        _decode(llm, [next(iter(encoded.values()))[0]], min(max_new_tokens, 32), params, stop_ids, seed)  # warm-up
        results = {}
        for name, prompts in encoded.items():
            before = _counters(llm)
            outputs, tokens, seconds = _decode(llm, prompts, max_new_tokens, params, stop_ids, seed)
            after = _counters(llm)
            delta = {k: [a - b for a, b in zip(v, before.get(k, [0.0] * len(v)))] for k, v in after.items()}
            results[name] = {"outputs": outputs, "tokens": tokens, "seconds": seconds, "counters": delta}
        return results
    finally:
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def measure(target: TargetSource, draft: str | Path, encoded: Mapping[str, Sequence[list[int]]], *,
            max_new_tokens: int, params: Sampling, block_size: int, stop_ids: set[int],
            seed: int, trust_remote_code: bool) -> dict[str, dict]:
    """Per benchmark: vLLM's tau, per-slot acceptance, tokens/s with and without the draft, speedup."""
    require_vllm()
    speculative = {"method": "dflash", "model": str(draft), "num_speculative_tokens": block_size - 1}
    plain = _run(target, None, encoded, max_new_tokens, params, stop_ids, seed, trust_remote_code)
    spec = _run(target, speculative, encoded, max_new_tokens, params, stop_ids, seed, trust_remote_code)
    report = {}
    for name in encoded:
        s, p = spec[name], plain[name]
        drafts = (s["counters"].get(_DRAFTS) or [0.0])[0]
        accepted = (s["counters"].get(_ACCEPTED) or [0.0])[0]
        per_position = s["counters"].get(_PER_POSITION, [])
        spec_speed = s["tokens"] / s["seconds"] if s["seconds"] > 0 else None
        plain_speed = p["tokens"] / p["seconds"] if p["seconds"] > 0 else None
        report[name] = {
            "speculative": {
                "tau_pooled": 1 + accepted / drafts if drafts else None,
                "verify_steps": int(drafts),
                "slot_acceptance": [a / drafts for a in per_position] if drafts else None,
                "tokens_per_second": spec_speed,
            },
            "autoregressive": {"tokens_per_second": plain_speed},
            "speedup": spec_speed / plain_speed if spec_speed and plain_speed else None,
            # vLLM's own check: its speculative output against its plain output (bf16 kernels may part)
            "same_as_plain": (sum(a == b for a, b in zip(s["outputs"], p["outputs"], strict=True))
                              / len(s["outputs"])) if params.greedy else None,
        }
    return report
