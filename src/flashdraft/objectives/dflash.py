"""The DFlash objective: random anchors, one sparse draft forward over all blocks, decay-weighted CE.

Per sample and step, up to `num_anchors` anchors are drawn (without replacement; blocks may overlap)
among positions a whose token and next token are supervised (loss_mask[a] and loss_mask[a + 1]). Block b
is [token a_b, MASK x (B-1)] at positions a_b .. a_b + B - 1; slot k (1 <= k < B) is labelled with the
token AT a_b + k (same-position prediction) and counts only where that token is supervised, so a block
near the answer's end runs past it with its last slots unsupervised: decoding starts a block at every
accepted position, the answer's last ones too, and a draft never trained there drafts them worse
(benchmarks/RESULTS.md section 8, run 4: teacher-forced tau 1.87 against 2.40 on such blocks). The target
runs once over the sequence; all blocks run in one draft forward under the block-sparse mask
(`block_mask`). The loss is sum_k w_k CE_k with w_k = exp(-(k-1)/gamma); the trainer divides it by the
global sum of the supervised slots' weights (a weighted mean).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from flashdraft.config import Config
from flashdraft.data import Batch
from flashdraft.errors import UserError
from flashdraft.model import DFlashDraftConfig
from flashdraft.model.build import initial_draft_config
from flashdraft.objectives.block_mask import FLEX_BLOCK, dense_mask, flex_block_mask
from flashdraft.objectives.chunked_ce import linear_cross_entropy
from flashdraft.objectives.flops import DecoderFlops, draft_train_flops
from flashdraft.target.fast_path import recurrent_layers
from flashdraft.target.frozen import FrozenTarget, decoder_layers
from flashdraft.target.source import check_draft_fits

# (select [N, A*B], supervised slots' hidden states [M, H], labels [M], weights [M]) -> (loss sum, argmax [M])
SlotLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

# The paper's decay constants; other block sizes interpolate linearly between them (see decay_gamma).
GAMMA_POINTS = ((8, 4.0), (10, 5.0), (16, 7.0))


def decay_gamma(block_size: int) -> float:
    """gamma for a block size: 4 / 5 / 7 at B = 8 / 10 / 16, piecewise linear between those points,
    and continued with the slope of the nearest segment outside them (B/2 below 10, +1/3 per slot above
    16), floored at 1 so tiny blocks still weight their later slots."""
    (b0, g0), (b1, g1), (b2, g2) = GAMMA_POINTS
    if block_size <= b1:
        gamma = g0 + (block_size - b0) * (g1 - g0) / (b1 - b0)
    else:
        gamma = g1 + (block_size - b1) * (g2 - g1) / (b2 - b1)
    return max(1.0, gamma)


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B] weights: 0 for the anchor slot, exp(-(k-1)/gamma) for slot k >= 1."""
    k = torch.arange(block_size, dtype=torch.float64)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights.float()


# Width from which compiled layers run faster on a GPU. Measured on one H200 (benchmarks/RESULTS.md
# sections 5 and 7): draft layers at hidden 4096 (Qwen3-8B) 1.11x and 2688 (Nemotron-3-Nano) 1.14x faster,
# at 576 (SmolLM2-135M) 1.20x slower in a micro-batch of 2 x 256 tokens, where a step is a few small kernels
# and the compiled call's own cost shows; the target's training forward at hidden 4096 (Qwen3-8B, 4096 tokens)
# 1.30x faster.
COMPILE_MIN_HIDDEN = 2048
# Tokens a micro-batch (samples x training length) from which narrower models compile too: at SmolLM2's
# width, 32 x 1,024 tokens, one H100, compiled draft layers made the step 1.34x faster and the compiled target
# 1.26x more (benchmarks/RESULTS.md section 7, "When compiled draft layers pay"). Between 512 and this, not
# measured.
COMPILE_MIN_TOKENS = 32 * 1024


def compiles_faster(draft_config: DFlashDraftConfig, device: torch.device, tokens: int) -> bool:
    """Whether compiled draft layers are the faster choice on `device` for micro-batches of `tokens`
    (objective.compile_layers unset)."""
    return device.type == "cuda" and (draft_config.hidden_size >= COMPILE_MIN_HIDDEN
                                      or tokens >= COMPILE_MIN_TOKENS)


