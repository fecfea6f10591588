"""The decoding harness that evaluate times: a target and a draft loaded for batch-1 decoding, both loops'
runners and CUDA graphs, and the GPU fast path entered around the loops.

One place builds it, so a benchmark that takes a step apart (`benchmarks/spec_step_breakdown.py`) times the
very steps evaluate's speedups come from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedConfig

from flashdraft.config import TargetConfig
from flashdraft.decoding.proposers import DraftProposer
from flashdraft.decoding.target_runner import TargetRunner, check_target
from flashdraft.model import DFlashDraftConfig, DFlashDraftModel
from flashdraft.model.check import check_draft, read_draft_config
from flashdraft.target.compiled_layers import CompiledLayers, compiles_by_default
from flashdraft.target.flex_decode import FlexDecodeAttention, flex_decodes
from flashdraft.target.frozen import FrozenTarget, decoder_layers
from flashdraft.target.fused_projections import FusedProjections
from flashdraft.target.source import TargetSource, check_draft_fits, check_weights, load_target_config, source_of
from flashdraft.target.step_graphs import StepGraphs


def target_attention(dtype: torch.dtype, device: torch.device) -> str:
    """The target's attention implementation for the decoding loops: eager for float32 on a GPU, else sdpa.

    sdpa has no flash kernel for float32, and its memory-efficient one gives a one-token step a single
    block per head over the whole static cache: 66 us a layer on an H200 (SmolLM2 shape, ~800 cached
    positions; bf16 flash: 5 us), most of a float32 step. Eager attention is two matmuls and a softmax,
    which the compiled layers fuse.
    """
    return "eager" if dtype == torch.float32 and device.type == "cuda" else "sdpa"


def check_pair(target: TargetConfig, draft: Path, key: str) -> tuple[TargetSource, DFlashDraftConfig,
                                                                     PreTrainedConfig]:
    """Everything that can be wrong with a target and a draft (named by config key `key`), checked before
    any weights load; returns the target's source and the draft's and the target's configs."""
    draft_config = read_draft_config(draft, key)
    source = source_of(target)
    check_weights(source)
    target_config = load_target_config(source, trust_remote_code=target.trust_remote_code)
    check_draft_fits(draft_config, target_config)
    check_draft(draft, key)  # whole weights of the right shapes
    check_target(target_config)
    return source, draft_config, target_config


def flex_decode_for(max_len: int, proposer: DraftProposer, device: torch.device) -> FlexDecodeAttention:
    """The fast path's flex attention for loops over sequences of `max_len` tokens: over the target's cache
    and the draft's, one block longer."""
    return FlexDecodeAttention({max_len, proposer.cache_slots(max_len)}, device)


@dataclass
class DecodingHarness:
    """What both loops of one evaluation share; `fast()` enters the fast path around them."""

    frozen: FrozenTarget
    draft: DFlashDraftModel
    attention: str
    spec_runner: TargetRunner
    plain_runner: TargetRunner
    proposer: DraftProposer
    spec_graphs: StepGraphs
    plain_graphs: StepGraphs
    compiled: bool
    fast_path: list

    @property
    def model(self) -> nn.Module:
        return self.frozen.model

    @property
    def hybrid(self) -> bool:
        return self.spec_runner.recurrent is not None

    @property
    def fused_projection_groups(self) -> int:
        return next((part.groups for part in self.fast_path if isinstance(part, FusedProjections)), 0)

    @property
    def flex_decode_attention(self) -> bool:
        return any(isinstance(part, FlexDecodeAttention) for part in self.fast_path)

    @contextlib.contextmanager
    def fast(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for part in self.fast_path:
                stack.enter_context(part)
            yield

    @classmethod
    def load(cls, source: TargetSource, draft: Path, *, dtype: torch.dtype, device: torch.device,
             trust_remote_code: bool, max_len: int, block: int, compile: bool | None,
             cuda_graphs: bool) -> DecodingHarness:
        """Load the target and the draft (both checked by the caller) for sequences of up to `max_len`
        tokens; `compile` None: the device's default (`compiles_by_default`)."""
        attention = target_attention(dtype, device)
        frozen = FrozenTarget.load(source, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                                   attn_implementation=attention)
        draft_model = DFlashDraftModel.from_pretrained(str(draft), dtype=dtype).to(device).eval()
        model = frozen.model
        spec_runner = TargetRunner(model, draft_model.target_layer_ids, max_len)
        compiled = compiles_by_default(device, spec_runner.recurrent is not None) if compile is None else compile
        proposer = DraftProposer(draft_model, frozen.embedding, frozen.lm_head, block)
        # Our loops run the compiled layers, with the target's q/k/v and gate/up read by one matmul each and,
        # on sdpa, the steps' attention (the draft's too) as one flex-attention decoding kernel a layer where
        # inductor has one for the target's head grouping (each measured faster on a GPU, RESULTS.md
        # sections 7 and 8).
        fast_path: list = []
        if compiled:
            fast_path.append(FusedProjections(model))
            if attention == "sdpa" and flex_decodes(model.config, block):
                fast_path.append(flex_decode_for(max_len, proposer, device))
            fast_path.append(CompiledLayers([*decoder_layers(model), *draft_model.layers], lengths={1, block}))
        return cls(frozen=frozen, draft=draft_model, attention=attention, spec_runner=spec_runner,
                   plain_runner=TargetRunner(model, [], max_len), proposer=proposer,
                   spec_graphs=StepGraphs.for_device(device, cuda_graphs),
                   plain_graphs=StepGraphs.for_device(device, cuda_graphs), compiled=compiled, fast_path=fast_path)
