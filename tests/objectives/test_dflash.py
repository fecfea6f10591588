"""The dflash objective: anchors, labels, loss and gradients against a naive per-block reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from dflash_helpers import BLOCK, make_batch, make_config, make_objective, write_draft
from flashdraft.data import Batch
from flashdraft.errors import UserError
from flashdraft.objectives.chunked_ce import linear_cross_entropy
from flashdraft.objectives.dflash import DFlashObjective, decay_gamma, slot_weights
from flashdraft.target.frozen import decoder_layers
from flashdraft.target.source import load_target_config, load_tokenizer


def naive_loss(objective: DFlashObjective, draft, batch: Batch, prepared) -> torch.Tensor:
    """Full logits, one draft forward per block with NO mask over exactly its visible context; the
    decay-weighted mean of the supervised slots' cross-entropy."""
    target, size = objective.target, objective.block_size
    weights = slot_weights(size, objective.gamma)
    mask_id = objective.draft_config.mask_token_id
    total, weight = 0.0, 0.0
    for row in range(batch.input_ids.shape[0]):
        length = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row : row + 1, :length]
        features = target.context_features(ids, objective.draft_config.target_layer_ids)  # unpadded
        for b in range(objective.num_anchors):
            if not prepared.block_valid[row, b]:
                continue
            a = int(prepared.anchors[row, b])
            block = torch.full((1, size), mask_id)
            block[0, 0] = ids[0, a]
            hidden = draft(
                position_ids=torch.arange(a + size)[None],
                noise_embedding=target.embedding(block),
                target_hidden=features[:, :a],
            )
            logits = hidden[0] @ target.lm_head.weight.t()
            for k in range(1, size):
                pos = a + k
                if pos < length and batch.loss_mask[row, pos]:
                    total = total + weights[k] * F.cross_entropy(logits[k], ids[0, pos])
                    weight += float(weights[k])
    return total / weight


@pytest.mark.parametrize("num_anchors", [1, 6])
def test_loss_and_grads_equal_naive_reference(tiny_target, num_anchors):
    objective, draft = make_objective(tiny_target("qwen3"), num_anchors=num_anchors)
    batch = make_batch()
    prepared = objective.prepare(batch, step=3)
    assert prepared.block_valid.sum() == 2 * num_anchors
    loss_sum, sums = objective.loss(draft, prepared)
    loss = loss_sum / prepared.num_targets
    loss.backward()
    grads = {n: p.grad.clone() for n, p in draft.named_parameters()}
    draft.zero_grad()
    reference = naive_loss(objective, draft, batch, prepared)
    reference.backward()
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)
    for name, p in draft.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert float(sums["weight"]) == pytest.approx(prepared.num_targets)
    assert float(sums["targets"]) == int(prepared.label_mask.sum())


def test_chunked_head_equals_full_logits(tiny_target):
    results = []
    for chunk in (0, 5):
        objective, draft = make_objective(tiny_target("qwen3"), lm_head_chunk=chunk)
        prepared = objective.prepare(make_batch(), step=0)
        loss_sum, sums = objective.loss(draft, prepared)
        loss_sum.backward()
        results.append((loss_sum.detach(), sums, [p.grad.clone() for p in draft.parameters()]))
    (l0, s0, g0), (l1, s1, g1) = results
    torch.testing.assert_close(l0, l1, atol=1e-5, rtol=1e-6)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert torch.equal(s0["correct"], s1["correct"])


def pad_multiples(objective) -> tuple[int, int]:
    """pad_multiple on the CPU and on CUDA (use_device only makes choices; nothing moves), back on the CPU."""
    found = []
    for device in ("cuda", "cpu"):
        objective.use_device(torch.device(device))
        found.append(objective.pad_multiple)
    return found[1], found[0]


