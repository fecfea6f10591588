"""The --vllm measurement on a GPU (skipped elsewhere): vLLM loads our draft unchanged and reports its tau."""

from __future__ import annotations

import json

from flashdraft.cli import main
from flashdraft.target.cache import materialise

from markers import VLLM_ON_GPU

pytestmark = VLLM_ON_GPU


def test_vllm_runs_our_draft_and_reports_acceptance(tmp_path):
    target = materialise("packaged:smollm2", cache_dir=tmp_path / "cache").path
    draft = tmp_path / "draft"
    assert main(["draft-init", "--target", str(target), "--output", str(draft), "--num-layers", "1"]) == 0
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in ("Count to ten.", "Name a color.")))
    report_path = tmp_path / "report.json"
    assert main(["evaluate", "--draft", str(draft), "--target", str(target), "--bench", str(prompts),
                 "--max-new-tokens", "32", "--vllm", "--output", str(report_path)]) == 0
    (bench,) = json.loads(report_path.read_text())["benchmarks"].values()
    measured = bench["vllm"]
    # an untrained draft: vLLM's tau counts the bonus token like ours, so it is >= 1 and near it
    assert 1.0 <= measured["speculative"]["tau_pooled"] < 2.0
    assert measured["speculative"]["verify_steps"] > 0
    assert measured["speedup"] is not None and measured["same_as_plain"] is not None
