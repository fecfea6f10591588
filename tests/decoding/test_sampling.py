"""Speculative sampling keeps the target's distribution (within a computed statistical bound)."""

from __future__ import annotations

import math

import pytest
import torch
from decoding_helpers import make_draft
from tiny_models import tiny_config

from flashdraft.data.sampling import Sampling, sample, sampling_probs
from flashdraft.decoding.decoding import generate
from flashdraft.decoding.proposers import DraftProposer
from flashdraft.decoding.sampling import accept_sampled
from flashdraft.decoding.target_runner import TargetRunner
from flashdraft.errors import UserError


@pytest.fixture(autouse=True)
def _one_thread():
    # Batch-1 decoding is many tiny ops: on a shared 2-core machine a second thread only spins.
    torch.set_num_threads(1)



def hoeffding_bound(n: int, categories: int, delta: float = 1e-6) -> float:
    """With probability >= 1 - delta, every empirical frequency is within this of its probability."""
    return math.sqrt(math.log(2 * categories / delta) / (2 * n))


def frequencies(samples: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(samples), minlength=vocab).double() / len(samples)


def test_accept_rule_emits_the_target_distribution():
    vocab, k, n = 6, 3, 20_000
    gen = torch.Generator().manual_seed(0)
    p = torch.distributions.Dirichlet(torch.ones(vocab)).sample((k + 1,))
    q = torch.distributions.Dirichlet(torch.ones(vocab)).sample((k,))
    first, second = [], []
    for _ in range(n):
        drafts = sample(q, gen)
        accepted, bonus = accept_sampled(drafts, q, p, gen)
        emitted = drafts[: int(accepted)].tolist() + [int(bonus)]
        first.append(emitted[0])
        if len(emitted) > 1:
            second.append(emitted[1])
    bound = hoeffding_bound(n, vocab)
    assert (frequencies(first, vocab) - p[0]).abs().max() < bound
    # Given the first draft was kept, the next token follows the next target row.
    assert (frequencies(second, vocab) - p[1]).abs().max() < hoeffding_bound(len(second), vocab)
    # The test has power: the draft's own distribution would be caught.
    assert (q[0] - p[0]).abs().max() > 2 * bound


def test_filters_match_their_definition():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    top_k = sampling_probs(logits, Sampling(temperature=1.0, top_k=2))
    assert (top_k[0, 2:] == 0).all() and torch.allclose(top_k[0, :2], torch.softmax(logits[0, :2], -1))
    full = torch.softmax(logits[0], -1)
    top_p = sampling_probs(logits, Sampling(temperature=1.0, top_p=float(full[:2].sum()) - 1e-4))
    assert (top_p[0, 2:] == 0).all()
    with pytest.raises(UserError, match="top-p"):
        Sampling(temperature=1.0, top_p=0.0)
    with pytest.raises(UserError, match="temperature"):
        Sampling(temperature=-1.0)


def _nucleus_by_full_sort(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Top-p by its definition: the likeliest tokens whose mass before each is under top_p, renormalised."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    ranked, order = probs.sort(dim=-1, descending=True)
    ranked = ranked.masked_fill(ranked.cumsum(-1) - ranked >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, ranked)
    return kept / kept.sum(-1, keepdim=True)


def test_top_p_from_the_likeliest_candidates_equals_the_full_sort(monkeypatch):
    """The nucleus taken among the TOP_P_CANDIDATES likeliest tokens (where they hold top_p of the mass) is the
    full sort's, element for element: peaked rows (the regeneration's T=0.2), flat rows whose nucleus runs past
    the candidates (a batch with one such row sorts them all), and a single row."""
    from flashdraft.data import sampling

    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 8)
    torch.manual_seed(0)
    logits = torch.randn(6, 1000) * 3
    for temperature, top_p in ((0.2, 0.9), (1.0, 0.5), (1.0, 0.95), (3.0, 0.9)):
        want = _nucleus_by_full_sort(logits, temperature, top_p)
        got = sampling_probs(logits, Sampling(temperature=temperature, top_p=top_p))
        assert torch.equal(got, want), (temperature, top_p)
        assert torch.equal(sampling_probs(logits[:1], Sampling(temperature=temperature, top_p=top_p)), want[:1])
    flat = sampling_probs(logits, Sampling(temperature=3.0, top_p=0.9))
    assert int((flat > 0).sum(-1).max()) > 8  # the fallback ran: a nucleus wider than the candidates
    assert int((sampling_probs(logits, Sampling(temperature=0.2, top_p=0.9)) > 0).sum(-1).max()) <= 8


@pytest.mark.slow
def test_decoding_loop_samples_the_target_marginal():
    """The second new token (the first one a verify step emits) follows sum_x1 p(x1) p(x2 | x1)."""
    from transformers import AutoModelForCausalLM

    vocab = 12
    config = tiny_config("qwen3", vocab_size=vocab, num_layers=5)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    draft = make_draft(target, block_size=3)
    params = Sampling(temperature=1.3, top_k=8)
    ids = torch.tensor([[5, 9, 4, 7]])
    with torch.no_grad():
        p1 = sampling_probs(target(ids).logits[0, -1], params)
        cont = torch.cat([ids.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)
        p2 = sampling_probs(target(cont).logits[:, -1], params)
    exact = (p1[:, None] * p2).sum(0).double()

    runner = TargetRunner(target, draft.target_layer_ids, 16)
    proposer = DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings())
    gen = torch.Generator().manual_seed(1)
    n = 1000
    seconds = [
        generate(runner, ids, proposer=proposer, max_new_tokens=2, params=params, generator=gen).tokens[1]
        for _ in range(n)
    ]
    assert (frequencies(seconds, vocab) - exact).abs().max() < hoeffding_bound(n, vocab)
