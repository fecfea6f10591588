"""CUDA-only checks: the GPU paths (FlexAttention training, bf16 FSDP2, NCCL) give the CPU-verified results.

Skipped without a CUDA device (CI has none); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

import json

import pytest
import torch

from flashdraft.data.sampling import Sampling
from train_helpers import alphabet_chats, read_metrics, run_cli, tiny_train_args

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _objective_on_cuda(target_path, attention: str, compile_layers: bool = False):
    from dflash_helpers import make_objective

    objective, draft = make_objective(target_path, torch.device("cuda"), attention=attention, num_anchors=6,
                                      compile_layers=compile_layers)
    # The trainer runs the draft under FSDP2 in bf16; here both attention paths are compared unwrapped in
    # float32, so the inputs stay float32 too.
    objective.compute_dtype = torch.float32
    return objective, draft


@pytest.mark.parametrize("compile_layers", [False, True])
def test_flex_attention_loss_and_grads_equal_the_dense_mask_path(tiny_target, compile_layers):
    """The dense path equals the naive reference on CPU (objectives/test_dflash.py); flex must equal it here,
    forward and backward, for blocks that overlap, padding and a single block per sample; also inside
    compiled draft layers (the GPU default for wide drafts), where inductor lays out the transposed query
    itself: in decoding that layout once made a flex call wrong (target/flex_decode.py)."""
    from dflash_helpers import make_batch

    results = []
    for attention in ("flex", "sdpa"):
        objective, draft = _objective_on_cuda(tiny_target("qwen3"), attention, compile_layers and attention == "flex")
        assert objective.compile_layers == (compile_layers and attention == "flex")
        assert objective.use_flex == (attention == "flex")
        prepared = objective.prepare(make_batch(lengths=(40, 23)), step=5)
        loss_sum, _ = objective.loss(draft, prepared)
        (loss_sum / prepared.num_targets).backward()
        results.append((loss_sum.detach(), {n: p.grad.detach().clone() for n, p in draft.named_parameters()}))
    (flex_loss, flex_grads), (dense_loss, dense_grads) = results
    # float32 throughout; flex's Triton kernel may use TF32 dots, hence 2e-3 rather than 1e-5.
    torch.testing.assert_close(flex_loss, dense_loss, rtol=2e-3, atol=2e-3)
    for name, grad in dense_grads.items():
        torch.testing.assert_close(flex_grads[name], grad, rtol=2e-2, atol=2e-3, msg=name)


@pytest.mark.parametrize("nproc", [1, 2])
def test_training_learns_on_cuda_with_bf16_target(tiny_target, tmp_path, nproc):
    if torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} GPUs")
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=200)
    out = tmp_path / "run"
    done = run_cli(["train", *tiny_train_args(tiny_target("qwen3"), data, out, **{
        "target.dtype": "bfloat16", "objective.attention": "flex", "draft.block_size": 8,
        "objective.num_anchors": 8, "train.micro_batch_size": 4 // nproc, "train.lr": "3e-3",
        "train.epochs": 100, "train.max_steps": 150, "train.log_every": 10, "data.eval_samples": 16,
        "train.checkpoint_every": 1000})], torchrun=nproc if nproc > 1 else 0)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_tau"] > 4.0, summary
    losses = [row["loss"] for row in read_metrics(out) if "loss" in row]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("model_type", ["qwen3", "nemotron_h"])
def test_speculative_decoding_on_cuda_with_graphs_is_lossless(tiny_target, tmp_path, model_type):
    """float32 on the GPU: static caches + CUDA graphs (+ compiled layers, or the Mamba rollback) give the
    plain greedy output."""
    from flashdraft.cli import main

    target = tiny_target(model_type)
    draft = tmp_path / "draft"
    assert main(["draft-init", "--target", str(target), "--output", str(draft), "--num-layers", "1",
                 "--block-size", "6"]) == 0
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {w} twice"}) + "\n" for w in ("one", "two", "three")))
    report_path = tmp_path / "report.json"
    assert main(["evaluate", "--draft", str(draft), "--target", str(target), "--bench", str(prompts),
                 "--max-new-tokens", "40", "--device", "cuda", "--dtype", "float32",
                 "--output", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    (bench,) = report["benchmarks"].values()
    assert bench["lossless"] == 1.0
    if model_type == "nemotron_h":  # decode and rollback ran on the kernels wherever they import
        from flashdraft.target.fast_path import mamba_kernel_errors

        assert report["settings"]["target_fast_path"] == (not mamba_kernel_errors())
    if model_type == "qwen3":  # Nemotron's eager MoE experts sync with the host: graphs may fall back
        assert report["settings"]["cuda_graphs"]["speculative"] is True
    # Compiled decoder layers, with q/k/v and gate/up read by one matmul each, by default for
    # attention-only targets: lossless with them too.
    assert report["settings"]["compiled"] is (model_type == "qwen3")
    assert report["settings"]["fused_projection_groups"] == (2 * 6 if model_type == "qwen3" else 0)
    assert report["settings"]["target_attention"] == "eager"  # sdpa's float32 kernel is 2.4x slower here
    assert report["settings"]["flex_decode_attention"] is False  # it stands in for sdpa only


@pytest.mark.parametrize("heads", [4, 6])
def test_flex_decode_fast_path_on_cuda_decodes_like_eager(monkeypatch, heads):
    """evaluate's fast path for sdpa targets (bf16 evaluations take it): fused projections, flex attention and
    compiled layers under CUDA graphs, here in float32 with IEEE dots, give transformers' eager greedy
    output in the plain and the speculative loop (with a transposed query the verify did not: flex_decode's
    docstring), for two query heads a key/value head and for three (folded into the query rows); flex
    attention is compiled into both steps, the draft's attention too; eager sdpa only in the prefills and
    the draft's first context."""
    import contextlib

    from decoding_helpers import NEW, PROMPT_LEN, compiled_attention, eager_sdpa_calls, loops, qwen3_case
    from flashdraft.decoding.decoding import generate
    from flashdraft.decoding.evaluate import ieee_float32_dots
    from flashdraft.target.compiled_layers import CompiledLayers
    from flashdraft.decoding.harness import flex_decode_for
    from flashdraft.target.frozen import decoder_layers
    from flashdraft.target.fused_projections import FusedProjections
    from flashdraft.target.step_graphs import StepGraphs

    ieee_float32_dots()
    torch._dynamo.reset()
    device = torch.device("cuda")
    block = 5
    target, draft, ids, reference, max_len = qwen3_case(block, device, heads)
    plain_runner, spec_runner, proposer = loops(target, draft, max_len)
    sdpa_calls = eager_sdpa_calls(monkeypatch)
    with contextlib.ExitStack() as stack:
        for part in (FusedProjections(target), flex_decode_for(max_len, proposer, device),
                     CompiledLayers([*decoder_layers(target), *draft.layers], lengths={1, block})):
            stack.enter_context(part)
        plain, plain_ops = compiled_attention(
            lambda: generate(plain_runner, ids, max_new_tokens=NEW, graphs=StepGraphs.for_device(device)))
        spec, spec_ops = compiled_attention(lambda: generate(
            spec_runner, ids, proposer=proposer, max_new_tokens=NEW, graphs=StepGraphs.for_device(device)))
    assert plain.tokens == reference[:NEW] and spec.tokens == reference[:NEW]
    assert plain_ops == spec_ops == {"flex_attention"}  # the draft's attention is flex too
    # The two prompts' eager prefills, and the draft's first context (the prompt's, eager: a new length).
    assert sdpa_calls == [PROMPT_LEN] * 2 * len(decoder_layers(target)) + [block] * len(draft.layers)


