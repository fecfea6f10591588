"""The regeneration-layout benchmarks run (CPU smoke runs): the A/B answers every prompt once in each arm and
reports the ratio of its own numbers; the step profile times each row count and splits a step by kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import warmup_step_profile  # noqa: E402

from flashdraft.target.batch_decoder import kv_cache_bytes  # noqa: E402
from train_helpers import cpu_env  # noqa: E402


def test_the_layout_ab_answers_every_prompt_once_in_each_arm(tiny_target, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for shard in (3, 4):
        rows = ({"messages": [{"role": "user", "content": f"question {shard} {i}"}]} for i in range(3))
        (data / f"prompts_{shard}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = cpu_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", MAX_NEW_TOKENS="4",
                  OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(BENCHMARKS / "warmup_processes_ab.sh"), str(tiny_target("qwen3")), str(data),
                           str(tmp_path / "out"), "2"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "warmup_processes_ab.json").read_text())
    per_file, one = report["arms"]["per_file"], report["arms"]["one_process"]
    assert per_file["answers"] == one["answers"] == 4  # the first 2 prompts of each file
    assert per_file["layout"].startswith("2 processes")
    assert report["one_process_over_per_file"] == round(one["answer_tokens_per_s"] / per_file["answer_tokens_per_s"], 2)

    again = subprocess.run(["bash", str(BENCHMARKS / "warmup_processes_ab.sh"), str(tiny_target("qwen3")), str(data),
                            str(tmp_path / "out"), "2"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2  # its warmups would find their outputs and time nothing
    assert f"error: {tmp_path / 'out'} holds an earlier A/B's warmups; give a new OUT" in again.stderr
    assert json.loads((tmp_path / "out" / "warmup_processes_ab.json").read_text()) == report


def test_the_step_profile_times_each_row_count_and_splits_a_step_by_kernel(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "profile.json"
    assert warmup_step_profile.main(["--tiny", "--rows", "2", "5", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["decode_step_by_rows"]) == {"2", "5"}
    assert all(ms > 0 for run in report["decode_step_by_rows"].values() for ms in run.values())
    shape = warmup_step_profile.LlamaConfig(**warmup_step_profile.SHAPES["tiny"])
    assert report["pieces_at_rows"]["kv_ring_gb"] == round(kv_cache_bytes(shape, 5 * 96, torch.float32) / 1e9, 2)
    kernels = report["eager_step_kernels"]["top"]
    assert kernels and sum(k["share"] for k in kernels) <= 1.001
