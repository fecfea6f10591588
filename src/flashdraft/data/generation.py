"""Generation backends of the warmup: prompts (token ids) in, completions out, each prompt with its own limit
on new tokens.

    static      transformers' `generate` on left-padded batches. Every target, CPU or GPU; the only
                transformers path for hybrid (Mamba-2 / linear-attention) targets, which continuous
                batching does not serve.
    graphed     left-padded batches on one static cache, each decode step replayed as a CUDA graph
                (`flashdraft.target.batch_decoder`): no per-step host work; its layers compiled where a
                run's decode steps repay the compilation. GPUs; attention-only targets
                without sliding-window layers. The default on GPUs for those: 10x static batches on
                SmolLM2, 5.4-6.6x on a Qwen3-8B shape, one H200 (benchmarks/RESULTS.md, "Data at scale").
    continuous  transformers' continuous batching (`generate_batch`'s manager: paged attention, CUDA
                graphs): requests join and leave the running batch one by one, so short answers do not
                wait for long ones. The default on GPUs for attention-only targets with sliding windows.
    vllm        vLLM offline inference, where it is installed.

`auto` picks vllm (installed, GPU) > graphed > continuous (GPU, a target each serves) > static.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from flashdraft.data.sampling import Sampling, choose, vllm_sampling
from flashdraft.errors import UserError
from flashdraft.target.batch_decoder import (
    GRAPHED_REFUSAL,
    BatchDecoder,
    cache_layout,
    compiles_layers,
    has_sliding_window,
    kv_cache_bytes,
    static_cache,
)
from flashdraft.target.fast_path import recurrent_layers

log = logging.getLogger(__name__)

# Prompts handed to a backend per call (one resumable record each): enough to keep it busy. A static
# decode step on a GPU costs about the same host time at batch 32 as at 128 (benchmarks/RESULTS.md,
# "Data at scale"), so answers/s grow with the batch there; on a CPU the batch costs compute.
DEFAULT_BATCH = {"static": 8, "graphed": 64, "continuous": 512, "vllm": 512}
STATIC_GPU_BATCH = 64


def default_batch(backend: str, device: torch.device) -> int:
    """Prompts per generate call when warmup.batch_size is not set."""
    return STATIC_GPU_BATCH if backend == "static" and device.type == "cuda" else DEFAULT_BATCH[backend]


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # the answer, without the stop token
    finish_reason: str  # "stop" (a stop token) or "length" (the prompt's limit)


def completion(ids: Sequence[int], stop_ids: set[int], limit: int) -> Completion:
    """The answer up to its first stop token, or cut at `limit` new tokens."""
    for position, token in enumerate(ids[:limit]):
        if token in stop_ids:
            return Completion(list(ids[:position]), "stop")
    return Completion(list(ids[:limit]), "length")


def resolve_backend(backend: str, target_config, device: torch.device) -> str:
    """The backend `auto` means here, or a UserError when the asked-for one cannot serve this target."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    hybrid = bool(recurrent_layers(target_config))
    if backend == "vllm" and not has_vllm:
        raise UserError("warmup.backend vllm needs vLLM: pip install vllm (on a CUDA machine), or use continuous "
                        "or static")
    if backend == "continuous" and hybrid:
        raise UserError("warmup.backend continuous: transformers' continuous batching does not serve hybrid "
                        "(Mamba-2 / linear-attention) targets; use static (or vllm)")
    if backend == "graphed":
        if hybrid:
            raise UserError("warmup.backend graphed decodes attention-only targets (a static KV cache); this "
                            "target has Mamba-2 / linear-attention layers: use static (or vllm)")
        static_cache(target_config, 1, GRAPHED_REFUSAL)  # refuses sliding-window layers before weights load
    if backend != "auto":
        return backend
    if device.type != "cuda":
        return "static"
    if has_vllm:
        return "vllm"
    if hybrid:
        return "static"
    return "continuous" if has_sliding_window(target_config) else "graphed"


def load_generator(backend: str, path: Path, tokenizer, stop_ids: Sequence[int], *, seed: int, device: torch.device,
                   decode_steps: int, rows: int | None = None, trust_remote_code: bool = False):
    """`decode_steps`: about how many batched decode steps this process will run (batches x new tokens),
    for the graphed backend's rule on compiling its layers; `rows`: the graphed backend's rows in flight."""
    if backend == "vllm":
        return VllmGenerator(path, stop_ids, seed, trust_remote_code=trust_remote_code)
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
            trust_remote_code=trust_remote_code,
        )
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load target weights from {path}: {err}") from err
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    model = model.to(device).eval()
    if backend == "graphed":
        return GraphedGenerator(model, stop_ids, pad, compile_layers=compiles_layers(device, decode_steps), rows=rows)
    return {"static": StaticGenerator, "continuous": ContinuousGenerator}[backend](model, stop_ids, pad)


def _generation_config(sampling: Sampling, max_new_tokens: int, stop_ids: set[int], pad_id: int):
    from transformers import GenerationConfig

    sampled = not sampling.greedy
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=sampled,
        temperature=sampling.temperature if sampled else None, top_p=sampling.top_p if sampled else None,
        top_k=sampling.top_k if sampled else None, eos_token_id=sorted(stop_ids), pad_token_id=pad_id,
    )