@pytest.mark.parametrize("compile_layers", [False, True])
def test_graphed_rows_taking_waiting_prompts_answer_like_static_batches_on_cuda(tiny_target, compile_layers):
    """The graphed backend with fewer rows than prompts, its decode step replayed as a CUDA graph (eager and
    compiled layers): a row taking a waiting prompt writes its keys into the cache outside the graph and its
    slots into the mask the graph reads; float32 with IEEE dots, the answers equal transformers' `generate`'s."""
    from transformers import AutoModelForCausalLM

    from flashdraft.data.generation import StaticGenerator, completion
    from flashdraft.decoding.evaluate import ieee_float32_dots
    from flashdraft.target.batch_decoder import BatchDecoder

    ieee_float32_dots()
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_target("qwen3"), dtype=torch.float32).to("cuda").eval()
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17], [40, 41], [7, 8], [30, 31, 32, 33], [50]]
    limits = [40, 3, 33, 17, 5, 30, 36]
    expected = StaticGenerator(model, stop_ids=[2], pad_id=0).generate(prompts, Sampling(), limits, [0])
    decoder = BatchDecoder(model, pad_id=0, compile_layers=compile_layers)
    answers = decoder.decode(prompts, limits, [2], lambda logits: logits.argmax(-1), rows=3)
    assert [completion(a, {2}, limit) for a, limit in zip(answers, limits)] == expected


