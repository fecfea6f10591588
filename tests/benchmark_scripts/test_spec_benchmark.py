"""The GPU benchmark script runs (tiny CPU mode): our loop equals z-lab's and its numbers are written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("dflash.model", reason="the z-lab reference (pip install --no-deps dflash==0.1.0)")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "spec_decode.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("spec_decode_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_benchmark_matches_zlab_and_writes_results(script, tmp_path):
    torch.set_num_threads(1)
    module = script
    out = tmp_path / "bench.json"
    assert module.main(["--tiny", "--prompts", "2", "--max-new-tokens", "20", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["complete"] is True
    assert report["float32"] == {"identical_to_zlab": True, "identical_to_plain": True}
    assert report["first_difference_from_zlab"] == [None, None]
    results = report["results"]
    assert set(results) == {"flashdraft speculative", "flashdraft plain", "z-lab dflash_generate",
                            "z-lab plain (block 1)"}
    for r in results.values():
        assert r["decode_tokens"] == 2 * 19 and r["tokens_per_s"] > 0 and r["tau"] >= 1
    assert report["ours_over_zlab_speculative"] > 0


def test_a_run_cut_off_after_a_variant_keeps_what_it_measured(script, tmp_path, monkeypatch):
    """A device call's time limit may end a run between variants: the report is written after each one, so
    what ran is kept, marked incomplete, with no float32 verdict."""
    torch.set_num_threads(1)
    timed, calls = script.time_methods, []

    def cut_off(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the unchanged paths and the fused variant ran; the limit strikes in the next
            raise RuntimeError("time limit")
        return timed(*args, **kwargs)

    monkeypatch.setattr(script, "time_methods", cut_off)
    out = tmp_path / "bench.json"
    with pytest.raises(RuntimeError, match="time limit"):
        script.main(["--tiny", "--no-zlab", "--fused-projections", "--flex-decode", "--prompts", "1",
                     "--max-new-tokens", "8", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["float32"] is None
    assert set(report["results"]) == {"flashdraft speculative", "flashdraft plain", "flashdraft speculative, fused",
                                      "flashdraft plain, fused"}
    assert report["variants_first_difference_from_eager"] == {"speculative, fused": [None], "plain, fused": [None]}
