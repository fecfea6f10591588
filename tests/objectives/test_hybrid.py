"""The hybrid objective: alpha * diffusion + autoregressive CE against an explicit loop, block-wise masking
statistics, normalisation (position 0, split invariance). Its 2-rank check is in test_mdlm.py."""

from __future__ import annotations

import math

import torch
from transformers import AutoModelForCausalLM

from flashdraft.objectives.dflash import sample_seed
from diffusion_helpers import EPS, MASK_ID, ROWS, global_step_grads, load_model, make_batch, make_objective, sample

ALPHA = 0.7


def test_loss_matches_an_explicit_loop(bidirectional_model):  # noqa: F811
    objective = make_objective(bidirectional_model, "hybrid", **{
        "objective.alpha": ALPHA, "objective.masking": "block", "objective.mask_block_size": 6})
    model = load_model(objective)
    prepared = objective.prepare(make_batch(ROWS), step=1)
    loss_sum, sums = objective.loss(model, prepared)
    loss = float(loss_sum.detach()) / prepared.num_targets

    # Reference: one unpadded sequence at a time; the model's own bidirectional attention for the diffusion
    # term, and the same weights loaded causal for the autoregressive term.
    causal = AutoModelForCausalLM.from_pretrained(bidirectional_model, is_causal=True, dtype=torch.float32)
    diffusion = ar = 0.0
    supervised = 0
    with torch.no_grad():
        for sid, length in ROWS:
            ids, loss_mask = sample(sid, length)
            loss_mask[0] = False  # nothing predicts position 0: out of both terms
            gen = torch.Generator().manual_seed(sample_seed(0, 1, sid))
            t = torch.rand(math.ceil(length / 6), generator=gen, dtype=torch.float64)
            draws = torch.rand(length, generator=gen)
            p = [(1 - EPS) * float(t[i // 6]) + EPS for i in range(length)]
            masked = [i for i in range(length) if loss_mask[i] and draws[i] < p[i]]
            noisy = ids.clone()
            noisy[masked] = MASK_ID
            logits = model(input_ids=noisy[None]).logits[0].double()
            for i in masked:
                diffusion += -float(torch.log_softmax(logits[i], dim=-1)[ids[i]]) / p[i]
            logits = causal(input_ids=ids[None]).logits[0].double()
            for i in range(1, length):
                if loss_mask[i]:
                    ar += -float(torch.log_softmax(logits[i - 1], dim=-1)[ids[i]])
            supervised += int(loss_mask.sum())
    assert prepared.num_targets == supervised
    assert int(sums["masked"]) > 0
    expected = (ALPHA * diffusion + ar) / supervised
    assert abs(loss - expected) <= 1e-5 * max(1.0, abs(expected))
    summary = objective.summarise(sums)
    assert abs(summary["ar_loss"] - ar / supervised) < 1e-5
    assert abs(summary["diffusion_loss"] - diffusion / supervised) < 1e-5 * max(1.0, diffusion / supervised)


def test_block_masking_rates_match_p(causal_model):  # noqa: F811
    """Causal models need no override here; each block of 8 draws its own t."""
    objective = make_objective(causal_model, "hybrid", **{"objective.masking": "block", "objective.mask_block_size": 8})
    n, length, block = 600, 40, 8
    batch = make_batch([(sid, length) for sid in range(n)])
    prepared = objective.prepare(batch, step=0)
    supervised = batch.loss_mask.clone()
    supervised[:, 0] = False
    assert not (prepared.masked & ~supervised).any()
    p = prepared.mask_prob.view(n, length // block, block).double()
    assert torch.equal(p, p[..., :1].expand_as(p))  # constant within a block
    p_blocks = p[..., 0]
    n_sup = supervised.view(n, length // block, block).sum(-1).double()
    masked = prepared.masked.view(n, length // block, block).sum(-1).double()
    z = float((masked - n_sup * p_blocks).sum()) / math.sqrt(float((n_sup * p_blocks * (1 - p_blocks)).sum()))
    assert abs(z) < 5, z
    t = ((p_blocks.flatten() - EPS) / (1 - EPS)).sort().values
    m = len(t)
    grid = torch.arange(1, m + 1, dtype=torch.float64) / m
    ks = float(torch.maximum(grid - t, t - (grid - 1 / m)).max())
    assert ks < 1.95 / math.sqrt(m), ks
    # Blocks of one sample are independent: their p's are not all equal.
    assert (p_blocks.std(dim=1) > 0).all()


def test_position_zero_and_split_invariance(bidirectional_model):  # noqa: F811
    objective = make_objective(bidirectional_model, "hybrid", **{"objective.alpha": ALPHA})
    batch = make_batch(ROWS)
    batch.loss_mask[:, 0] = True
    assert objective.prepare(batch, step=0).num_targets == int(batch.loss_mask[:, 1:].sum())

    model = load_model(objective)
    one, loss_one = global_step_grads(objective, model, [make_batch(ROWS)])
    two, loss_two = global_step_grads(objective, model, [make_batch(ROWS[:2]), make_batch(ROWS[2:])])
    assert abs(loss_one - loss_two) < 1e-5
    for name, grad in one.items():
        torch.testing.assert_close(two[name], grad, rtol=1e-4, atol=1e-6, msg=name)
