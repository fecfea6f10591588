"""The one config tree of every stage: typed sections, loaded from recipe YAML plus overrides.

    Config
      draft      shape of a fresh draft (draft-init, train)
      target     the frozen target LM (every stage)
      data       training / held-out chat data (train, dllm-evaluate)
      warmup     regeneration of the training answers by the target (warmup)
      objective  the training objective: dflash, mdlm or hybrid (train)
      train      optimizer, schedule, batch, checkpoints (train)
      evaluate   speculative-decoding benchmarks (evaluate, dllm-evaluate)
      promote    registry name and promotion policy (promote)
      launch     where training runs: local torchrun, PyTorchJob, TrainJob (launch, the pipeline's train step)
      tracking   MLflow (every stage)

Defaults describe a tiny CPU job; named recipes (`flashdraft/recipes/*.yaml`) override them; `key=value`
overrides (from the command line, or typed values from a component) override the recipe. Unknown keys,
wrong types and out-of-range values are errors that name the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flashdraft.errors import UserError

RECIPES_DIR = Path(__file__).parent / "recipes"
DTYPES = ("float32", "bfloat16", "float16")
# Keys that were renamed: old dotted key -> new one (a recipe or override with the old key is refused).
RENAMED = {
    "train.warmup_steps": "train.lr_warmup_steps",
    "train.warmup_ratio": "train.lr_warmup_ratio",
}
RENAMED_SECTIONS = {"strategy": "objective"}


def _check(condition: bool, key: str, requirement: str, value: Any) -> None:
    if not condition:
        raise UserError(f"{key} must be {requirement}, got {value!r}")


def _at_least(section: Any, name: str, **minimums: float) -> None:
    for key, minimum in minimums.items():
        value = getattr(section, key)
        if value is not None:
            _check(value >= minimum, f"{name}.{key}", f">= {minimum}", value)


def _one_of(value: Any, key: str, choices: Sequence[Any]) -> None:
    _check(value in choices, key, f"one of {', '.join(map(str, choices))}", value)


@dataclass(kw_only=True)
class TargetConfig:
    # hub id, local HF folder, .gguf file, or packaged:smollm2 (SmolLM2-135M-Instruct from PyPI)
    name_or_path: str = "packaged:smollm2"
    revision: str | None = None  # hub revision (branch, tag or commit); hub ids only
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    # Hybrid (Mamba-2) targets: refuse to start on transformers' slow reference path.
    require_fast_path: bool = False
    chat_template: str | None = None  # a Jinja chat template file, for targets without one (warmup)
    # Hub snapshots and dequantised GGUFs (default $FLASHDRAFT_CACHE or ~/.cache/flashdraft)
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        _one_of(self.dtype, "target.dtype", DTYPES)
        _check(bool(self.name_or_path), "target.name_or_path", "a hub id, folder, .gguf file or packaged:NAME",
               self.name_or_path)


@dataclass(kw_only=True)
class DraftConfig:
    """Shape of a fresh draft. Unset attention/MLP sizes are copied from the target's config."""

    num_layers: int = 1
    num_taps: int | None = None  # default: one tap per draft layer (the z-lab convention)
    target_layer_ids: list[int] | None = None
    block_size: int = 16
    mask_token_id: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    max_position_embeddings: int | None = None
    hidden_size: int | None = None  # only to check: it must equal the target's
    seed: int = 0
    # A draft folder written by `flashdraft draft-init` (or an exported draft) to start training from;
    # None: the trainer builds a fresh draft from the fields above.
    init_from: str | None = None
    output_dir: str | None = None  # where `flashdraft draft-init` writes the draft

    def __post_init__(self) -> None:
        _at_least(self, "draft", num_layers=1, num_taps=1, block_size=2, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=1, intermediate_size=1, max_position_embeddings=1)
        if self.target_layer_ids is not None:
            _check(bool(self.target_layer_ids), "draft.target_layer_ids", "a non-empty list (or null)", [])


