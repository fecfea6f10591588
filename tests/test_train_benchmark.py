"""benchmarks/train_step.py runs end to end on tiny CPU shapes with only torch + transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_step.py"

# Run the script with `datasets` and `mlflow` made unimportable: the GPU box may not have them.
WITHOUT_EXTRAS = (
    "import runpy, sys; sys.modules['datasets'] = None; sys.modules['mlflow'] = None; "
    "sys.argv = [sys.argv[1]] + sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_tiny_benchmark(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, str(SCRIPT), "--tiny", "--samples", "2", "--steps", "1", "--warmup", "1",
         "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    (result,) = report["results"]
    assert [v["variant"] for v in result["variants"]] == ["fast", "naive"]
    fast, naive = result["variants"]
    assert fast["lm_head_chunk"] > 0 and naive["lm_head_chunk"] == 0
    for v in (fast, naive):
        assert v["step_time_s"] > 0 and v["useful_tflop"] > 0 and 0 < v["mfu"]
    # Same weights, batch and anchors: the two variants compute the same loss.
    assert abs(fast["loss"] - naive["loss"]) < 1e-4
    assert result["target_forward_s"] > 0 and report["machine"]["torch"]
    assert fast["s_per_sample"] == fast["step_time_s"] / 2 and not result["target_fast_path"]["hybrid"]
    assert "naive/fast step time" in done.stdout and "MFU" in done.stdout
