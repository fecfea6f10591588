"""Tiny targets, drafts and proposers shared by the decoding tests (fp32, CPU)."""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM

from flashdraft.decoding.decoding import generate
from flashdraft.decoding.proposers import DraftProposer
from flashdraft.decoding.target_runner import TargetRunner
from flashdraft.model import DFlashDraftConfig, DFlashDraftModel
from tiny_models import tiny_config

PROMPT_LEN, NEW = 9, 24
# Larger init for llama/qwen3: the default makes tiny random models repeat one token forever.
INIT_RANGE = {"llama": 0.3, "qwen3": 0.3, "nemotron_h": 0.02}


def make_target(model_type: str, seed: int = 0, heads: int = 4):
    config = tiny_config(model_type, heads=heads)
    config.initializer_range = INIT_RANGE[model_type]
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def make_draft(target, block_size: int, seed: int = 1, heads: int = 4) -> DFlashDraftModel:
    config = target.config
    torch.manual_seed(seed)
    draft_config = DFlashDraftConfig(
        hidden_size=config.hidden_size, vocab_size=config.vocab_size, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=2, head_dim=16, intermediate_size=96,
        num_target_layers=config.num_hidden_layers, max_position_embeddings=512,
        dflash_config={"mask_token_id": 3, "target_layer_ids": [1, 2, 4], "block_size": block_size},
    )
    return DFlashDraftModel(draft_config).eval()


def loops(target, draft: DFlashDraftModel, max_len: int) -> tuple[TargetRunner, TargetRunner, DraftProposer]:
    """(plain runner, speculative runner tapping the draft's layers, the draft's proposer) over `max_len`
    cache slots, as evaluate builds them."""
    return (TargetRunner(target, [], max_len), TargetRunner(target, draft.target_layer_ids, max_len),
            DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings()))


def qwen3_case(block: int, device: torch.device = torch.device("cpu"), heads: int = 4):
    """(target, draft, prompt, the target's eager greedy continuation of NEW + block tokens, cache slots for
    NEW new tokens): the tiny qwen3 setup of the fast-path tests (target and draft: `heads` query heads
    over two key/value heads), on `device`."""
    target = make_target("qwen3", heads=heads).to(device)
    ids = prompt().to(device)
    reference = hf_greedy(target, ids, NEW + block)
    draft = make_draft(target, block_size=block, heads=heads).to(device)
    return target, draft, ids, reference, ids.shape[1] + NEW + block + 1


def eager_sdpa_calls(monkeypatch) -> list[int]:
    """The query lengths of transformers' sdpa calls that `FlexDecodeAttention` passes on outside compiled
    code (prefills; a compiled step that fell back to eager). Compiled calls are not recorded: a list
    written while tracing would be guarded on and recompile every step."""
    from flashdraft.target import flex_decode

    calls, sdpa = [], flex_decode.sdpa_attention_forward

    def counted(*args, **kwargs):
        if not torch.compiler.is_compiling():
            calls.append(args[1].shape[2])
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(flex_decode, "sdpa_attention_forward", counted)
    return calls


def compiled_attention(fn):
    """(fn(), the attention ops, of "flex_attention" and "scaled_dot_product", in the code inductor
    compiled while fn ran: none when it compiled nothing. Reset dynamo before the first call: a model of
    the same shapes compiled earlier in the process passes its graphs' guards, so nothing new compiles)."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    codes = []  # torch._inductor.utils.run_and_get_code does this too, but resets dynamo first
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        result = fn()
    return result, {op for op in ("flex_attention", "scaled_dot_product") if any(op in code for code in codes)}


def prompt(seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 260, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))


def hf_greedy(model, ids: torch.Tensor, new: int) -> list[int]:
    out = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


class OracleProposer:
    """Proposes the target's greedy continuation `reference`; with `noise`, each draft is wrong with that
    probability (a wrong draft is the reference token + 1), so accepts of every length happen."""

    def __init__(self, reference: list[int], block_size: int, vocab: int, noise: float = 0.0, seed: int = 0):
        self.reference, self.block_size, self.vocab, self.noise = reference, block_size, vocab, noise
        self.rng = random.Random(seed)

    def reset(self, max_len: int) -> None:
        pass

    def propose(self, anchor, start, context, valid) -> torch.Tensor:
        offset = int(start) - PROMPT_LEN  # the anchor is new token number `offset`
        logits = torch.zeros(1, self.block_size - 1, self.vocab)
        for slot in range(1, self.block_size):
            i = offset + slot
            token = self.reference[i] if i < len(self.reference) else 0
            if self.rng.random() < self.noise:
                token = (token + 1) % self.vocab
            logits[0, slot - 1, token] = 1.0
        return logits


def run_spec(target, proposer, ids, new=NEW, tap_ids=(1, 2, 4)):
    runner = TargetRunner(target, list(tap_ids), ids.shape[1] + new + proposer.block_size + 1)
    return generate(runner, ids, proposer=proposer, max_new_tokens=new)
