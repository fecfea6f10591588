"""DFlash training steps on GPUs: tokens/s, MFU and peak memory, against a naive baseline.

Setting (reference: SpecForge 0.2.0's DFlash wrapper, 0.339 s / 48% MFU / 36 GB on one H200): a frozen
target with random weights in bf16, samples of 4096 tokens, 512 anchors, block 16, and a DFlash draft
(Qwen3-8B shape: 5 layers; Nemotron-3-Nano-30B-A3B shape: 7 layers) trained with FSDP2 (bf16 params,
fp32 reduce) and AdamW. A step = anchors + target forward + draft forward/backward + LM-head loss over
every micro-batch of the global batch (the trainer's `accumulate_gradients`), then clip + optimizer step.
Under torchrun the global batch is split over the ranks (--global-batch, --samples per micro-batch) and
the target is replicated or FSDP2-sharded (--shard-target), as in the trainer. Variants:
  compiled - fast + every draft layer compiled (objective.compile_layers: the trainer's default on a GPU
             for drafts >= 2048 wide)
  fast     - FlexAttention block mask + chunked LM-head cross-entropy (the trainer's defaults on a GPU)
  naive    - dense boolean mask with SDPA + full [tokens x vocab] logits (the ratio baseline; OOM is reported)
  peer     - SpecForge 0.2.0's DFlash wrapper (`OnlineDFlashModel` and its draft) in this process, on the
             same target features, FSDP2 wrapping and AdamW (pip install --no-deps specforge==0.2.0)
The target runs through its last tapped layer only (FrozenTarget.context_features), with its decoder layers
compiled in fast and compiled where the trainer compiles them (objective.compile_target's rule: attention-only
targets of hidden >= 2048 on a GPU; --compile-target compiles them whatever the width) and eagerly in naive and
peer (as SpecForge runs it). Its forward is also
timed alone: eagerly through the tapped layers and through all layers, and, with the compiled variant,
compiled as the trainer does (with how far those features are from the eager ones, largest and relative
to their norm). --samples takes a list (2,4): one run per micro-batch size.
MFU = useful FLOPs (flashdraft.objectives.flops: target forward + draft forward/backward + LM head,
matmuls only, sparse attention counted as masked) / step time / (GPUs x 780 TFLOP/s, the measured bf16
matmul rate of an H200; override with --peak-tflops).

    python benchmarks/train_step.py --out benchmarks/train_step_h200.json              # Qwen3-8B shape
    python benchmarks/train_step.py --model nemotron-nano --variants compiled,fast --samples 2,4 --out nano.json
    torchrun --nproc-per-node 8 benchmarks/train_step.py --model nemotron-nano --variants fast \
        --global-batch 64 [--shard-target] --out nano_8gpu.json                         # scaling
    python benchmarks/train_step.py --model nemotron-nano --variants fast --profile --out nano.json  # + top ops
    python benchmarks/train_step.py --model smollm2 --seq-len 256 --anchors 16 --samples 2 --out small.json
    python benchmarks/train_step.py --tiny --out /tmp/tiny.json                         # CPU smoke run

Needs only torch and transformers (and this package's core modules); the peer variant also specforge.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, NemotronHConfig, Qwen3Config

from flashdraft.config import Config, TrainConfig, from_dict
from flashdraft.data import Batch
from flashdraft.model import DFlashDraftConfig, DFlashDraftModel
from flashdraft.objectives.dflash import DFlashObjective, decay_gamma
from flashdraft.target.fast_path import fast_path_status
from flashdraft.target.frozen import FrozenTarget, decoder_layers
from flashdraft.train.distributed import setup, shard, shard_frozen, teardown
from flashdraft.train.optim import build_optimizer
from flashdraft.train.step import accumulate_gradients

NEMOTRON_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
_BLOCK_TYPES = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}


def target_config(model: str):
    if model == "qwen3-8b":
        return Qwen3Config(
            vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
            max_position_embeddings=40960, tie_word_embeddings=False,
        )
    if model == "nemotron-nano":
        return NemotronHConfig(
            vocab_size=131072, hidden_size=2688, layers_block_type=[_BLOCK_TYPES[c] for c in NEMOTRON_PATTERN],
            num_attention_heads=32, num_key_value_heads=2, head_dim=128, intermediate_size=1856,
            mamba_num_heads=64, mamba_head_dim=64, ssm_state_size=128, n_groups=8,
            n_routed_experts=128, num_experts_per_tok=6, moe_intermediate_size=1856,
            moe_shared_expert_intermediate_size=3712, max_position_embeddings=262144, tie_word_embeddings=False,
        )
    if model == "smollm2":  # SmolLM2-135M-Instruct, the small real recipe's target
        return LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, head_dim=64, rope_theta=100000.0, max_position_embeddings=8192,
            tie_word_embeddings=True,
        )
    if model == "tiny":
        return Qwen3Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        )
    raise ValueError(model)


def draft_config(model: str, target, layers: int | None = None) -> DFlashDraftConfig:
    """The draft of `model`'s recipe; `layers` overrides its number of layers."""
    shapes = {
        "qwen3-8b": dict(layers=5, heads=32, kv=8, inter=12288, taps=[1, 9, 17, 25, 33], mask=151669, theta=1e6),
        "nemotron-nano": dict(layers=7, heads=21, kv=3, inter=8064, taps=[1, 13, 25, 37, 49], mask=18, theta=1e7),
        "smollm2": dict(layers=4, heads=9, kv=3, inter=1536, taps=[1, 7, 14, 20, 27], mask=2, theta=1e5),
        "tiny": dict(layers=2, heads=4, kv=2, inter=128, taps=[1, 2], mask=500, theta=1e6),
    }[model]
    return DFlashDraftConfig(
        hidden_size=target.hidden_size, vocab_size=target.vocab_size,
        num_hidden_layers=shapes["layers"] if layers is None else layers,
        num_attention_heads=shapes["heads"], num_key_value_heads=shapes["kv"],
        head_dim={"tiny": 16, "smollm2": 64}.get(model, 128), intermediate_size=shapes["inter"], rms_norm_eps=1e-6,
        max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": shapes["theta"]},
        num_target_layers=target.num_hidden_layers,
        dflash_config={"mask_token_id": shapes["mask"], "target_layer_ids": shapes["taps"], "block_size": 16},
    )