# Runs one forward of a saved nemotron_h in a fresh process. transformers binds each Mamba-2 function
# (mamba_ssm's Triton scans, causal_conv1d's CUDA conv) when its modeling module is imported, so the
# reference path needs a process in which those packages cannot import.
_FORWARD = r"""
import sys
import torch
path, dtype, mode, out = sys.argv[1:]
if mode == "reference":
    sys.modules["mamba_ssm"] = sys.modules["causal_conv1d"] = None
from transformers import AutoModelForCausalLM
from flashdraft.target.fast_path import fast_path_status
from flashdraft.target.source import load_target_config as load_config
model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).cuda().eval()
ids = torch.randint(4, 260, (2, 45), generator=torch.Generator().manual_seed(0)).cuda()
with torch.no_grad():
    result = model(input_ids=ids, output_hidden_states=True)
torch.save({"fast_path": fast_path_status(load_config(path))["fast_path"], "logits": result.logits.float().cpu(),
            "hidden": [h.float().cpu() for h in result.hidden_states]}, out)
"""


@pytest.mark.parametrize("dtype,tolerance", [("float32", 5e-3), ("bfloat16", 3e-2)])
def test_mamba_fast_path_matches_the_reference_path(tiny_target, tmp_path, dtype, tolerance):
    """Hidden states and logits of a tiny nemotron_h agree between the kernels and transformers' PyTorch path.

    Tolerances: float32 runs the Triton scans with TF32 dots (~1e-3 relative); in bfloat16 both paths
    round every layer's output to 8 bits of mantissa (2^-8 = 4e-3 per rounding) in different orders,
    and the differences compound over the 6 layers.
    """
    import subprocess
    import sys

    from flashdraft.target.fast_path import mamba_kernel_errors

    if errors := mamba_kernel_errors():
        pytest.skip(f"the Mamba-2 kernels do not import here: {errors}")
    target = tiny_target("nemotron_h")
    runs = {}
    for mode in ("fast", "reference"):
        out = tmp_path / f"{mode}.pt"
        done = subprocess.run([sys.executable, "-c", _FORWARD, str(target), dtype, mode, str(out)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[mode] = torch.load(out)
        # transformers says so once when a Mamba-2 function falls back to its PyTorch code
        assert ("falling back to its reference PyTorch implementation" in done.stderr) == (mode == "reference")
    fast, reference = runs["fast"], runs["reference"]
    assert fast["fast_path"] and not reference["fast_path"]

    def relative(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    for layer, (a, b) in enumerate(zip(fast["hidden"], reference["hidden"], strict=True)):
        assert relative(a, b) < tolerance, f"hidden state {layer}: {relative(a, b):.2e}"
    assert relative(fast["logits"], reference["logits"]) < tolerance