@dataclass(kw_only=True)
class DataConfig:
    """Chat datasets; specs as in `flashdraft.data.sources`."""

    train: str | list[str] = "packaged:chitchat"
    eval: str | list[str] | None = None  # held-out specs; None: hold out `eval_samples` train rows
    eval_samples: int = 0
    limit: int | None = None  # rows of the train mixture (None: all)
    max_length: int = 256  # tokens per sample; longer conversations are truncated
    # Pad each batch's length up to a multiple of this, so compiled GPU kernels see few shapes.
    pad_to_multiple: int = 1
    seed: int = 0  # mixture subsets, hold-out split and the per-epoch shuffle
    format: str = "auto"  # of file and hub rows: auto (per row) | messages | sharegpt | alpaca | prompt
    skip_bad_rows: bool = False  # drop (and count) rows that are no conversation instead of failing
    num_proc: int | None = None  # processes that normalise and tokenise (None: up to 8 for large sets)
    # Prepared (tokenised) datasets, shared by `flashdraft prepare-data` and the trainer; None: the
    # trainer's <train.output_dir>/tokenized.
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        _at_least(self, "data", eval_samples=0, max_length=2, pad_to_multiple=1, limit=1, num_proc=1)
        _one_of(self.format, "data.format", ("auto", "messages", "sharegpt", "alpaca", "prompt"))


# The warmup's generation backends (flashdraft.data.generation).
WARMUP_BACKENDS = ("auto", "static", "graphed", "continuous", "vllm")


@dataclass(kw_only=True)
class WarmupConfig:
    """Regeneration of the training answers by the target (`flashdraft warmup`)."""

    # Prompt dataset specs (a mixture when several); their assistant turns are regenerated.
    prompts: list[str] = field(default_factory=lambda: ["packaged:reasoning_gym"])
    output_dir: str | None = None
    num_samples: int | None = None  # prompts to answer (None: all of the mixture)
    max_new_tokens: int = 2048
    # Tokens per conversation: it ends before a turn whose prompt + max_new_tokens would exceed this
    # (None: the target's context). Set it to data.max_length: tokens past it are never trained on.
    max_length: int | None = None
    # None: the target's generation_config (greedy when it does not sample).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    thinking: bool | None = None  # the chat template's enable_thinking switch; None: its default
    # Prompts per generate call; None: static 8 on a CPU and 64 on a GPU, graphed 64, continuous and vllm 512.
    batch_size: int | None = None
    # graphed backend: prompts of a call decoded at once (None: all of them); a row whose answer ended takes
    # the call's next prompt, so long answers do not hold the short ones' rows. It pays with many prompts a
    # row (batch_size of several times rows): 2x for 1,495 prompts through 128 rows, 1.2x for 256
    # (benchmarks/RESULTS.md section 8).
    rows: int | None = None
    # WARMUP_BACKENDS (flashdraft.data.generation): auto takes vLLM where installed on a GPU, else the
    # graphed backend (or continuous batching, for sliding windows) on a GPU for targets it serves, else static.
    backend: str = "auto"
    turns: str = "first"  # first: answer each conversation's first user turn | all: every user turn, in order
    seed: int = 0
    format: str = "jsonl"  # jsonl | parquet

    def __post_init__(self) -> None:
        _at_least(self, "warmup", num_samples=1, max_new_tokens=1, max_length=1, batch_size=1, rows=1,
                  temperature=0.0, top_k=0)
        if self.top_p is not None:
            _check(0 < self.top_p <= 1, "warmup.top_p", "in (0, 1]", self.top_p)
        if self.backend == "transformers":
            raise UserError("warmup.backend transformers was split in two: static (padded batches) and continuous "
                            "(transformers' continuous batching); use one of those, or auto")
        _one_of(self.backend, "warmup.backend", WARMUP_BACKENDS)
        if self.backend != "auto":  # auto is resolved with the target and the device (flashdraft.data.warmup)
            check_warmup_rows(self.rows, self.backend)
        _one_of(self.turns, "warmup.turns", ("first", "all"))
        _one_of(self.format, "warmup.format", ("jsonl", "parquet"))
        _check(bool(self.prompts), "warmup.prompts", "at least one dataset spec", self.prompts)


def check_warmup_rows(rows: int | None, backend: str) -> None:
    """warmup.rows is the graphed backend's; `backend` is the one named or the one auto resolved to."""
    if rows is not None and backend != "graphed":
        raise UserError(f"warmup.rows is the graphed backend's, and this warmup runs the {backend} backend; leave "
                        "warmup.rows unset, or use warmup.backend graphed (a GPU, an attention-only target)")