def test_compiled_attention_pads_to_whole_blocks_and_padding_changes_nothing(tiny_target):
    """Where FlexAttention is compiled, batches pad to 128-token blocks (few shapes, few compilations)."""
    objective, draft = make_objective(tiny_target("qwen3"), attention="auto")
    assert pad_multiples(objective) == (1, 128)
    for asked, used in ((512, 512), (200, 256)):
        objective.config.data.pad_to_multiple = asked
        assert pad_multiples(objective) == (asked, used)
    assert pad_multiples(make_objective(tiny_target("qwen3"), attention="sdpa", compile_layers=False)[0]) == (1, 1)

    batch = make_batch()
    extra = 128 - batch.input_ids.shape[1]
    padded = Batch(F.pad(batch.input_ids, (0, extra)), F.pad(batch.attention_mask, (0, extra)),
                   F.pad(batch.loss_mask, (0, extra)), batch.sample_ids)
    results = []
    for b in (batch, padded):
        prepared = objective.prepare(b, step=2)
        loss_sum, sums = objective.loss(draft, prepared)
        loss_sum.backward()
        results.append((prepared.anchors, loss_sum.detach(), [p.grad.clone() for p in draft.parameters()]))
        draft.zero_grad()
    (a0, l0, g0), (a1, l1, g1) = results
    assert torch.equal(a0, a1)
    torch.testing.assert_close(l0, l1, atol=1e-5, rtol=1e-6)
    for x, y in zip(g0, g1):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("asked, device, hidden, tokens, compiled", [
    (None, "cuda", 4096, (2, 256), True), (None, "cuda", 2048, (2, 256), True), (None, "cuda", 576, (2, 256), False),
    (None, "cuda", 576, (32, 1024), True), (None, "cuda", 576, (16, 1024), False),
    (None, "cpu", 4096, (32, 1024), False), (False, "cuda", 4096, (32, 1024), False), (True, "cpu", 576, (2, 256), True),
])
def test_draft_layers_compile_by_the_measured_rule(tiny_target, asked, device, hidden, tokens, compiled):
    """objective.compile_layers unset: compiled on CUDA for drafts at least COMPILE_MIN_HIDDEN wide or
    micro-batches of at least COMPILE_MIN_TOKENS (samples x training length; where each was measured faster),
    eager elsewhere; a value the user gives wins. Compiled drafts pad batches to whole blocks."""
    path = tiny_target("qwen3")
    config = make_config(path, compile_layers=asked, compile_target=False, attention="sdpa")
    config.train.micro_batch_size, config.data.max_length = tokens
    objective = DFlashObjective.plan(config, load_target_config(str(path)), load_tokenizer(str(path)))
    objective.draft_config.hidden_size = hidden  # the rule reads the width only; nothing is built
    objective.use_device(torch.device(device))  # device-dependent choices only: nothing is allocated
    assert objective.compile_layers is compiled
    assert objective.pad_multiple == (128 if compiled else 1)


def test_compiled_layers_match_eager_layers(tiny_target):
    """objective.compile_layers: same loss and gradients as the eager draft, over two batch lengths."""
    eager_objective, eager = make_objective(tiny_target("qwen3"), num_anchors=4)
    objective, draft = make_objective(tiny_target("qwen3"), num_anchors=4, compile_layers=True)
    assert all(layer._compiled_call_impl is not None for layer in draft.layers)
    assert objective.pad_multiple == 128  # few lengths, few compilations
    draft.load_state_dict(eager.state_dict())
    for lengths in ((30, 19), (25,)):
        prepared = objective.prepare(make_batch(lengths), step=1)
        results = []
        for s, model in ((eager_objective, eager), (objective, draft)):
            loss_sum, _ = s.loss(model, prepared)
            loss_sum.backward()
            results.append((loss_sum.detach(), [p.grad.clone() for p in model.parameters()]))
            model.zero_grad()
        (l0, g0), (l1, g1) = results
        torch.testing.assert_close(l1, l0, atol=1e-5, rtol=1e-5)
        for x, y in zip(g1, g0):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("asked, device, model_type, hidden, tokens, compiled", [
    (None, "cuda", "qwen3", 4096, (2, 256), True), (None, "cuda", "qwen3", 576, (2, 256), False),
    (None, "cuda", "qwen3", 576, (32, 1024), True), (None, "cpu", "qwen3", 4096, (32, 1024), False),
    (None, "cuda", "nemotron_h", 4096, (32, 1024), False), (False, "cuda", "qwen3", 4096, (32, 1024), False),
    (True, "cpu", "qwen3", 64, (2, 256), True),
])
def test_target_layers_compile_by_the_measured_rule(tiny_target, asked, device, model_type, hidden, tokens, compiled):
    """objective.compile_target unset: compiled on CUDA for attention-only targets at least
    COMPILE_MIN_HIDDEN wide or micro-batches of at least COMPILE_MIN_TOKENS (measured faster there), never for
    hybrids; a value the user gives wins."""
    path = tiny_target(model_type)
    config = make_config(path, compile_target=asked, compile_layers=False, attention="sdpa")
    config.train.micro_batch_size, config.data.max_length = tokens
    objective = DFlashObjective.plan(config, load_target_config(str(path)), load_tokenizer(str(path)))
    objective.target_config.hidden_size = hidden  # the rule reads the width only; nothing is built
    objective.use_device(torch.device(device))
    assert objective.compile_target is compiled
    assert objective.pad_multiple == (128 if compiled else 1)


