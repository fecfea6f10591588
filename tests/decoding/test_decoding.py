"""Speculative decoding is lossless and counts acceptance right (tiny llama / qwen3 / nemotron_h, fp32).

References: transformers' own greedy `generate` (independent of our harness) and, for the loop as a
whole, the z-lab `dflash.model.dflash_generate`. Proposers: a random draft (tau ~ 1), an oracle that
proposes the target's own greedy continuation (tau == B), and a noisy oracle (partial accepts of every
length, which is what exercises the cache crop and the Mamba state rollback).
"""

from __future__ import annotations


import pytest
import torch

from flashdraft.errors import UserError
from flashdraft.decoding.decoding import generate
from flashdraft.decoding.hybrid_cache import RecurrentStates
from flashdraft.decoding.proposers import DraftProposer
from flashdraft.decoding.target_runner import TargetRunner
from decoding_helpers import NEW, PROMPT_LEN, OracleProposer, hf_greedy, make_draft, make_target, prompt, run_spec


@pytest.fixture(autouse=True)
def _one_thread():
    # Batch-1 decoding is many tiny ops: on a shared 2-core machine a second thread only spins.
    torch.set_num_threads(1)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "nemotron_h"])
def test_random_draft_is_lossless(model_type):
    target = make_target(model_type)
    ids = prompt()
    reference = hf_greedy(target, ids, NEW)
    assert len(set(reference)) > 5, "the tiny target should not just repeat itself"
    plain = generate(TargetRunner(target, [], PROMPT_LEN + NEW + 1), ids, max_new_tokens=NEW)
    assert plain.tokens == reference
    draft = make_draft(target, block_size=5)
    spec = run_spec(target, DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings()), ids)
    assert spec.tokens == reference
    assert sum(spec.emitted) == NEW - 1 and len(spec.emitted) == len(spec.accepted)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "nemotron_h"])
def test_oracle_accepts_whole_blocks(model_type):
    target = make_target(model_type)
    ids = prompt(1)
    block = 6
    reference = hf_greedy(target, ids, NEW + block)
    spec = run_spec(target, OracleProposer(reference, block, target.config.vocab_size), ids)
    assert spec.tokens == reference[:NEW]
    # Every step but the last emits the whole block: B-1 drafts + the bonus.
    assert spec.emitted[:-1] == [block] * (len(spec.emitted) - 1)
    assert spec.accepted == [block - 1] * len(spec.accepted)
    assert spec.emitted[-1] == (NEW - 1) - block * (len(spec.emitted) - 1)


@pytest.mark.parametrize("model_type,block", [("llama", 5), ("qwen3", 5), ("nemotron_h", 5), ("nemotron_h", 11)])
def test_partial_accepts_are_lossless(model_type, block):
    # nemotron_h with block 11 > its Mamba chunk size 8: the verify and the replay span two chunks.
    target = make_target(model_type)
    ids = prompt(2)
    new = 40
    reference = hf_greedy(target, ids, new + block)
    oracle = OracleProposer(reference, block, target.config.vocab_size, noise=0.3, seed=3)
    spec = run_spec(target, oracle, ids, new=new)
    assert spec.tokens == reference[:new]
    assert len(set(spec.accepted[:-1])) >= 3, f"want accepts of several lengths, got {spec.accepted}"


def test_hybrid_without_state_rollback_is_wrong(monkeypatch):
    """The rollback is what makes the hybrid lossless: skipping the replay changes the output."""
    target = make_target("nemotron_h")
    ids = prompt(2)
    block, new = 5, 40
    reference = hf_greedy(target, ids, new + block)
    monkeypatch.setattr(RecurrentStates, "commit", lambda self, kept, forwarded, graphs=None: self._save())
    spec = run_spec(target, OracleProposer(reference, block, target.config.vocab_size, noise=0.3, seed=3), ids, new=new)
    assert spec.tokens != reference[:new]


def test_stop_token_ends_both_loops_at_the_same_place():
    target = make_target("qwen3")
    ids = prompt()
    reference = hf_greedy(target, ids, NEW)
    stop = reference[7]
    cut = reference[: reference.index(stop) + 1]
    plain = generate(TargetRunner(target, [], PROMPT_LEN + NEW + 1), ids, max_new_tokens=NEW,
                                    stop_ids={stop})
    oracle = OracleProposer(reference + [0] * 8, 4, target.config.vocab_size)
    runner = TargetRunner(target, [1, 2, 4], PROMPT_LEN + NEW + 8)
    spec = generate(runner, ids, proposer=oracle, max_new_tokens=NEW, stop_ids={stop})
    assert plain.tokens == spec.tokens == cut


def test_max_new_tokens_must_be_positive():
    target = make_target("llama")
    with pytest.raises(UserError, match="max-new-tokens"):
        generate(TargetRunner(target, [], 32), prompt(), max_new_tokens=0)
    draft = make_draft(target, 4)
    with pytest.raises(UserError, match="max-new-tokens"):
        run_spec(target, DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings()),
                 prompt(), new=-1)


def _record_target_inputs(target):
    seen = []

    def keep(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        seen.append(ids[0].tolist())

    return seen, target.register_forward_pre_hook(keep, with_kwargs=True)


@pytest.mark.parametrize("block", [4, 7])
def test_matches_zlab_dflash_generate_token_for_token(tmp_path, block):
    zlab = pytest.importorskip("dflash.model", reason="the z-lab reference (pip install --no-deps dflash==0.1.0)")
    target = make_target("qwen3")
    draft = make_draft(target, block_size=block)
    draft.save_pretrained(tmp_path / "draft")
    ref_draft = zlab.DFlashDraftModel.from_pretrained(tmp_path / "draft").eval()
    ids = prompt(4)

    seen, hook = _record_target_inputs(target)
    theirs = zlab.dflash_generate(ref_draft, target, ids, max_new_tokens=NEW, stop_token_ids=None,
                                  return_stats=False)
    their_blocks = seen[1:]  # after the prefill: one verify forward per step, [anchor, drafts...]
    seen.clear()
    ours = run_spec(target, DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings()), ids)
    hook.remove()
    our_blocks = seen[1:]

    assert ours.tokens == theirs[0, PROMPT_LEN:].tolist()
    # Same drafts at every step. Near the length limit z-lab shortens its block (and so changes the
    # drafts); compare the full-length ones, which are all but the last few.
    assert len(our_blocks) == len(their_blocks)
    full = [i for i, b in enumerate(their_blocks) if len(b) == block]
    assert len(full) >= len(their_blocks) - block
    assert [our_blocks[i] for i in full] == [their_blocks[i] for i in full]