@dataclass(kw_only=True)
class ObjectiveConfig:
    name: str = "dflash"  # dflash | mdlm | hybrid (flashdraft.objectives)
    num_anchors: int = 16  # blocks per sample and step
    gamma: float | None = None  # decay of the slot weights exp(-(k-1)/gamma); None: the block-size rule
    attention: str = "auto"  # flex | sdpa | auto (flex on CUDA; sdpa with a dense mask elsewhere)
    lm_head_chunk: int = 1024  # tokens per LM-head chunk; 0 = full logits (memory hungry)
    # dflash: torch.compile every draft layer (fuses norms, rotary, activations; a compile per padded
    # batch length on the first steps). None: the rule in DFlashObjective.use_device (on GPUs, for
    # drafts wide enough or micro-batches large enough to gain).
    compile_layers: bool | None = None
    # dflash: torch.compile the frozen target's decoder layers through the last tap (one graph per padded
    # batch length, as the draft's). None: the rule in DFlashObjective.use_device (on GPUs, for
    # attention-only targets wide enough or micro-batches large enough to gain).
    compile_target: bool | None = None
    # mdlm / hybrid (diffusion LMs): the model itself is trained; see objectives/mdlm.py, hybrid.py.
    mask_token_id: int | None = None  # None: the tokenizer's mask token
    mdlm_eps: float = 1e-3  # mask probability p = (1 - eps) t + eps, t ~ U(0, 1)
    allow_causal_model: bool = False  # mdlm: train a causal-only model type bidirectionally anyway
    alpha: float = 1.0  # hybrid: loss = alpha * diffusion + autoregressive
    masking: str = "uniform"  # hybrid: uniform (one t per sample) | block (one t per mask_block_size tokens)
    mask_block_size: int = 32

    def __post_init__(self) -> None:
        _at_least(self, "objective", num_anchors=1, lm_head_chunk=0, alpha=0.0, mask_block_size=1)
        _check(0.0 < self.mdlm_eps < 1.0, "objective.mdlm_eps", "in (0, 1)", self.mdlm_eps)
        _one_of(self.masking, "objective.masking", ("uniform", "block"))
        _one_of(self.attention, "objective.attention", ("auto", "flex", "sdpa"))
        if self.gamma is not None:
            _check(self.gamma > 0, "objective.gamma", "> 0 (or null for the block-size rule)", self.gamma)


@dataclass(kw_only=True)
class TrainConfig:
    output_dir: str = "runs/train"
    seed: int = 0
    micro_batch_size: int = 1  # samples per rank and forward
    grad_accum_steps: int = 1
    epochs: int = 1
    max_steps: int | None = None  # stops earlier than `epochs` when set
    lr: float = 6e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    lr_warmup_ratio: float = 0.04  # learning-rate warmup, a share of the steps
    lr_warmup_steps: int | None = None  # overrides lr_warmup_ratio when set
    grad_clip: float = 1.0
    eval_every: int = 0  # steps between evaluations (0: only after the last step)
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 1
    shard_target: bool = False  # FSDP2-shard the frozen target's layers instead of replicating it
    peak_tflops: float = 780.0  # one accelerator's dense bf16 matmul rate (H200, measured), for MFU
    # auto: resume from the newest checkpoint in output_dir, refusing settings that would change the run
    # (raising max_steps or epochs is fine); force: resume despite such changes (logged).
    resume: str = "auto"

    def __post_init__(self) -> None:
        _at_least(self, "train", micro_batch_size=1, grad_accum_steps=1, epochs=1, eval_every=0,
                  checkpoint_every=1, keep_checkpoints=1, log_every=1, grad_clip=0.0, max_steps=1,
                  lr_warmup_steps=0, weight_decay=0.0)
        _check(0.0 <= self.lr_warmup_ratio < 1.0, "train.lr_warmup_ratio", "in [0, 1)", self.lr_warmup_ratio)
        _check(self.lr > 0 and math.isfinite(self.lr), "train.lr", "a finite number > 0", self.lr)
        _check(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "train.betas",
               "two numbers in [0, 1)", self.betas)
        _check(self.peak_tflops > 0, "train.peak_tflops", "> 0", self.peak_tflops)
        _one_of(self.resume, "train.resume", ("auto", "force"))


