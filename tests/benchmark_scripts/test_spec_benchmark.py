"""The GPU benchmark script runs (tiny CPU mode): our loop equals z-lab's and its numbers are written."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("dflash.model", reason="the z-lab reference (pip install --no-deps dflash==0.1.0)")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "spec_decode.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("spec_decode_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # Registered by name: dynamo imports the module of a function it traces (the flex-decode experiment).
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_tiny_benchmark_matches_zlab_and_writes_results(script, tmp_path):
    torch.set_num_threads(1)
    module = script
    out = tmp_path / "bench.json"
    assert module.main(["--tiny", "--prompts", "2", "--max-new-tokens", "20", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["float32"] == {"identical_to_zlab": True, "identical_to_plain": True}
    assert report["first_difference_from_zlab"] == [None, None]
    results = report["results"]
    assert set(results) == {"flashdraft speculative", "flashdraft plain", "z-lab dflash_generate",
                            "z-lab plain (block 1)"}
    for r in results.values():
        assert r["decode_tokens"] == 2 * 19 and r["tokens_per_s"] > 0 and r["tau"] >= 1
    assert report["ours_over_zlab_speculative"] > 0


def test_flex_decode_experiment_decodes_like_eager_without_sdpa_in_compiled_steps(script, monkeypatch):
    """`--flex-decode` (float32, CPU inductor): compiled plain and speculative steps whose target attention
    is one flex-attention call give the eager greedy output, and no compiled step falls back to sdpa (which
    would time the wrong kernel without a word); a prompt's eager prefill still takes sdpa."""
    from flashdraft.decoding.decoding import generate
    from flashdraft.decoding.proposers import DraftProposer
    from flashdraft.decoding.target_runner import TargetRunner
    from flashdraft.target.compiled_layers import CompiledLayers
    from flashdraft.target.frozen import decoder_layers

    torch.set_num_threads(1)
    torch._dynamo.reset()
    eager_calls = []

    def counted_sdpa(*args, **kwargs):
        # A compiled step that took this path would graph-break here and run it eagerly: counted too.
        eager_calls.append(1)
        return sdpa(*args, **kwargs)

    sdpa = script.sdpa_attention_forward
    monkeypatch.setattr(script, "sdpa_attention_forward", counted_sdpa)
    target, draft = script.build("tiny", torch.float32, torch.device("cpu"), 0, "sdpa")
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(0))
    max_len, block = 80, draft.block_size
    plain, spec = TargetRunner(target, [], max_len), TargetRunner(target, draft.target_layer_ids, max_len)
    proposer = DraftProposer(draft, target.get_input_embeddings(), target.get_output_embeddings())
    with torch.inference_mode():
        reference = generate(plain, ids, max_new_tokens=30).tokens
        with script.flex_decode_attention({1, block}, max_len, torch.device("cpu")), \
                CompiledLayers([*decoder_layers(target), *draft.layers], lengths={1, block}):
            eager_calls.clear()
            assert generate(plain, ids, max_new_tokens=30).tokens == reference
            assert generate(spec, ids, proposer=proposer, max_new_tokens=30).tokens == reference
    assert len(eager_calls) == 2 * len(decoder_layers(target))  # the two prefills only
    # transformers' own sdpa function is registered again (a leftover would slow every later compiled test).
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    assert AttentionInterface()["sdpa"] is sdpa_attention_forward