def test_compiled_target_layers_give_the_eager_features_loss_and_gradients(tiny_target):
    """objective.compile_target: the target's layers through the last tap run compiled, the taps' hooks
    still see their outputs, and the loss and the draft's gradients are the eager target's."""
    from torch._dynamo.utils import counters

    # Earlier tests' graphs of the layers' shared call code would count toward dynamo's recompile limit and
    # could push this target's layers to the eager fallback the test rules out.
    torch._dynamo.reset()
    eager_objective, eager = make_objective(tiny_target("qwen3"), num_anchors=4, compile_layers=False)
    objective, draft = make_objective(tiny_target("qwen3"), num_anchors=4, compile_layers=False, compile_target=True)
    draft.load_state_dict(eager.state_dict())
    layers = decoder_layers(objective.target.model)
    last = max(objective.draft_config.target_layer_ids)
    assert all(hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in layers[: last + 1])
    assert not any(hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in layers[last + 1 :])
    prepared = objective.prepare(make_batch(), step=1)
    results, frames = [], []
    for s, model in ((eager_objective, eager), (objective, draft)):
        frames.append(counters["frames"]["ok"])
        loss_sum, _ = s.loss(model, prepared)
        loss_sum.backward()
        results.append((loss_sum.detach(), [p.grad.clone() for p in model.parameters()]))
    frames.append(counters["frames"]["ok"])
    # Only the second loss compiled anything: its target's layers, not an eager fallback.
    assert frames[0] == frames[1] < frames[2]
    (l0, g0), (l1, g1) = results
    torch.testing.assert_close(l1, l0, atol=1e-5, rtol=1e-5)
    for x, y in zip(g1, g0):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_linear_cross_entropy_chunks_match_autograd():
    torch.manual_seed(0)
    hidden = torch.randn(23, 8, requires_grad=True)
    weight = torch.randn(50, 8)
    labels = torch.randint(0, 50, (23,))
    w = torch.rand(23)
    full, preds_full = linear_cross_entropy(hidden, weight, labels, w, 0)
    (grad_full,) = torch.autograd.grad(full * 1.7, hidden)
    chunked, preds = linear_cross_entropy(hidden, weight, labels, w, 4)
    (grad_chunked,) = torch.autograd.grad(chunked * 1.7, hidden)
    torch.testing.assert_close(chunked, full)
    torch.testing.assert_close(grad_chunked, grad_full)
    assert torch.equal(preds, preds_full)


def test_anchors_follow_the_rules_and_are_split_invariant(tiny_target):
    objective, _ = make_objective(tiny_target("qwen3"), num_anchors=50)
    batch = make_batch(lengths=(30, 19))
    prepared = objective.prepare(batch, step=7)
    for row, length in enumerate((30, 19)):
        used = prepared.anchors[row][prepared.block_valid[row]]
        assert len(set(used.tolist())) == len(used)  # drawn without replacement
        # up to the answer's last token pair: blocks near the end run past it, those slots unsupervised
        expected = [a for a in range(length - 1) if batch.loss_mask[row, a] and batch.loss_mask[row, a + 1]]
        assert sorted(used.tolist()) == expected  # 50 > valid positions: all of them
        assert max(expected) + BLOCK > length
        for b, a in enumerate(used.tolist()):
            for k in range(1, BLOCK):
                inside = a + k < length
                assert prepared.label_mask[row, b, k] == (inside and bool(batch.loss_mask[row, a + k]))
                if prepared.label_mask[row, b, k]:
                    assert prepared.labels[row, b, k] == batch.input_ids[row, a + k]  # same position
        assert not prepared.label_mask[row, :, 0].any()
    # Same sample id and step -> same anchors, whatever the rest of the micro-batch.
    objective.num_anchors = 3
    both = objective.prepare(batch, step=7)
    rest = (batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sample_ids)
    alone = objective.prepare(Batch(*(t[1:] for t in rest)), step=7)
    assert torch.equal(both.anchors[1], alone.anchors[0])
    assert not torch.equal(objective.prepare(batch, step=8).anchors, both.anchors)


