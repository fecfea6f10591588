"""The blocks training scores are the blocks decoding drafts: at every speculative step, the proposer's logits
equal the DFlash objective's for a block anchored at the same position of the finished sequence. Training
builds each block from one target forward over the whole sequence and a block-sparse mask; decoding from
features gathered step by step in caches. A mismatch (a tap, a position, a context one token too long or
short) keeps decoding lossless while it caps tau below what training measures, so only this catches it."""

from __future__ import annotations

import pytest
import torch

from decoding_helpers import OracleProposer, hf_greedy, prompt, run_spec
from dflash_helpers import make_objective
from flashdraft.data import Batch
from flashdraft.decoding.proposers import DraftProposer
from flashdraft.objectives.dflash import DFlashPrepared

NEW = 40


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_decoding_drafts_the_blocks_training_scores(tiny_target, model_type):
    objective, draft = make_objective(tiny_target(model_type))
    draft.eval()
    target = objective.target.model
    proposer = DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings())
    ids = prompt()
    # A random draft accepts nothing, so every context would be one token: the step proposes an oracle's
    # noisy greedy continuation instead (accepts of every length), after recording the draft's own logits.
    oracle = OracleProposer(hf_greedy(target, ids, NEW + objective.block_size), objective.block_size,
                            target.config.vocab_size, noise=0.3)
    steps = []  # (anchor position, the draft's logits for slots 1..B-1)
    propose = proposer.propose

    def recorded(anchor, start, context, valid):
        steps.append((int(start), propose(anchor, start, context, valid)[0].clone()))
        return oracle.propose(anchor, start, context, valid)

    proposer.propose = recorded
    with torch.no_grad():
        result = run_spec(target, proposer, ids, new=NEW, tap_ids=draft.target_layer_ids)
    assert set(result.accepted) == set(range(objective.block_size))  # contexts of every length

    sequence = torch.cat([ids[0], torch.tensor(result.tokens)])[None]
    anchors = torch.tensor([[start for start, _ in steps]])
    ones = torch.ones_like(sequence)
    size = objective.block_size
    prepared = DFlashPrepared(
        Batch(sequence, ones, ones.bool(), torch.zeros(1, dtype=torch.long)), anchors,
        torch.ones_like(anchors, dtype=torch.bool), torch.zeros(1, anchors.shape[1], size, dtype=torch.long),
        torch.zeros(1, anchors.shape[1], size, dtype=torch.bool), objective.weights)
    with torch.no_grad():
        hidden = objective.block_hidden(draft, prepared).view(anchors.shape[1], size, -1)
        trained = objective.target.lm_head(hidden[:, 1:])
    for (start, decoded), scored in zip(steps, trained):
        torch.testing.assert_close(decoded, scored, atol=1e-4, rtol=1e-4, msg=f"block anchored at {start}")
