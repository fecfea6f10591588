"""The peer objective of the quality comparison (benchmarks/peer_objective.py, SpecForge 0.2.0's DFlash
wrapper driven inside our trainer) computes what SpecForge computes and trains our draft module.

Oracle: our own objective. Given the same anchors, the two must agree on the weighted cross-entropy sum
and its gradients to float32 rounding (same module, mask semantics and decay weights) and on the
normaliser (the supervised slots' decay-weight sum; SpecForge takes one mean per micro-batch, we one per
step over all micro-batches and ranks).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dflash_helpers import bound_like, make_batch, make_objective
from flashdraft.objectives.dflash import decay_gamma

pytest.importorskip("specforge", reason="installed with --no-deps in the README's test command")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from peer_objective import SpecForgeObjective  # noqa: E402


@pytest.mark.parametrize("num_anchors, compile_layers", [(4, False), (16, False), (4, True)])
def test_given_our_anchors_the_peer_loss_is_our_weighted_sum(tiny_target, num_anchors, compile_layers):
    """Both anchor rules let blocks run past the answer's end (16 anchors draw such blocks here): our
    masking of those slots must be the peer's too. With compiled draft layers (the trainer's rule compiles
    them at the quality runs' micro-batches, for the peer's draft as for ours) the peer still computes ours."""
    path = tiny_target("qwen3")
    ours, draft = make_objective(path, num_anchors=num_anchors, attention="sdpa", compile_layers=compile_layers)
    assert all((layer._compiled_call_impl is not None) == compile_layers for layer in draft.layers)
    peer = bound_like(SpecForgeObjective, ours, draft, path)
    batch = make_batch(lengths=(30, 27))
    prepared = ours.prepare(batch, step=3)
    assert bool(prepared.block_valid.all())  # every block real: the peer's dense mask has no empty rows
    if num_anchors == 16:
        assert bool((prepared.anchors + ours.block_size > torch.tensor([30, 27])[:, None]).any())

    wrapper = peer.wrapper(draft)
    wrapper._sample_anchor_positions = lambda *_: (prepared.anchors, prepared.block_valid)
    our_sum, _ = ours.loss(draft, prepared)
    our_sum.backward()
    our_grads = [p.grad.clone() for p in draft.parameters()]
    draft.zero_grad()

    features = ours.target.context_features(batch.input_ids, ours.draft_config.target_layer_ids, batch.attention_mask)
    _, _, metrics = wrapper(batch.input_ids, features, batch.loss_mask.float())
    loss_num, loss_den = metrics["loss_terms"]
    loss_num.backward()
    torch.testing.assert_close(loss_num, our_sum, rtol=1e-5, atol=1e-5)
    for theirs, mine in zip((p.grad for p in draft.parameters()), our_grads, strict=True):
        torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-6)
    # The same normaliser: the sum of the supervised slots' decay weights.
    assert float(loss_den) == pytest.approx(prepared.num_targets, rel=1e-6)


def test_the_peer_keeps_specforges_decay_whatever_our_recipe_sets(tiny_target):
    """Our recipe's gamma (2 for SmolLM2) is part of what the comparison measures: the peer trains with the
    decay SpecForge suggests for the block size (the paper's rule: 7 at B = 16, 4 at 8)."""
    path = tiny_target("qwen3")
    ours, draft = make_objective(path, num_anchors=4, attention="sdpa", gamma=3.0)
    peer = bound_like(SpecForgeObjective, ours, draft, path)
    assert peer.config.objective.gamma == 3.0
    assert peer.wrapper(draft).loss_decay_gamma == decay_gamma(peer.block_size) != 3.0


@pytest.mark.parametrize("target_dtype", [torch.float32, torch.bfloat16])
def test_peer_steps_are_reproducible_and_learn(tiny_target, target_dtype):
    """Its own anchors, drawn from a seed per (train seed, step, batch): the same step gives the same loss;
    a few optimizer steps on one batch lower it. A bf16 target beside the CPU's fp32 draft works as in
    our objective (its head and embeddings are used in the draft's dtype)."""
    path = tiny_target("qwen3")
    ours, draft = make_objective(path, num_anchors=4, attention="sdpa")
    ours.target.model.to(target_dtype)
    peer = bound_like(SpecForgeObjective, ours, draft, path)
    batch = make_batch(lengths=(30, 27))
    first, again = (float(peer.loss(draft, peer.prepare(batch, step=1))[0].detach()) for _ in range(2))
    assert first == again
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    losses = []
    for step in range(8):
        loss, sums = peer.loss(draft, peer.prepare(batch, step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
        assert 0 <= float(sums["correct"]) <= float(sums["valid"]) and float(sums["valid"]) > 0
    assert losses[-1] < losses[0]


def test_peer_train_script_trains_and_exports_a_zlab_draft(tiny_target, tmp_path):
    """benchmarks/peer_train.py is `flashdraft train` with the peer's objective: it learns the alphabet
    data and exports a draft that loads in the z-lab reference model."""
    import json
    import os
    import subprocess

    from train_helpers import alphabet_chats, cpu_env, read_metrics, tiny_train_args

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_train.py"
    out = tmp_path / "peer"
    args = tiny_train_args(tiny_target("qwen3"), alphabet_chats(tmp_path / "chats.jsonl", 64), out,
                           **{"objective.name": "specforge", "train.max_steps": 80, "train.epochs": 100,
                              "draft.block_size": 8, "objective.num_anchors": 8, "train.micro_batch_size": 4,
                              "train.lr": 3e-3, "train.log_every": 10, "train.checkpoint_every": 1000})
    env = cpu_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *sys.path])
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [m for m in read_metrics(out) if "loss" in m]
    # Measured: loss 5.50 -> 4.67, accuracy of the drafted slots 0.01 -> 0.79 in 80 steps.
    assert logged[-1]["loss"] < logged[0]["loss"] - 0.5 and logged[-1]["accuracy"] > 0.5 > logged[0]["accuracy"]
    assert json.loads((out / "summary.json").read_text())["config"]["objective"]["name"] == "specforge"
    from dflash.model import DFlashDraftModel as ZLabDraft

    assert ZLabDraft.from_pretrained(str(out / "export")).config.num_hidden_layers == 1