def test_gamma_rule_and_weights():
    assert (decay_gamma(16), decay_gamma(10), decay_gamma(8)) == (7.0, 5.0, 4.0)
    assert decay_gamma(12) == pytest.approx(5 + 2 / 3) and decay_gamma(4) == 2.0 and decay_gamma(2) == 1.0
    w = slot_weights(16, 7.0)
    assert w[0] == 0 and w[1] == 1 and w[15] == pytest.approx(math.exp(-14 / 7))


def test_expected_tau_from_slot_accuracy(tiny_target):
    objective, _ = make_objective(tiny_target("qwen3"), num_anchors=2)
    batch = make_batch(lengths=(40,), prompt=0)
    batch.loss_mask[:] = True
    prepared = objective.prepare(batch, step=0)
    perfect = objective._counts(torch.tensor(0.0), prepared.label_mask.clone(), prepared, batch)
    assert objective.summarise(perfect)["tau"] == pytest.approx(BLOCK)  # every slot right: tau = B
    first_only = prepared.label_mask.clone()
    first_only[..., 2:] = False
    tau = objective.summarise(objective._counts(torch.tensor(0.0), first_only, prepared, batch))["tau"]
    assert tau == pytest.approx(2.0)
    # Slot 1 right in one block of two; slot 2 right only where slot 1 was: a1 = 1/2, a2 = 1, a3 = 0.
    half = torch.zeros_like(prepared.label_mask)
    half[0, 0, 1:3] = True
    half[0, 1, 2] = True  # right at slot 2 after a miss at slot 1: does not count towards tau
    tau = objective.summarise(objective._counts(torch.tensor(0.0), half, prepared, batch))["tau"]
    assert tau == pytest.approx(2.0)


def test_draft_that_does_not_fit_the_target(tiny_target, tmp_path):
    from tiny_models import save_tiny_target

    other = tiny_target("llama")  # hidden 64 too, so change the vocab: a draft for a 300-row target
    big_vocab = save_tiny_target(tmp_path / "big", "qwen3", vocab_size=320)
    config = make_config(other)
    config.draft.init_from = str(write_draft(big_vocab, tmp_path / "draft"))
    with pytest.raises(UserError, match="vocab"):
        DFlashObjective.plan(config, load_target_config(str(other)), load_tokenizer(str(other)))
    wide = save_tiny_target(tmp_path / "wide", "qwen3", hidden=96)
    config.draft.init_from = str(write_draft(wide, tmp_path / "wide-draft"))
    with pytest.raises(UserError, match="hidden size"):
        DFlashObjective.plan(config, load_target_config(str(other)), load_tokenizer(str(other)))


def test_flop_count_matches_measured_matmuls(tiny_target):
    """The MFU numerator: our matmul FLOPs == what torch's FlopCounterMode sees (attention aside)."""
    from torch.utils.flop_counter import FlopCounterMode

    objective, draft = make_objective(tiny_target("qwen3"), num_anchors=5)
    batch = make_batch(lengths=(40,))
    prepared = objective.prepare(batch, step=0)
    assert prepared.block_valid.all()  # every block used, so every computed token is useful
    with FlopCounterMode(display=False) as counter:
        loss_sum, _ = objective.loss(draft, prepared)
        loss_sum.backward()
    measured = sum(n for op, n in counter.get_flop_counts()["Global"].items() if "mm" in str(op))
    target = objective.target_flops
    target.attention_layers = 0
    expected = target(batch.attention_mask.sum(1)) + draft_flops_without_attention(objective, prepared)
    assert abs(measured - expected) / measured < 0.01, (measured, expected)


def draft_flops_without_attention(objective, prepared) -> float:
    from flashdraft.objectives.flops import draft_train_flops

    blocks = float(prepared.block_valid.sum())
    return draft_train_flops(objective.draft_config, objective.target_config.vocab_size,
                             context_tokens=float(prepared.batch.attention_mask.sum()),
                             block_tokens=blocks * objective.block_size, visible_keys=0.0,
                             supervised_slots=float(prepared.label_mask.sum()))

