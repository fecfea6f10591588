"""The vLLM backend on a GPU (skipped elsewhere): a SmolLM2 warmup runs, resumes and agrees with transformers."""

from __future__ import annotations

import json

from markers import VLLM_ON_GPU

from flashdraft.config import TargetConfig, WarmupConfig
from flashdraft.data.sources import load_chat_dataset
from flashdraft.data.warmup import run_warmup

pytestmark = VLLM_ON_GPU


def test_vllm_backend_matches_transformers_greedy(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    questions = ["What is the capital of France?", "Name three primary colors.", "What is 12 + 30?"]
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in questions))
    target = TargetConfig(name_or_path="packaged:smollm2", cache_dir=str(tmp_path / "cache"))
    common = dict(prompts=[str(prompts)], max_new_tokens=32, temperature=0.0)
    vllm = run_warmup(target, WarmupConfig(output_dir=str(tmp_path / "vllm"), backend="vllm", **common))
    hf = run_warmup(target, WarmupConfig(output_dir=str(tmp_path / "hf"), backend="static", **common))
    assert vllm.stats["run"]["backend"] == "vllm" and vllm.stats["samples"] == 3
    rows = [json.loads(line) for line in vllm.dataset.read_text().splitlines()]
    for row in rows:
        assert row["completion_tokens"] <= 32
        assert (row["finish_reason"] == "length") == (row["completion_tokens"] == 32)
    assert len(load_chat_dataset(str(vllm.dataset))) == 3
    # bf16 kernels differ, so compare the first words of each greedy answer, not every token
    for a, b in zip(rows, (json.loads(line) for line in hf.dataset.read_text().splitlines())):
        assert a["messages"][-1]["content"].split()[:3] == b["messages"][-1]["content"].split()[:3]