def make_batch(sample_ids: list[int], seq_len: int, vocab: int, prompt: int = 64) -> Batch:
    """Random token rows, each drawn from its sample id: a global batch is the same however it is split."""
    rows = [torch.randint(0, vocab - 1, (seq_len,), generator=torch.Generator().manual_seed(i)) for i in sample_ids]
    loss_mask = torch.ones(len(rows), seq_len, dtype=torch.bool)
    loss_mask[:, :prompt] = False
    return Batch(torch.stack(rows), torch.ones(len(rows), seq_len, dtype=torch.long), loss_mask,
                 torch.tensor(sample_ids))


def rank_batches(samples: int, global_batch: int, seq_len: int, dist, vocab: int) -> list[Batch]:
    """This rank's micro-batches of the global batch (sample ids interleaved over ranks)."""
    micro_steps = global_batch // (dist.world * samples)
    return [make_batch([(m * dist.world + dist.rank) * samples + j for j in range(samples)], seq_len, vocab)
            for m in range(micro_steps)]


def log(dist, message: str) -> None:
    """Progress on stderr (rank 0): where a run's minutes go."""
    if dist.is_main:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(name, model, target, tconfig, batches, global_batch: int, args, dist) -> dict:
    """Time `args.steps` full optimizer steps after `args.warmup` untimed ones."""
    device = dist.device
    fast = name in ("fast", "compiled")
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    config = from_dict(Config, {
        "target": {"dtype": dtype},
        # The micro-batch's tokens, which the trainer's compile rules read.
        "train": {"micro_batch_size": batches[0].input_ids.shape[0]}, "data": {"max_length": args.seq_len},
        "objective": {"num_anchors": args.anchors, "lm_head_chunk": args.chunk if fast else 0,
                     "attention": "flex" if fast and device.type == "cuda" else "sdpa",
                     "compile_layers": name == "compiled",
                     # fast and compiled follow the trainer's rule; the naive baseline and the peer (whose
                     # objective binds for FLOP accounting only) run the target eagerly, as SpecForge does.
                     "compile_target": (args.compile_target or None) if fast else False},
    })
    dconfig = draft_config(model, tconfig, args.draft_layers)
    objective = DFlashObjective(config, dconfig, tconfig)
    objective.use_device(device)
    began_variant = time.perf_counter()
    result = {"variant": name, "attention": "flex" if name == "peer" else config.objective.attention,
              "lm_head_chunk": config.objective.lm_head_chunk,
              "target_compiled": objective.compile_target}
    try:
        step_fn = (peer_steps if name == "peer" else our_steps)(objective, dconfig, target, batches, args, dist)
        times, losses = [], []
        for step in range(args.warmup + args.steps):
            if step == args.warmup and device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            dist.barrier()
            began = time.perf_counter()
            flops, loss = step_fn(step)
            if step >= args.warmup:
                times.append(time.perf_counter() - began)
            elif step == args.warmup - 1:
                log(dist, f"{name}: {args.warmup} warmup steps in {time.perf_counter() - began_variant:.0f} s")
            losses.append(loss)
        if args.profile:
            result["profile"] = profile_step(step_fn, device)
        # The slowest rank's median: every rank waits for it in the next step's collectives anyway.
        step_time = max_over_ranks(sorted(times)[len(times) // 2], dist)
        tokens = global_batch * args.seq_len
        result.update(
            step_time_s=step_time,
            s_per_sample=step_time / global_batch,
            tokens_per_s=tokens / step_time,
            tokens_per_s_per_gpu=tokens / step_time / dist.world,
            useful_tflop=flops / 1e12,
            achieved_tflops=flops / step_time / 1e12,
            mfu=flops / step_time / (dist.world * args.peak_tflops * 1e12),
            peak_memory_gb=(max_over_ranks(torch.cuda.max_memory_allocated(device) / 2**30, dist)
                            if device.type == "cuda" else None),
            first_loss=losses[0],
            loss=losses[-1],
        )
    except torch.OutOfMemoryError as err:
        result.update(error=f"OOM: {str(err).splitlines()[0]}")
    except Exception as err:  # one variant failing (a compiler error, say) must not lose the others' numbers
        traceback.print_exc()
        result.update(error=error_line(err))
    finally:
        step_fn = None
        target.eager_layers()  # every variant starts from the eager target
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def error_line(err: Exception) -> str:
    """The exception's type and the first line of its message, for a results file."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def our_steps(objective, dconfig, target, batches, args, dist):
    """flashdraft's step as the trainer runs it: step -> (useful FLOPs over all ranks, loss)."""
    torch.manual_seed(0)
    draft = DFlashDraftModel(dconfig).float().to(dist.device)
    objective.bind(draft, target)  # compiles the draft layers when asked, before sharding (as the trainer)
    draft = shard(draft, list(draft.layers), dist.device)
    optimizer = build_optimizer(draft, TrainConfig())  # the trainer's: AdamW 6e-4, (0.9, 0.999), wd 0

    def step(index: int) -> tuple[float, float]:
        sums = accumulate_gradients(objective, draft, [objective.prepare(b, index) for b in batches], dist)
        finish_step(draft, optimizer, dist)
        return float(sums.pop("flops")), objective.summarise(sums)["loss"]

    return step


def peer_steps(objective, dconfig, target, batches, args, dist):
    """SpecForge 0.2.0's DFlash training wrapper (`OnlineDFlashModel`, FlexAttention, its default
    2048-token objective chunks) on its own Qwen3-style draft of the same shape, fed the same target
    features, sharded and optimised as ours: the step differs only in the draft and objective code."""
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.modeling.draft.dflash import DFlashDraftModel as PeerDraft

    peer_config = Qwen3Config(
        vocab_size=dconfig.vocab_size, hidden_size=dconfig.hidden_size, num_hidden_layers=dconfig.num_hidden_layers,
        num_attention_heads=dconfig.num_attention_heads, num_key_value_heads=dconfig.num_key_value_heads,
        head_dim=dconfig.head_dim, intermediate_size=dconfig.intermediate_size, rms_norm_eps=dconfig.rms_norm_eps,
        max_position_embeddings=dconfig.max_position_embeddings, rope_parameters=dconfig.rope_parameters,
        tie_word_embeddings=False,
    )
    peer_config.block_size = dconfig.block_size
    peer_config.num_target_layers = dconfig.num_target_layers
    peer_config.dflash_config = {"mask_token_id": dconfig.mask_token_id, "target_layer_ids": dconfig.target_layer_ids}
    backend = "flex_attention" if dist.device.type == "cuda" else "sdpa"
    peer_config._attn_implementation = backend  # the draft's attention; the wrapper builds the matching mask
    torch.manual_seed(0)
    draft = PeerDraft(peer_config).float().to(dist.device)
    objective.bind(draft, target)  # FLOP accounting only: the same useful work as ours
    draft = shard(draft, list(draft.layers), dist.device)
    wrapper = OnlineDFlashModel(
        draft, target.lm_head, target.embedding, mask_token_id=dconfig.mask_token_id, block_size=dconfig.block_size,
        attention_backend=backend, num_anchors=args.anchors,
        loss_decay_gamma=decay_gamma(dconfig.block_size),
    )
    optimizer = build_optimizer(draft, TrainConfig())
    taps = dconfig.target_layer_ids
    # The useful work of each step as ours counts it for the anchors it would draw then (outside the clock).
    flops_at = [float(dist.sum(torch.tensor(sum(objective.flops(objective.prepare(b, index)) for b in batches),
                                            dtype=torch.float64, device=dist.device)))
                for index in range(args.warmup + args.steps)]

    def step(index: int) -> tuple[float, float]:
        losses = []
        for batch in batches:
            ids, mask = batch.input_ids.to(dist.device), batch.loss_mask.to(dist.device)
            loss, _, _ = wrapper(ids, target.context_features(ids, taps), mask.float())
            (loss / len(batches)).backward()
            losses.append(loss.detach())
        finish_step(draft, optimizer, dist)
        return flops_at[index], float(torch.stack(losses).mean())

    return step


def finish_step(draft, optimizer, dist) -> None:
    """Clip, AdamW, zero the gradients; device synced."""
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(dist.device)


def profile_step(step_fn, device: torch.device, rows: int = 40) -> str:
    """One more step under torch.profiler: the ops with the most self time on the device (CPU on a CPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step_fn(0)
    return prof.key_averages().table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                     row_limit=rows)


def max_over_ranks(value: float, dist) -> float:
    out = torch.tensor(value, dtype=torch.float64, device=dist.device)
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MAX)
    return float(out)


def target_forward_time(target: FrozenTarget, batch: Batch, layer_ids, args, dist, all_layers: bool = False) -> float:
    """The target's forward over one micro-batch (all ranks run it: a sharded target gathers its layers):
    through the last tapped layer as in training, or (`all_layers`) through every layer."""
    ids = batch.input_ids.to(dist.device)
    times = []
    for step in range(args.warmup + args.steps):
        sync(dist.device)
        began = time.perf_counter()
        if all_layers:
            target.model.get_decoder()(input_ids=ids, use_cache=False)
        else:
            target.context_features(ids, layer_ids)
        sync(dist.device)
        if step >= args.warmup:
            times.append(time.perf_counter() - began)
    return max_over_ranks(sorted(times)[len(times) // 2], dist)


def compiled_target_forward(target: FrozenTarget, batch: Batch, layer_ids, args, dist) -> dict:
    """The training forward of the target with its decoder layers compiled as the trainer compiles them:
    its time, and how far its features are from the eager ones (fused kernels round differently): the
    largest difference and the difference's norm relative to the features' norm."""
    ids = batch.input_ids.to(dist.device)
    try:
        target.compile_layers(max(layer_ids))
        seconds = target_forward_time(target, batch, layer_ids, args, dist)
        compiled = target.context_features(ids, layer_ids).float()
    except Exception as err:  # a compiler error must not lose the other numbers
        traceback.print_exc()
        return {"target_forward_compiled_error": error_line(err)}
    finally:
        target.eager_layers()
    eager = target.context_features(ids, layer_ids).float()
    out = {"target_forward_compiled_s": seconds,
           "target_compiled_max_abs_diff": float((compiled - eager).abs().max()),
           "target_compiled_rel_diff": float((compiled - eager).norm() / eager.norm())}
    if not args.shard_target and target.model.dtype != torch.float32:
        # How far each low-precision path is from the float32 forward of the same weights: the scale
        # against which the compiled path's difference from the eager one can be judged.
        reference = float32_features(target, ids, layer_ids)
        out["target_rel_diff_from_float32"] = {name: float((f - reference).norm() / reference.norm())
                                               for name, f in (("eager", eager), ("compiled", compiled))}
    return out


def float32_features(target: FrozenTarget, ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """The eager training forward with the target's weights cast to float32 (and back: bf16 -> float32 ->
    bf16 is exact). Parameters only: buffers such as the rotary frequencies keep their own dtype."""
    params = list(target.model.parameters())
    dtypes = [p.dtype for p in params]
    for p in params:
        p.data = p.data.float()
    try:
        return target.context_features(ids, layer_ids).float()
    finally:
        for p, dtype in zip(params, dtypes):
            p.data = p.data.to(dtype)


def bench_model(model: str, args, dist) -> list[dict]:
    """One result per micro-batch size in --samples, all against one target."""
    began = time.perf_counter()
    tconfig = target_config(model)
    dtype = torch.bfloat16 if dist.device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(dist.device):
        target = FrozenTarget(AutoModelForCausalLM.from_config(tconfig, dtype=dtype))
    if args.shard_target:
        shard_frozen(decoder_layers(target.model))
    log(dist, f"{model}: target built in {time.perf_counter() - began:.0f} s")
    taps = draft_config(model, tconfig, args.draft_layers).target_layer_ids
    results = []
    for samples in args.samples:
        global_batch = args.global_batch or samples * dist.world
        batches = rank_batches(samples, global_batch, args.seq_len, dist, tconfig.vocab_size)
        out = {"model": model, "gpus": dist.world, "global_batch": global_batch, "samples_per_micro_batch": samples,
               "micro_batches_per_rank": len(batches), "target_sharded": args.shard_target, "seq_len": args.seq_len,
               "anchors": args.anchors, "block_size": 16, "target_fast_path": fast_path_status(tconfig),
               "target_layers_run": max(taps) + 1, "target_layers": tconfig.num_hidden_layers,
               "target_forward_s": target_forward_time(target, batches[0], taps, args, dist),
               "target_forward_all_layers_s": target_forward_time(target, batches[0], taps, args, dist, all_layers=True),
               **(compiled_target_forward(target, batches[0], taps, args, dist)
                  if "compiled" in args.variants else {}),
               "variants": []}
        log(dist, f"{model}, {samples} a micro-batch: target forward {out['target_forward_s']:.3f} s "
                  f"({out['target_forward_all_layers_s']:.3f} s through all layers)")
        for variant in args.variants:
            out["variants"].append(run_variant(variant, model, target, tconfig, batches, global_batch, args, dist))
            log(dist, f"{model}, {samples} a micro-batch, {variant}: done")
        results.append(out)
    del target
    gc.collect()
    return results


def table(results: list[dict]) -> str:
    head = f"{'model':<14}{'variant':<9}{'step s':>9}{'s/sample':>9}{'tok/s':>10}{'TFLOP':>8}{'TFLOP/s':>9}{'MFU':>7}{'peak GB':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        for v in r["variants"]:
            if "error" in v:
                lines.append(f"{r['model']:<14}{v['variant']:<9}  {v['error'][:60]}")
                continue
            peak = f"{v['peak_memory_gb']:.1f}" if v["peak_memory_gb"] is not None else "-"
            lines.append(
                f"{r['model']:<14}{v['variant']:<9}{v['step_time_s']:>9.3f}{v['s_per_sample']:>9.3f}"
                f"{v['tokens_per_s']:>10.0f}"
                f"{v['useful_tflop']:>8.1f}{v['achieved_tflops']:>9.1f}{v['mfu']:>7.1%}{peak:>9}"
            )
        done = {v["variant"]: v["step_time_s"] for v in r["variants"] if "error" not in v}
        pairs = (("naive", "fast"), ("fast", "compiled"), ("peer", "fast"), ("peer", "compiled"))
        ratio = "".join(f", {slow}/{quick} step time {done[slow] / done[quick]:.2f}x"
                        for slow, quick in pairs if {slow, quick} <= done.keys())
        if any(v.get("target_compiled") for v in r["variants"]):
            ratio += "; our variants ran the target's layers compiled (objective.compile_target)"
        kernels = "" if not r["target_fast_path"]["hybrid"] else (
            ", Mamba-2 kernels " + ("on" if r["target_fast_path"]["fast_path"] else "OFF (reference path)"))
        lines.append(f"{'':<14}{r['gpus']} GPU(s), {r['global_batch']} x {r['seq_len']} tokens a step "
                     f"({r['samples_per_micro_batch']} a micro-batch), target "
                     f"{'sharded' if r['target_sharded'] else 'replicated'}; its forward of one micro-batch "
                     f"{r['target_forward_s']:.3f} s through layer {r['target_layers_run']} of {r['target_layers']} "
                     f"({r['target_forward_all_layers_s']:.3f} s through all{compiled_target(r)}){ratio}{kernels}")
    return "\n".join(lines)


def compiled_target(result: dict) -> str:
    if "target_forward_compiled_error" in result:
        return f"; compiled target failed: {result['target_forward_compiled_error']}"
    if "target_forward_compiled_s" not in result:
        return ""
    from_float32 = result.get("target_rel_diff_from_float32")
    return (f"; {result['target_forward_compiled_s']:.3f} s with compiled layers, features within "
            f"{result['target_compiled_max_abs_diff']:.2g} of eager, {result['target_compiled_rel_diff']:.1e} "
            "relative" + (f" (from float32 weights' features: eager {from_float32['eager']:.1e}, compiled "
                          f"{from_float32['compiled']:.1e})" if from_float32 else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--model", choices=["qwen3-8b", "nemotron-nano", "smollm2", "both"], default="qwen3-8b",
                        help="target shape (smollm2: the small recipe's; give it its --seq-len 256 --anchors 16)")
    parser.add_argument("--variants", default="peer,compiled,fast",
                        help="comma list of peer, compiled, fast, naive (peer: skipped where specforge is missing)")
    parser.add_argument("--samples", default="1", help="samples (sequences) per micro-batch; a comma list runs each")
    parser.add_argument("--global-batch", type=int, default=None,
                        help="samples per optimizer step over all ranks (default: --samples x ranks)")
    parser.add_argument("--shard-target", action="store_true", help="FSDP2-shard the target instead of replicating it")
    parser.add_argument("--draft-layers", type=int, default=None,
                        help="draft layers (default: the shape's: qwen3-8b 5, nemotron-nano 7, smollm2 4)")
    parser.add_argument("--compile-target", action="store_true",
                        help="fast and compiled compile the target's layers whatever the trainer's rule says")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--anchors", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=2048, help="LM-head chunk (tokens) of the fast variant")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    parser.add_argument("--peak-tflops", type=float, default=780.0)
    parser.add_argument("--profile", action="store_true",
                        help="profile one extra step: the top ops by device time go into the JSON and the output")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: checks the script, not speed")
    args = parser.parse_args(argv)
    if args.draft_layers is not None and args.draft_layers < 1:
        parser.error(f"--draft-layers must be at least 1, got {args.draft_layers}")
    args.variants = [v for v in args.variants.split(",") if v]
    if unknown := set(args.variants) - {"peer", "compiled", "fast", "naive"}:
        parser.error(f"--variants: unknown {sorted(unknown)}; choose from peer, compiled, fast, naive")
    if "peer" in args.variants and importlib.util.find_spec("specforge") is None:
        print("peer variant skipped: specforge is not installed (pip install --no-deps specforge==0.2.0)",
              file=sys.stderr)
        args.variants.remove("peer")
    try:
        args.samples = [int(n) for n in args.samples.split(",")]
    except ValueError:
        parser.error(f"--samples: expected a comma list of integers, got {args.samples!r}")
    if args.tiny:
        models = ["tiny"]
        args.seq_len, args.anchors, args.chunk = min(args.seq_len, 192), min(args.anchors, 8), min(args.chunk, 32)
    else:
        models = ["qwen3-8b", "nemotron-nano"] if args.model == "both" else [args.model]
    dist = setup()
    if not args.tiny and dist.device.type != "cuda":
        parser.error("needs a CUDA device (use --tiny for a CPU check)")
    for samples in args.samples:
        if samples < 1 or (args.global_batch or samples * dist.world) % (samples * dist.world):
            parser.error(f"--global-batch {args.global_batch} is not a positive multiple of --samples {samples} x "
                         f"{dist.world} ranks")
    results = [r for m in models for r in bench_model(m, args, dist)]
    teardown()
    if not dist.is_main:
        return 0
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": {
            "device": torch.cuda.get_device_name(dist.device) if dist.device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "peak_tflops": args.peak_tflops,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(table(results))
    for r in results:
        for v in r["variants"]:
            if "profile" in v:
                print(f"\n{r['model']} {v['variant']}: one step under torch.profiler\n{v['profile']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
