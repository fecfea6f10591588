"""benchmarks/train_step.py runs end to end on tiny CPU shapes with only torch + transformers, alone and
under torchrun (the multi-GPU scaling runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train_step.py"

# Run the script with `datasets` and `mlflow` made unimportable: the GPU box may not have them.
WITHOUT_EXTRAS = (
    "import runpy, sys; sys.modules['datasets'] = None; sys.modules['mlflow'] = None; "
    "sys.argv = [sys.argv[1]] + sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_tiny_benchmark(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, str(SCRIPT), "--tiny", "--samples", "2", "--steps", "1", "--warmup", "1",
         "--variants", "compiled,fast,naive", "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    (result,) = report["results"]
    assert [v["variant"] for v in result["variants"]] == ["compiled", "fast", "naive"]
    compiled, fast, naive = result["variants"]
    assert fast["lm_head_chunk"] > 0 and naive["lm_head_chunk"] == 0
    for v in (compiled, fast, naive):
        assert v["step_time_s"] > 0 and v["useful_tflop"] > 0 and 0 < v["mfu"]
    # Same weights, batch and anchors: the variants compute the same loss.
    assert abs(fast["loss"] - naive["loss"]) < 1e-4 and abs(compiled["loss"] - fast["loss"]) < 1e-4
    assert result["target_forward_s"] > 0 and result["target_forward_all_layers_s"] > 0 and report["machine"]["torch"]
    # The target's layers compiled as the trainer compiles them give its eager features (float32 here).
    assert result["target_forward_compiled_s"] > 0 and result["target_compiled_max_abs_diff"] < 1e-4
    assert result["target_compiled_rel_diff"] < 1e-5
    # On a CPU the rule leaves the target's layers eager in every variant's steps.
    assert not any(v["target_compiled"] for v in (compiled, fast, naive))
    assert (result["target_layers_run"], result["target_layers"]) == (3, 4)  # taps [1, 2] of 4 layers
    assert fast["s_per_sample"] == fast["step_time_s"] / 2 and not result["target_fast_path"]["hybrid"]
    assert "naive/fast step time" in done.stdout and "fast/compiled step time" in done.stdout and "MFU" in done.stdout


def test_peer_variant_runs_specforge_on_the_same_work(tmp_path):
    """The peer (SpecForge's DFlash wrapper, in-process) trains on the same batches: the same useful
    FLOPs as ours, a finite loss that falls over its steps, reported next to ours with the ratio."""
    pytest.importorskip("specforge", reason="installed with --no-deps in the README's test command")
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--steps", "3", "--warmup", "1", "--variants", "peer,fast",
         "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peer, fast = json.loads(out.read_text())["results"][0]["variants"]
    assert peer["variant"] == "peer" and "error" not in peer, peer
    assert peer["useful_tflop"] == fast["useful_tflop"] > 0
    assert 0 < peer["loss"] < peer["first_loss"] < 20
    assert "peer/fast step time" in done.stdout


@pytest.mark.parametrize("flag,value,says", [("--variants", "fast,turbo", "unknown ['turbo']"),
                                             ("--samples", "2,x", "comma list of integers"),
                                             ("--draft-layers", "0", "--draft-layers must be at least 1, got 0")])
def test_bad_arguments_name_the_problem(tmp_path, flag, value, says):
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", flag, value, "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and not (tmp_path / "x.json").exists()


def _run(tmp_path, name: str, nproc: int, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    done = subprocess.run(
        [*launcher, str(SCRIPT), "--tiny", "--variants", "fast", "--steps", "2", "--warmup", "1", *args,
         "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    return result


@pytest.mark.distributed
def test_global_batch_split_over_ranks_trains_the_same(tmp_path):
    """The same global batch of 4 samples, as 1 process x 2 micro-batches of 2, 2 processes x 2 micro-
    batches of 1, and 2 processes with the target FSDP2-sharded: the same losses, step after step."""
    single = _run(tmp_path, "single", 1, "--global-batch", "4", "--samples", "2")
    split = _run(tmp_path, "split", 2, "--global-batch", "4", "--samples", "1")
    sharded = _run(tmp_path, "sharded", 2, "--global-batch", "4", "--samples", "1", "--shard-target")
    assert (single["gpus"], split["gpus"], sharded["target_sharded"]) == (1, 2, True)
    assert split["micro_batches_per_rank"] == 2
    (a,), (b,), (c,) = single["variants"], split["variants"], sharded["variants"]
    for other in (b, c):
        # float32 on the CPU; only the order of the sums over ranks differs
        assert abs(other["first_loss"] - a["first_loss"]) < 1e-5, (a, other)
        assert abs(other["loss"] - a["loss"]) < 1e-4, (a, other)
        assert other["useful_tflop"] == pytest.approx(a["useful_tflop"], rel=1e-9)
    assert a["first_loss"] != a["loss"]  # the optimizer steps changed the draft between them

    import importlib.util

    spec = importlib.util.spec_from_file_location("scaling_table", SCRIPT.parent / "scaling_table.py")
    scaling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaling)
    entries = scaling.rows([tmp_path / f"{n}.json" for n in ("split", "single", "sharded")], "fast")
    assert [(e["gpus"], e["sharded"]) for e in entries] == [(1, False), (2, False), (2, True)]
    lines = scaling.table(entries).splitlines()
    efficiency = b["tokens_per_s_per_gpu"] / a["tokens_per_s_per_gpu"]
    assert lines[2].endswith("100.0%") and lines[3].endswith(f"{efficiency:.1%}")


def test_float32_reference_features_restore_the_bf16_weights():
    """train_step.py's float32 reference for a bf16 target: the features of float32 weights (those of a
    float32 copy of the model), then every parameter back in bf16 with the same values, and the rotary
    frequencies (a float32 buffer) never cast."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from flashdraft.target.frozen import FrozenTarget

    spec = importlib.util.spec_from_file_location("train_step_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    before = {name: p.clone() for name, p in model.named_parameters()}
    rotary = {name: b.dtype for name, b in model.named_buffers()}
    ids = torch.randint(0, 128, (1, 10))
    reference = FrozenTarget(AutoModelForCausalLM.from_config(config, dtype=torch.float32))
    reference.model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    features = module.float32_features(FrozenTarget(model), ids, [0, 2])
    assert features.dtype == torch.float32
    torch.testing.assert_close(features, reference.context_features(ids, [0, 2]), rtol=0, atol=0)
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert {name: b.dtype for name, b in model.named_buffers()} == rotary
