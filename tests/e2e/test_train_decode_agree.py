"""The draft sees the same thing in training as in speculative decoding.

A drafted block's logits in `generate` (with a proposer) (context features from the prefill and the verify
passes, the draft's KV cache) must equal the logits the training forward computes for a block anchored
at the same position of the finished sequence (one target forward over it, the block-sparse mask). If
they did not, the held-out tau of training would promise an acceptance that decoding cannot reach.
"""

from __future__ import annotations

import pytest
import torch

from flashdraft.config import Config, from_dict
from flashdraft.data import Batch
from flashdraft.decoding.proposers import DraftProposer
from flashdraft.objectives.dflash import DFlashObjective
from flashdraft.target.frozen import FrozenTarget
from decoding_helpers import PROMPT_LEN, make_draft, make_target, prompt, run_spec


class RecordingProposer(DraftProposer):
    """The real proposer, keeping (anchor position, drafted logits) of every step."""

    def reset(self, max_len: int) -> None:
        super().reset(max_len)
        self.steps = []

    def propose(self, anchor, start, context, valid):
        logits = super().propose(anchor, start, context, valid)
        self.steps.append((int(start), logits[0].clone()))
        return logits


@pytest.mark.parametrize("model_type", ["qwen3", "nemotron_h"])
def test_drafted_blocks_equal_the_training_forward(model_type):
    torch.set_num_threads(1)
    block = 8
    target = make_target(model_type)
    draft = make_draft(target, block)
    proposer = RecordingProposer(draft, target.get_input_embeddings(), target.get_output_embeddings())
    ids = prompt(3)
    result = run_spec(target, proposer, ids, new=30)
    assert len(proposer.steps) >= 4

    sequence = torch.cat([ids[0], torch.tensor(result.tokens)])[None]
    config = from_dict(Config, {"objective": {"attention": "sdpa"}})
    objective = DFlashObjective(config, draft.config, target.config)
    objective.use_device(torch.device("cpu"))
    objective.bind(draft, FrozenTarget(target))
    anchors = torch.tensor([[start for start, _ in proposer.steps]])
    length = sequence.shape[1]
    # Blocks near the end reach past the sequence: pad it (a block reads only its anchor token and
    # context before the anchor, so the padding changes no logits).
    padded = torch.nn.functional.pad(sequence, (0, block))
    batch = Batch(padded, (torch.arange(length + block) < length).long()[None],
                  torch.zeros_like(padded, dtype=torch.bool), torch.tensor([0]))
    prepared = objective.prepare(batch, step=0)  # only for the container: the anchors are set below
    prepared.anchors, prepared.block_valid = anchors, torch.ones_like(anchors, dtype=torch.bool)
    with torch.no_grad():
        hidden = objective.block_hidden(draft, prepared).view(len(proposer.steps), block, -1)
        trained = target.get_output_embeddings()(hidden[:, 1:]).float()
    for (start, drafted), logits in zip(proposer.steps, trained):
        assert start >= PROMPT_LEN
        torch.testing.assert_close(drafted, logits, atol=2e-4, rtol=1e-4, msg=f"block at {start}")