@dataclass(kw_only=True)
class EvaluateConfig:
    """Speculative decoding against plain decoding (`flashdraft evaluate`); the diffusion-LM evaluation
    (`flashdraft dllm-evaluate`) reads the `dllm_*` fields and `prompts`."""

    draft: str | None = None  # the draft folder (draft-init or train export)
    benchmarks: list[str] = field(default_factory=lambda: ["gsm8k", "humaneval", "chat"])
    output: str | None = None  # the report JSON; PNG plots are written next to it
    num_prompts: int | None = None  # first N prompts of each benchmark (None: all)
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy, and the lossless check
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    block_size: int | None = None  # None: the draft's
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on a GPU, fp32 on the CPU) | float32 | bfloat16 | float16
    seed: int = 0
    thinking: bool = False  # chat-template thinking mode; match the one the draft was trained with
    cuda_graphs: bool = True
    # torch.compile the target's and the draft's decoder layers; None: on CUDA for attention-only
    # targets (flashdraft.target.compiled_layers).
    compile: bool | None = None
    prompt_lookup: bool = True  # also measure transformers' prompt-lookup decoding as a baseline
    vllm: bool = False  # also measure with vLLM's DFlash speculative decoding (needs vllm and a GPU)
    prompts: list[str] = field(default_factory=list)  # dllm-evaluate: prompts to answer (default: held-out)
    dllm_samples: int = 2  # dllm-evaluate: held-out prompts to answer when `prompts` is empty
    dllm_gen_length: int = 32  # dllm-evaluate: tokens per generated answer
    dllm_steps: int = 16  # dllm-evaluate: unmasking passes per answer

    def __post_init__(self) -> None:
        _at_least(self, "evaluate", num_prompts=1, max_new_tokens=1, temperature=0.0, top_k=0, block_size=2,
                  dllm_samples=0, dllm_gen_length=1, dllm_steps=1)
        _check(0 < self.top_p <= 1, "evaluate.top_p", "in (0, 1]", self.top_p)
        _one_of(self.dtype, "evaluate.dtype", ("auto", *DTYPES))
        _check(bool(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)), "evaluate.device", "auto, cpu, cuda or cuda:N",
               self.device)
        _check(bool(self.benchmarks), "evaluate.benchmarks", "at least one benchmark", self.benchmarks)


@dataclass(kw_only=True)
class PromoteConfig:
    """Registration of a draft and the policy that moves the `champion` / `challenger` aliases."""

    draft: str | None = None  # the exported draft folder
    report: str | None = None  # report.json from `flashdraft evaluate`
    model_name: str | None = None  # registered model name
    primary_benchmark: str = "gsm8k"  # whose tau decides
    # The candidate's tau on the primary benchmark must exceed the champion's by MORE than this.
    min_tau_gain: float = 0.05
    # Every benchmark must be at least this lossless; below 1.0 only for low-precision evaluations.
    min_lossless: float = 1.0
    # A draft slower than plain decoding on the primary benchmark (speedup below this) is never champion,
    # also when there is no champion yet.
    min_speedup: float = 1.0
    output: str | None = None  # also write the decision as JSON here

    def __post_init__(self) -> None:
        _check(0.0 <= self.min_lossless <= 1.0, "promote.min_lossless", "a fraction in [0, 1]", self.min_lossless)
        _check(self.min_tau_gain >= 0, "promote.min_tau_gain", ">= 0", self.min_tau_gain)
        _check(self.min_speedup >= 0, "promote.min_speedup", ">= 0", self.min_speedup)
        if self.model_name is not None:
            # Registry filters quote the name, and a slash makes it a path: letters, digits, . _ - only.
            _check(bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", self.model_name)), "promote.model_name",
                   "letters, digits, '.', '_' or '-' (at most 128, starting with a letter or digit)", self.model_name)


