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

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from flashdraft.target.frozen import FrozenTarget, decoder_layers
from flashdraft.target.source import load_tokenizer
from flashdraft.config import Config
from flashdraft.data import Batch
from flashdraft.errors import UserError
from flashdraft.objectives.dflash import sample_seed
from flashdraft.objectives.flops import TargetFlops

log = logging.getLogger(__name__)

# Model types whose own attention is bidirectional (diffusion LMs); configs with `is_causal: false` count too.
BIDIRECTIONAL_MODEL_TYPES = frozenset({"llada", "llada_moe", "llada2_moe", "dream"})
# Implementations that take an explicit 4D mask as given (sdpa: boolean, eager: additive).
MASKED_ATTENTION = ("sdpa", "eager")


def is_bidirectional(model_config) -> bool:
    return getattr(model_config, "is_causal", True) is False or (
        str(getattr(model_config, "model_type", "")).lower() in BIDIRECTIONAL_MODEL_TYPES
    )


def resolve_mask_token(config: Config, model_config, tokenizer) -> int:
    """objective.mask_token_id, else the tokenizer's mask token; an error naming the fix when neither exists."""
    mask_id = config.objective.mask_token_id
    if mask_id is None:
        mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise UserError(
            f"strategy {config.objective.name}: no mask token: objective.mask_token_id is not set and the tokenizer "
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


class MDLMStrategy:
    name = "mdlm"
    min_supervised_tokens = 1
    bidirectional_export = True

    def __init__(self, config: Config, model_config, mask_token_id: int):
        self.config = config
        self.model_config = model_config
        self.mask_token_id = mask_token_id
        self.eps = config.objective.mdlm_eps
        self.attention = config.target.attn_implementation
        self.device = torch.device("cpu")
        self.layer_flops: TargetFlops | None = None

    @classmethod
    def check(cls, config: Config, model_config, tokenizer) -> int:
        """Checks shared by the diffusion strategies; returns the mask token id."""
        if config.target.attn_implementation not in MASKED_ATTENTION:
            raise UserError(
                f"strategy {config.objective.name} gives the model an explicit 4D attention mask, which "
                f"target.attn_implementation={config.target.attn_implementation!r} does not take; "
                "set target.attn_implementation=sdpa (or eager)"
            )
        if config.draft.init_from and not (Path(config.draft.init_from) / "config.json").is_file():
            raise UserError(
                f"draft.init_from: {config.draft.init_from!r} is not a model folder (no config.json); give an "
                f"earlier export of strategy {config.objective.name} or leave draft.init_from out"
            )
        return resolve_mask_token(config, model_config, tokenizer)

    @classmethod
    def plan(cls, config: Config, target_config, tokenizer) -> MDLMStrategy:
        mask_id = cls.check(config, target_config, tokenizer)
        if not is_bidirectional(target_config) and not config.objective.allow_causal_model:
            raise UserError(
                f"strategy mdlm needs a bidirectional (diffusion) model, and {config.target.name_or_path} is a "
                f"causal-only {target_config.model_type!r} model: MDLM denoises masked tokens from both sides, "
                "which such a model was never trained to do. Use a diffusion LM (e.g. inclusionAI/LLaDA2.1-mini), "
                "objective.name=hybrid to keep an autoregressive loss, or objective.allow_causal_model=true to "
                "train this model bidirectionally anyway"
            )
        return cls(config, target_config, mask_id)

    # -- model -----------------------------------------------------------------------------------
    def pad_multiple(self, device: torch.device) -> int:
        return self.config.data.pad_to_multiple

    def build(self, device: torch.device) -> nn.Module:
        """The LM to train, fp32 master weights, from draft.init_from (an earlier export) or the target."""
        t = self.config.target
        source = self.config.draft.init_from or t.name_or_path
        # Loaded in target.dtype and upcast on the device: each rank's host holds the checkpoint's size only.
        model = FrozenTarget.load(
            source,
            dtype=getattr(torch, t.dtype),
            device=device,
            attn_implementation=t.attn_implementation,
            trust_remote_code=t.trust_remote_code,
        ).model.float()
        model.config.use_cache = False
        self.device = device
        self.layer_flops = TargetFlops(decoder_layers(model), self.model_config)
        return model.requires_grad_(True).train()

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        return list(decoder_layers(model))

    def frozen_shard_units(self) -> list[nn.Module]:
        return []

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
            gen = torch.Generator().manual_seed(sample_seed(self.config.train.seed, step, int(batch.sample_ids[row])))
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
        return 3 * self.forward_flops(prepared.batch.attention_mask.sum(dim=1), causal=False)

    def forward_flops(self, lengths: torch.Tensor, *, causal: bool) -> float:
        """Matmul FLOPs of one forward over sequences of `lengths` tokens, LM head over every position."""
        f = self.layer_flops
        tokens = float(lengths.sum())
        scores = float((lengths.double() ** 2).sum()) * (0.5 if causal else 1.0)
        attention = 2 * 2 * f.heads * f.head_dim * scores * f.attention_layers
        head = 2 * self.model_config.hidden_size * self.model_config.vocab_size * tokens
        return 2 * f.params * tokens + attention + head

    def export(self, state_dict: dict[str, torch.Tensor], path: Path, recipe: str | None) -> None:
        """The trained LM as an HF folder (save_pretrained, in target.dtype) with the tokenizer."""
        from transformers import AutoModelForCausalLM

        t = self.config.target
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.model_config, trust_remote_code=t.trust_remote_code)
        model.load_state_dict(state_dict, strict=False, assign=True)
        model.tie_weights()
        missing = [name for name, p in model.named_parameters() if p.is_meta]
        if missing:
            raise RuntimeError(f"export: the trained state has no values for {missing[:5]}")
        model.to(getattr(torch, t.dtype))
        model.config.use_cache = True
        if self.bidirectional_export:  # so that plain transformers runs it as it was trained (is_causal=False)
            model.config.is_causal = False
        tokenizer = load_tokenizer(self.config.draft.init_from or t.name_or_path,
                                           trust_remote_code=t.trust_remote_code)
        card = (f"# {path.name}\n\n`{self.name}` fine-tune of `{t.name_or_path}`"
                f"{f' (recipe `{recipe}`)' if recipe else ''}, trained with `flashdraft train`. "
                f"Mask token id: {self.mask_token_id}.\n")
        write_model_atomically(model, tokenizer, path, card)


def write_model_atomically(model: nn.Module, tokenizer, output: Path, card: str) -> None:
    """save_pretrained (model + tokenizer) into a temp folder beside `output`, then rename."""
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(card)
        if output.exists():
            shutil.rmtree(output)
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