def target_compiles_faster(target_config, device: torch.device, tokens: int) -> bool:
    """Whether the frozen target's compiled layers are the faster choice for micro-batches of `tokens`
    (objective.compile_target unset). Not for hybrids: their Mamba-2 layers run their own kernels, which the
    compiler would only wrap."""
    return (device.type == "cuda" and not recurrent_layers(target_config)
            and (target_config.hidden_size >= COMPILE_MIN_HIDDEN or tokens >= COMPILE_MIN_TOKENS))


def sample_seed(seed: int, step: int, sample_id: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{step}/{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def valid_anchor_positions(loss_mask: torch.Tensor, length: int) -> torch.Tensor:
    """Positions a < length - 1 whose token and next token are both supervised."""
    a = torch.arange(max(length - 1, 0))
    return a[loss_mask[: len(a)] & loss_mask[1 : len(a) + 1]]


@dataclass
class DFlashPrepared:
    batch: Batch
    anchors: torch.Tensor  # [N, A] long; unused blocks hold 0
    block_valid: torch.Tensor  # [N, A] bool
    labels: torch.Tensor  # [N, A, B] long; slot k = token at anchor + k (0 where not supervised)
    label_mask: torch.Tensor  # [N, A, B] bool; False for slot 0, unused blocks and unsupervised slots
    slot_weights: torch.Tensor  # [B] the loss's decay weight of each slot

    @property
    def num_targets(self) -> float:
        """The supervised slots' weight sum: the loss is a weighted mean, as the peer's, so that gradient
        clipping at 1.0 acts on its scale (a count of slots made our gradients ~2.3x smaller at block 16
        and left the clipping all but idle: RESULTS.md section 8)."""
        return float(self.weight_sum())

    def weight_sum(self) -> torch.Tensor:
        return (self.label_mask * self.slot_weights).sum()

    def to(self, device: torch.device) -> DFlashPrepared:
        return DFlashPrepared(self.batch.to(device), self.anchors.to(device), self.block_valid.to(device),
                              self.labels.to(device), self.label_mask.to(device), self.slot_weights.to(device))


class DFlashObjective:
    name = "dflash"
    bidirectional = False

    def __init__(self, config: Config, draft_config: DFlashDraftConfig, target_config):
        self.config = config
        self.draft_config = draft_config
        self.target_config = target_config
        self.mask_token_id = draft_config.mask_token_id
        self.block_size = draft_config.block_size
        self.num_anchors = config.objective.num_anchors
        self.gamma = config.objective.gamma or decay_gamma(self.block_size)
        self.weights = slot_weights(self.block_size, self.gamma)
        self.target: FrozenTarget | None = None
        self.target_flops: DecoderFlops | None = None
        self.use_flex = False
        self.compile_layers = self.compile_target = False  # use_device decides
        self.compute_dtype = torch.float32  # use_device picks bf16 on GPUs

    @classmethod
    def plan(cls, config: Config, target_config, tokenizer) -> DFlashObjective:
        draft_config = initial_draft_config(config.draft, target_config, tokenizer)
        check_draft_fits(draft_config, target_config)
        return cls(config, draft_config, target_config)

    @property
    def min_supervised_tokens(self) -> int:
        return 2 * self.block_size

    def use_device(self, device: torch.device) -> None:
        """FlexAttention where objective.attention asks for it (auto: on CUDA); the draft computes in bf16
        on a GPU (FSDP2's mixed-precision policy) and fp32 elsewhere, and the target's features, embeddings
        and head are cast to that, whatever the target's dtype."""
        choice = self.config.objective.attention
        self.use_flex = choice == "flex" or (choice == "auto" and device.type == "cuda")
        if self.use_flex and device.type != "cuda":
            raise UserError(
                "objective.attention=flex needs a CUDA device (FlexAttention has no backward on CPU); "
                "use objective.attention=sdpa or auto"
            )
        self.compute_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        tokens = self.config.train.micro_batch_size * self.config.data.max_length
        chosen = self.config.objective.compile_layers
        self.compile_layers = compiles_faster(self.draft_config, device, tokens) if chosen is None else chosen
        chosen = self.config.objective.compile_target
        self.compile_target = (target_compiles_faster(self.target_config, device, tokens) if chosen is None
                               else chosen)

    @property
    def compiles(self) -> bool:
        """FlexAttention, compiled draft layers or compiled target layers."""
        return self.use_flex or self.compile_layers or self.compile_target

    @property
    def pad_multiple(self) -> int:
        """data.pad_to_multiple, raised to whole FlexAttention blocks where the draft is compiled.

        Every new padded length compiles the draft again (tens of seconds each), so with no padding a
        chat dataset's spread of lengths spends most of a short run compiling. FlexAttention works in
        128-token blocks anyway: padding to them costs the draft nothing.
        """
        pad = self.config.data.pad_to_multiple
        return -(-pad // FLEX_BLOCK) * FLEX_BLOCK if self.compiles else pad

    def bind(self, model: nn.Module, target: FrozenTarget | None) -> None:
        if target is None:
            raise ValueError("the dflash objective trains a draft against a frozen target; bind one")
        self.target = target
        if self.compile_layers:  # before FSDP2 wraps the layers: its hooks stay eager around them
            model.compile_layers()
        # Only the layers through the last tap run (FrozenTarget.context_features).
        last = max(self.draft_config.target_layer_ids)
        if self.compile_target:  # before the trainer shards the target (train.shard_target), likewise
            target.compile_layers(last)
        self.target_flops = DecoderFlops(decoder_layers(target.model)[: last + 1], self.target_config)

    # -- one step ------------------------------------------------------------------------------
    def anchor_positions(self, loss_mask: torch.Tensor, length: int) -> torch.Tensor:
        """Where one sample's blocks may start (module docstring)."""
        return valid_anchor_positions(loss_mask, length)

    def prepare(self, batch: Batch, step: int) -> DFlashPrepared:
        n, _ = batch.input_ids.shape
        size, count = self.block_size, self.num_anchors
        anchors = torch.zeros(n, count, dtype=torch.long)
        block_valid = torch.zeros(n, count, dtype=torch.bool)
        lengths = batch.attention_mask.sum(dim=1).tolist()
        for row in range(n):
            positions = self.anchor_positions(batch.loss_mask[row].bool(), int(lengths[row]))
            if len(positions) == 0:
                continue
            gen = torch.Generator().manual_seed(
                sample_seed(self.config.train.seed, step, int(batch.sample_ids[row])))
            chosen = positions[torch.randperm(len(positions), generator=gen)[:count]].sort().values
            anchors[row, : len(chosen)] = chosen
            block_valid[row, : len(chosen)] = True
        # Slot k of block b reads position anchor + k; clamp keeps the reads of padding blocks (and of
        # slots past the batch's end) in range, and such slots are not supervised.
        seq_len = batch.input_ids.shape[1]
        unclamped = anchors[..., None] + torch.arange(size)  # [N, A, B]
        flat = unclamped.clamp(max=seq_len - 1).view(n, -1)
        labels = batch.input_ids.gather(1, flat).view(n, count, size)
        supervised = batch.loss_mask.bool().gather(1, flat).view(n, count, size)
        label_mask = supervised & block_valid[..., None] & (unclamped < seq_len)
        label_mask[..., 0] = False
        return DFlashPrepared(batch, anchors, block_valid, labels * label_mask, label_mask, self.weights)

    def block_inputs(self, prepared: DFlashPrepared) -> tuple[torch.Tensor, torch.Tensor]:
        """Block token ids [N, A*B] ([anchor token, MASK...]) and position ids [N, S + A*B]."""
        input_ids, anchors = prepared.batch.input_ids, prepared.anchors
        n, seq_len = input_ids.shape
        size = self.block_size
        block_ids = torch.full((n, anchors.shape[1], size), self.draft_config.mask_token_id, device=input_ids.device)
        block_ids[..., 0] = input_ids.gather(1, anchors)
        block_pos = anchors[..., None] + torch.arange(size, device=anchors.device)
        ctx_pos = torch.arange(seq_len, device=anchors.device).expand(n, -1)
        return block_ids.view(n, -1), torch.cat([ctx_pos, block_pos.view(n, -1)], dim=1)

    def block_hidden(self, model: nn.Module, prepared: DFlashPrepared) -> torch.Tensor:
        """The draft's final hidden states of every block slot, [N, A*B, H] (prepared on the target's device):
        one target forward for the context features, one draft forward for all blocks."""
        batch = prepared.batch
        features = self.target.context_features(batch.input_ids, self.draft_config.target_layer_ids,
                                                 batch.attention_mask)
        return self.draft_hidden(model, prepared, features)

    def draft_hidden(self, model: nn.Module, prepared: DFlashPrepared, features: torch.Tensor) -> torch.Tensor:
        """The draft forward of `block_hidden` given the target's tapped features [N, S, n_taps * H]."""
        seq_len = prepared.batch.input_ids.shape[1]
        block_ids, position_ids = self.block_inputs(prepared)
        noise = self.target.embedding(block_ids).to(self.compute_dtype)
        features = features.to(self.compute_dtype)
        if self.use_flex:
            mask = flex_block_mask(prepared.anchors, seq_len, self.block_size)
        else:
            mask = dense_mask(prepared.anchors, seq_len, self.block_size)
        return model(position_ids=position_ids, noise_embedding=noise, target_hidden=features, attention_mask=mask)

    def loss(self, model: nn.Module, prepared: DFlashPrepared) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        prepared = prepared.to(self.target.device)
        hidden = self.block_hidden(model, prepared)
        head, chunk = self.target.lm_head.weight.to(self.compute_dtype), self.config.objective.lm_head_chunk
        return self.scored(prepared, hidden,
                           lambda select, selected, labels, weights: linear_cross_entropy(selected, head, labels,
                                                                                          weights, chunk))

    def scored(self, prepared: DFlashPrepared, hidden: torch.Tensor, slot_loss: SlotLoss
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss_sum, counts) of the draft's block hidden states [N, A*B, H]. `slot_loss(select, hidden[select],
        labels, weights)` scores the supervised slots (`select` marks them in [N, A*B]) and returns their
        weighted loss sum and the draft's argmax at each."""
        n = prepared.batch.input_ids.shape[0]
        select = prepared.label_mask.view(n, -1)
        slot = torch.arange(self.block_size, device=hidden.device).expand_as(prepared.label_mask).reshape(n, -1)[select]
        labels = prepared.labels.view(n, -1)[select]
        loss_sum, preds = slot_loss(select, hidden[select], labels, self.weights.to(hidden.device)[slot])
        correct = torch.zeros_like(prepared.label_mask)
        correct.view(n, -1)[select] = preds == labels
        return loss_sum, self._counts(loss_sum, correct, prepared, prepared.batch)

    def _counts(self, loss_sum, correct, prepared, batch) -> dict[str, torch.Tensor]:
        valid = prepared.label_mask[..., 1:][prepared.block_valid].float()  # [blocks, B-1]
        right = correct[..., 1:][prepared.block_valid].float()
        streak = torch.cumprod(right, dim=1)  # slots 1..k all right (and supervised)
        before = torch.cat([torch.ones_like(streak[:, :1]), streak[:, :-1]], dim=1)
        return {
            "loss_sum": loss_sum.detach().float(),
            "targets": valid.sum(),
            "weight": prepared.weight_sum().float(),
            "tokens": batch.attention_mask.sum().float(),
            "valid": valid.sum(0),
            "correct": right.sum(0),
            "tries": (before * valid).sum(0),  # earlier slots all right and slot k supervised
            "hits": streak.sum(0),
        }

    def summarise(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """loss, accuracy, per-slot accuracy and expected tau = 1 + sum_k prod_{j<=k} a_j."""
        targets_ = float(sums["targets"])
        weight = float(sums["weight"])
        out = {"loss": float(sums["loss_sum"]) / weight if weight else 0.0, "supervised_tokens": targets_}
        out["accuracy"] = float(sums["correct"].sum()) / max(targets_, 1.0)
        tau, survive = 1.0, 1.0
        for k, (hits, tries, right, valid) in enumerate(
            zip(sums["hits"].tolist(), sums["tries"].tolist(), sums["correct"].tolist(), sums["valid"].tolist()), 1
        ):
            out[f"acc_slot_{k}"] = right / valid if valid else 0.0
            survive *= hits / tries if tries else 0.0
            tau += survive
        out["tau"] = tau
        return out

    def flops(self, prepared: DFlashPrepared) -> float:
        batch = prepared.batch
        lengths = batch.attention_mask.sum(dim=1)
        blocks = float(prepared.block_valid.sum())
        size = self.block_size
        visible = float((prepared.anchors * prepared.block_valid).sum()) * size + blocks * size * size
        return self.target_flops(lengths) + draft_train_flops(
            self.draft_config,
            self.target_config.vocab_size,
            context_tokens=float(lengths.sum()),
            block_tokens=blocks * size,
            visible_keys=visible,
            supervised_slots=float(prepared.label_mask.sum()),
        )
