"""The MDLM objective (LLaDA / LLaDA2 SFT): masked diffusion over the supervised tokens of a full LM.

Per sample and step, t ~ U(0, 1) and p = (1 - eps) t + eps; every supervised token is replaced by the
mask token independently with probability p (prompt tokens stay clean). The model reads the corrupted
sequence bidirectionally: it gets an explicit 4D attention mask in which every real token sees every real
token, so a causal-only architecture is not silently kept causal. The loss is

    sum over masked supervised tokens i of CE(logits_i, x_i) / p

and the trainer divides it by the global number of supervised tokens (all micro-steps, all ranks): the
LLaDA SFT estimate of the negative ELBO per supervised token. t and the per-token draws come from a
generator seeded by (train.seed, step, sample id) and cover the sample's own length, so a sample is
corrupted identically however a batch is split or padded.

Unlike dflash, the trained module is the LM itself: `target.name_or_path` (or `draft.init_from`, an
earlier export), trained in full and exported with save_pretrained (plus its tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from flashdraft.config import Config
from flashdraft.data import Batch
from flashdraft.errors import UserError
from flashdraft.objectives.dflash import sample_seed
from flashdraft.objectives.flops import DecoderFlops, lm_forward_flops
from flashdraft.target.frozen import FrozenTarget, decoder_layers

# Model types whose own attention is bidirectional (diffusion LMs); configs with `is_causal: false` count too.
BIDIRECTIONAL_MODEL_TYPES = frozenset({"llada", "llada_moe", "llada2_moe", "dream"})
# Implementations that take an explicit 4D mask as given (sdpa: boolean, eager: additive).
MASKED_ATTENTION = ("sdpa", "eager")


def is_bidirectional(model_config) -> bool:
    return getattr(model_config, "is_causal", True) is False or (
        str(getattr(model_config, "model_type", "")).lower() in BIDIRECTIONAL_MODEL_TYPES
    )


def diffusion_mask_token(config: Config, model_config, tokenizer) -> int:
    """objective.mask_token_id, else the tokenizer's mask token (a diffusion LM was trained with its own);
    an error naming the fix when neither exists."""
    mask_id = config.objective.mask_token_id
    if mask_id is None:
        mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise UserError(
            f"objective {config.objective.name}: no mask token: objective.mask_token_id is not set and the tokenizer "
            f"of {config.target.name_or_path} has none; set objective.mask_token_id=<the model's [MASK] id> "
            "(LLaDA2.x: 156895)"
        )
    vocab = model_config.vocab_size
    if not 0 <= mask_id < vocab:
        raise UserError(f"objective.mask_token_id={mask_id} is outside the model's vocabulary (0..{vocab - 1})")
    return int(mask_id)


def attention_mask_4d(attention_mask: torch.Tensor, *, causal: bool, implementation: str) -> torch.Tensor:
    """[N, 1, S, S] mask over real keys (and, if `causal`, keys at or before the query) in the form the
    attention implementation takes as given: boolean for sdpa, additive float32 for eager."""
    n, s = attention_mask.shape
    keep = attention_mask.bool()[:, None, None, :].expand(n, 1, s, s)
    if causal:
        keep = keep & torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
    if implementation == "sdpa":
        return keep
    return torch.zeros(keep.shape, device=keep.device).masked_fill(~keep, torch.finfo(torch.float32).min)


@dataclass
class MaskedPrepared:
    batch: Batch
    noisy_ids: torch.Tensor  # [N, S] input ids with masked tokens replaced by the mask id
    masked: torch.Tensor  # [N, S] bool, masked supervised tokens
    mask_prob: torch.Tensor  # [N, S] float32, p of each position (0 past the sample's end)
    supervised: torch.Tensor  # [N, S] bool, the tokens the loss is normalised by

    @property
    def num_targets(self) -> int:
        return int(self.supervised.sum())

    def to(self, device: torch.device) -> MaskedPrepared:
        return MaskedPrepared(self.batch.to(device), self.noisy_ids.to(device), self.masked.to(device),
                              self.mask_prob.to(device), self.supervised.to(device))


class MDLMObjective:
    name = "mdlm"
    draft_config = None  # trains the LM itself
    bidirectional = True
    min_supervised_tokens = 1
    compiles = False

    def __init__(self, config: Config, model_config, mask_token_id: int):
        self.config = config
        self.model_config = model_config
        self.mask_token_id = mask_token_id
        self.eps = config.objective.mdlm_eps
        self.attention = config.target.attn_implementation
        self.device = torch.device("cpu")
        self.layer_flops: DecoderFlops | None = None

    @classmethod
    def check(cls, config: Config, model_config, tokenizer) -> int:
        """Checks shared by the diffusion objectives; returns the mask token id."""
        if config.target.attn_implementation not in MASKED_ATTENTION:
            raise UserError(
                f"objective {config.objective.name} gives the model an explicit 4D attention mask, which "
                f"target.attn_implementation={config.target.attn_implementation!r} does not take; "
                "set target.attn_implementation=sdpa (or eager)"
            )
        if config.draft.init_from and not (Path(config.draft.init_from) / "config.json").is_file():
            raise UserError(
                f"draft.init_from: {config.draft.init_from!r} is not a model folder (no config.json); give an "
                f"earlier export of objective {config.objective.name} or leave draft.init_from out"
            )
        return diffusion_mask_token(config, model_config, tokenizer)

    @classmethod
    def plan(cls, config: Config, target_config, tokenizer) -> MDLMObjective:
        mask_id = cls.check(config, target_config, tokenizer)
        if not is_bidirectional(target_config) and not config.objective.allow_causal_model:
            raise UserError(
                f"objective mdlm needs a bidirectional (diffusion) model, and {config.target.name_or_path} is a "
                f"causal-only {target_config.model_type!r} model: MDLM denoises masked tokens from both sides, "
                "which such a model was never trained to do. Use a diffusion LM (e.g. inclusionAI/LLaDA2.1-mini), "
                "objective.name=hybrid to keep an autoregressive loss, or objective.allow_causal_model=true to "
                "train this model bidirectionally anyway"
            )
        return cls(config, target_config, mask_id)

    # -- model -----------------------------------------------------------------------------------
    def use_device(self, device: torch.device) -> None:
        self.device = device

    @property
    def pad_multiple(self) -> int:
        return self.config.data.pad_to_multiple

    def bind(self, model: nn.Module, target: FrozenTarget | None) -> None:
        self.layer_flops = DecoderFlops(decoder_layers(model), self.model_config)

    def logits(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
               causal: bool) -> torch.Tensor:
        mask = attention_mask_4d(attention_mask, causal=causal, implementation=self.attention)
        return model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits

    # -- one step --------------------------------------------------------------------------------
    def supervised(self, batch: Batch) -> torch.Tensor:
        return batch.loss_mask.bool()

    def mask_probabilities(self, length: int, gen: torch.Generator) -> torch.Tensor:
        """[length] p per position: one t for the whole sample."""
        t = torch.rand(1, generator=gen, dtype=torch.float64)
        return ((1 - self.eps) * t + self.eps).float().expand(length)

    def prepare(self, batch: Batch, step: int) -> MaskedPrepared:
        n, seq_len = batch.input_ids.shape
        supervised = self.supervised(batch)
        masked = torch.zeros(n, seq_len, dtype=torch.bool)
        probs = torch.zeros(n, seq_len)
        for row, length in enumerate(batch.attention_mask.sum(dim=1).tolist()):
            gen = torch.Generator().manual_seed(
                sample_seed(self.config.train.seed, step, int(batch.sample_ids[row])))
            p = self.mask_probabilities(int(length), gen)
            draws = torch.rand(int(length), generator=gen)
            probs[row, :length] = p
            masked[row, :length] = (draws < p) & supervised[row, :length]
        noisy = batch.input_ids.masked_fill(masked, self.mask_token_id)
        return MaskedPrepared(batch, noisy, masked, probs, supervised)

    def diffusion_terms(self, model: nn.Module, prepared: MaskedPrepared):
        """(sum of CE/p over masked tokens, sum of CE, number right) on the bidirectional pass."""
        batch = prepared.batch
        logits = self.logits(model, prepared.noisy_ids, batch.attention_mask, causal=False)
        labels = batch.input_ids[prepared.masked]
        ce = F.cross_entropy(logits[prepared.masked].float(), labels, reduction="none")
        weighted = (ce / prepared.mask_prob[prepared.masked]).sum()
        right = (logits[prepared.masked].argmax(dim=-1) == labels).sum()
        return weighted, ce.detach().sum(), right

    def loss(self, model: nn.Module, prepared: MaskedPrepared) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        prepared = prepared.to(self.device)
        loss_sum, ce_sum, right = self.diffusion_terms(model, prepared)
        return loss_sum, {
            "loss_sum": loss_sum.detach().float(),
            "targets": prepared.supervised.sum().float(),
            "tokens": prepared.batch.attention_mask.sum().float(),
            "masked": prepared.masked.sum().float(),
            "masked_ce_sum": ce_sum.float(),
            "masked_correct": right.float(),
        }

    def summarise(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """loss (the trained objective per supervised token), masked-token CE and accuracy, mask rate."""
        targets_, masked = float(sums["targets"]), float(sums["masked"])
        return {
            "loss": float(sums["loss_sum"]) / max(targets_, 1.0),
            "masked_ce": float(sums["masked_ce_sum"]) / max(masked, 1.0),
            "masked_accuracy": float(sums["masked_correct"]) / max(masked, 1.0),
            "mask_rate": masked / max(targets_, 1.0),
            "supervised_tokens": targets_,
        }

    def flops(self, prepared: MaskedPrepared) -> float:
        lengths = prepared.batch.attention_mask.sum(dim=1)
        return 3 * lm_forward_flops(self.layer_flops, self.model_config, lengths, causal=False)