class StaticGenerator:
    """Batched `generate` with left padding and a KV cache; a batch runs to its longest limit, and each
    answer is cut at its own (tokens before the cut do not depend on the ones after it)."""

    def __init__(self, model, stop_ids: Sequence[int], pad_id: int):
        self.model, self.stop_ids, self.pad_id = model, set(stop_ids), pad_id

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, limits: Sequence[int],
                 seeds: Sequence[int]) -> list[Completion]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        config = _generation_config(sampling, max(limits), self.stop_ids, self.pad_id)
        # One seed per batch: batches are fixed, so a resumed run draws the same samples.
        torch.manual_seed(seeds[0])
        device = self.model.device
        out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                  generation_config=config)
        return [completion(row[width:].tolist(), self.stop_ids, limit) for row, limit in zip(out.cpu(), limits)]

    def close(self) -> None:
        pass


class GraphedGenerator:
    """Static-cache batches with CUDA-graph decode steps (`BatchDecoder`); answers as StaticGenerator's.
    `rows`: at most this many of a call's prompts decode at once, a finished row taking the next."""

    def __init__(self, model, stop_ids: Sequence[int], pad_id: int, compile_layers: bool = False,
                 rows: int | None = None):
        self.decoder = BatchDecoder(model, pad_id, compile_layers=compile_layers)
        self.stop_ids, self.rows = set(stop_ids), rows

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, limits: Sequence[int],
                 seeds: Sequence[int]) -> list[Completion]:
        # One seed per batch: batches are fixed, so a resumed run draws the same samples.
        generator = torch.Generator(self.decoder.device).manual_seed(seeds[0])
        try:
            rows = self.decoder.decode(prompts, limits, sorted(self.stop_ids),
                                       lambda logits: choose(logits, sampling, generator)[0], rows=self.rows)
        except torch.OutOfMemoryError as err:
            # One static cache holds every row in flight at the longest prompt plus its limit.
            in_flight, ring = cache_layout(prompts, limits, self.rows)
            cache = kv_cache_bytes(self.decoder.model.config, in_flight * ring, self.decoder.model.dtype)
            raise UserError(
                f"warmup.backend graphed ran out of GPU memory on {in_flight} rows of a batch of {len(prompts)} "
                f"prompts, each row holding up to {ring} tokens of prompt and answer (a {cache / 2**30:.1f} GiB KV "
                "cache, besides the prefill's activations); lower warmup.rows, warmup.batch_size or "
                "warmup.max_length (in a new output folder: each changes the batches), or use warmup.backend "
                "continuous"
            ) from err
        return [completion(row, self.stop_ids, limit) for row, limit in zip(rows, limits)]

    def close(self) -> None:
        pass


class ContinuousGenerator:
    """transformers' continuous-batching manager, kept running across calls (its CUDA graphs and paged
    cache are built once); restarted only when the sampling settings change."""

    def __init__(self, model, stop_ids: Sequence[int], pad_id: int):
        self.model, self.stop_ids, self.pad_id = model, set(stop_ids), pad_id
        self.manager, self.sampling, self.requests = None, None, 0

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, limits: Sequence[int],
                 seeds: Sequence[int]) -> list[Completion]:
        if self.manager is None or sampling != self.sampling:
            self.close()
            torch.manual_seed(seeds[0])
            config = _generation_config(sampling, max(limits), self.stop_ids, self.pad_id)
            self.manager = self.model.init_continuous_batching(generation_config=config)
            self.manager.start()
            self.sampling = sampling
        ids = []
        for prompt, limit in zip(prompts, limits):
            self.requests += 1
            ids.append(f"r{self.requests}")
            self.manager.add_request(list(prompt), request_id=ids[-1], max_new_tokens=limit)
        results: dict[str, list[int]] = {}
        while len(results) < len(ids):
            result = self.manager.get_result(timeout=1)
            if result is None:
                if not self.manager.is_running():
                    raise RuntimeError("transformers' continuous batching stopped before answering every prompt")
                continue
            if result.is_finished():
                if result.error is not None:
                    raise RuntimeError(f"continuous batching failed a request: {result.error}")
                results[result.request_id] = result.generated_tokens
        return [completion(results[i], self.stop_ids, limit) for i, limit in zip(ids, limits)]

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True, timeout=30)
            self.manager = None


class VllmGenerator:
    """vLLM offline inference on token-id prompts, with one sampling seed per request."""

    def __init__(self, model_path: str | Path, stop_ids: Sequence[int], seed: int, trust_remote_code: bool = False):
        from vllm import LLM

        self.llm = LLM(model=str(model_path), seed=seed, trust_remote_code=trust_remote_code)
        self.stop_ids = set(stop_ids)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sampling, limits: Sequence[int],
                 seeds: Sequence[int]) -> list[Completion]:
        params = [vllm_sampling(sampling, max_tokens=limit, stop_ids=self.stop_ids, seed=seed)
                  for limit, seed in zip(limits, seeds)]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        completions = []
        for output in outputs:
            ids = list(output.outputs[0].token_ids)
            if ids and ids[-1] in self.stop_ids:
                ids.pop()
            completions.append(Completion(ids, "stop" if output.outputs[0].finish_reason == "stop" else "length"))
        return completions

    def close(self) -> None:
        pass