@dataclass(kw_only=True)
class LaunchConfig:
    """Where `flashdraft train` runs: torchrun here (`local`), or a PyTorchJob / TrainJob on Kubernetes."""

    backend: str = "local"  # local | pytorchjob | trainjob
    command: str = "train"  # what runs: train, or warmup (the regeneration sharded over every GPU of every node)
    nodes: int = 1
    gpus_per_node: int = 1  # one training process per GPU
    procs_per_node: int | None = None  # processes per node without GPUs (local CPU runs, CPU smoke jobs)
    # The Kubernetes backends:
    image: str | None = None  # trainer image, e.g. REGISTRY/flashdraft-trainer:TAG (images/trainer)
    namespace: str | None = None  # default: the pipeline pod's or the kubeconfig context's namespace
    name: str | None = None  # job name (default flashdraft-train-<random>)
    # Shared RWX volumes CLAIM:/PATH[:SUBPATH]; the first holds checkpoints.
    pvcs: list[str] = field(default_factory=lambda: ["flashdraft-data:/data"])
    output_dir: str | None = None  # checkpoints and export on a PVC (default <first PVC>/runs/<name>)
    env: dict[str, str] = field(default_factory=dict)
    secret_env: list[str] = field(default_factory=list)  # ENV=SECRET:KEY
    tolerations: list[dict] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    cpu: str | None = None  # CPU request per node, e.g. 32
    memory: str | None = None  # memory request and limit per node, e.g. 512Gi
    shm_size: str = "16Gi"
    gpu_resource: str = "nvidia.com/gpu"
    backoff_limit: int = 3  # PyTorchJob restarts before failing
    elastic_min_nodes: int | None = None  # PyTorchJob: run elastically between this and `nodes`
    runtime: str = "flashdraft-torch"  # TrainJob: the ClusterTrainingRuntime (manifests/)
    timeout_s: float = 7 * 24 * 3600  # seconds to wait for the job
    poll_s: float = 10.0
    cleanup: str = "on-success"  # always | on-success | never

    def __post_init__(self) -> None:
        _one_of(self.backend, "launch.backend", ("local", "pytorchjob", "trainjob"))
        _one_of(self.command, "launch.command", ("train", "warmup"))
        _one_of(self.cleanup, "launch.cleanup", ("always", "on-success", "never"))
        _at_least(self, "launch", nodes=1, gpus_per_node=0, procs_per_node=1, backoff_limit=0, timeout_s=1,
                  poll_s=0.1)
        if self.procs_per_node is not None and self.gpus_per_node > 0:
            raise UserError("launch.procs_per_node is only for runs without GPUs (launch.gpus_per_node=0); "
                            "with GPUs there is one process per GPU")

    @property
    def procs(self) -> int:
        """Training processes per node."""
        return self.gpus_per_node if self.gpus_per_node > 0 else (self.procs_per_node or 1)


TRACKING_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")


@dataclass(kw_only=True)
class TrackingConfig:
    uri: str | None = None  # MLflow tracking URI; None: MLFLOW_TRACKING_URI, or no tracking
    experiment: str | None = None

    def __post_init__(self) -> None:
        if self.uri:
            check_tracking_uri(self.uri, "tracking.uri")


def check_tracking_uri(uri: str, where: str) -> None:
    """A tracking URI MLflow can use: a known scheme with what it needs after it."""
    scheme, sep, rest = uri.partition(":")
    known = scheme.split("+")[0].lower() in TRACKING_SCHEMES
    if not (sep and known and rest.strip("/")) or (scheme in ("http", "https") and not rest.startswith("//")):
        raise UserError(f"{where} {redact(uri)!r} is not a tracking URI MLflow can use; give http(s)://HOST:PORT, "
                        "sqlite:///PATH.db, file:///PATH or a database URL")


@dataclass(kw_only=True)
class Config:
    recipe: str | None = None  # the recipe this config came from (set by load_config)
    draft: DraftConfig = field(default_factory=DraftConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    promote: PromoteConfig = field(default_factory=PromoteConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


# -- building a config from data ------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`, converting only int -> float (and YAML's exponent strings)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except UserError:
                pass  # try the next member of the union; the error below names them all
        raise UserError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise UserError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise UserError(f"{where}: expected a mapping, got {value!r}")
        key_type, value_type = typing.get_args(tp)
        return {_coerce(k, key_type, where): _coerce(v, value_type, f"{where}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads exponents without a dot (6e-4) as strings.
        try:
            return float(value)
        except ValueError:
            pass
    if tp is Any:
        return value
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise UserError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    if tp is float and not math.isfinite(value):
        raise UserError(f"{where}: expected a finite number, got {value!r}")
    return value


def from_dict(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from a mapping; unknown keys and wrong types raise UserError."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    prefix = f"{where}." if where else ""
    for key in data:
        if f"{prefix}{key}" in RENAMED:
            raise UserError(f"config key {prefix}{key} was renamed to {RENAMED[prefix + key]}; use that")
        if not where and key in RENAMED_SECTIONS:
            raise UserError(f"config section {key!r} was renamed to {RENAMED_SECTIONS[key]!r}; use that")
    unknown = sorted(set(data) - names)
    if unknown:
        raise UserError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid keys here: {', '.join(sorted(names))}"
        )
    kwargs = {key: _coerce(value, hints[key], f"{prefix}{key}") for key, value in data.items()}
    return cls(**kwargs)


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Any) -> str:
    """The resolved config as YAML, sections in their declared order, credentials redacted (what stages
    write next to their outputs)."""
    return yaml.safe_dump(redacted(to_dict(config)), sort_keys=False)


_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<password>[^/@\s]+)@")


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by ***, e.g. http://user:***@host."""
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def redacted(data: Any) -> Any:
    """A copy of nested data with every string's URL passwords redacted (for files, params and logs)."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, Mapping):
        return {key: redacted(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [redacted(value) for value in data]
    return data


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> {"a.b": value}; lists and dicts below the leaves become JSON strings."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, tuple, Mapping)) else value
    return out


def recipe_path(name: str) -> Path:
    """A recipe by name (`nemotron_nano30b_dflash`, or the short `nemotron_nano30b`) or by YAML path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise UserError(f"recipe file {name!r} does not exist")
        return path
    for candidate in (RECIPES_DIR / f"{name}.yaml", RECIPES_DIR / f"{name}_dflash.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise UserError(f"unknown recipe {name!r}; known recipes: {', '.join(known)} (or give a YAML path)")


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"override {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: Sequence[str]) -> dict:
    """`a.b=value` strings -> nested dict; values are parsed as YAML (so 3, 1e-4, [1,2], true work)."""
    data: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"override {item!r} is not of the form key=value (e.g. train.max_steps=10)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise UserError(f"override {item!r}: the value is not valid YAML ({yaml_problem(err)}); quote it "
                            "to pass a string") from None
        _set_dotted(data, key.strip(), value)
    return data


def nest(values: Mapping[str, Any]) -> dict:
    """{"a.b": value} (typed values, as components pass them) -> nested dict."""
    data: dict = {}
    for key, value in values.items():
        _set_dotted(data, key, value)
    return data


def merge(base: Mapping, update: Mapping) -> dict:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line: the problem and where (its own message spans several lines)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else problem


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserError(f"{path} is not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of config sections, not {type(data).__name__}")
    return data


def with_values(config: Config, values: Mapping[str, Any]) -> Config:
    """`config` with typed `values` ({"a.b": value}) set over everything it holds, validated again."""
    return from_dict(Config, merge(to_dict(config), nest(values)))


def load_config(
    recipe: str | None = None,
    overrides: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults <- recipe YAML <- typed `values` ({"a.b": value}) <- `key=value` strings, validated."""
    data = read_yaml(recipe_path(recipe)) if recipe else {}
    if "recipe" in data:
        raise UserError(f"recipe {recipe}: 'recipe' is not a section; it records the recipe's own name")
    sections = {name for name, hint in typing.get_type_hints(Config).items() if dataclasses.is_dataclass(hint)}
    for name, section in data.items():
        # Checked before merging: a flag setting one key of the section would otherwise replace it silently.
        if name in sections and not isinstance(section, Mapping):
            raise UserError(f"recipe {recipe}: section {name!r} must be a mapping of its keys, e.g. "
                            f"`{name}: {{key: value}}`, got {section!r}")
    data = merge(merge(data, nest(values or {})), parse_overrides(overrides))
    data["recipe"] = recipe
    return from_dict(Config, data)
