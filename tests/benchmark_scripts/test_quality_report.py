"""The side-by-side quality report's paired comparison of two drafts' decoding tau."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quality_sharegpt_report  # noqa: E402
from quality_report_helpers import report  # noqa: E402
from quality_sharegpt_report import benchmark_rows, paired_difference  # noqa: E402


def prompts(steps: list[int], tokens: int = 60) -> list[dict]:
    return [{"new_tokens": tokens, "verify_steps": s, "tau": tokens / s} for s in steps]


def test_a_draft_ahead_on_every_prompt_has_an_interval_above_zero():
    ours, peer = prompts([20, 25, 30, 22, 28, 24]), prompts([30, 33, 40, 29, 35, 31])
    d = paired_difference(ours, peer)
    assert d["difference"] == pytest.approx(360 / 149 - 360 / 198)
    assert 0 < d["low"] <= d["difference"] <= d["high"]
    assert (d["ahead"], d["behind"]) == (6, 0)


def test_mixed_results_have_an_interval_across_zero():
    ours, peer = prompts([20, 40, 21, 39, 20, 40]), prompts([40, 20, 39, 21, 40, 20])
    d = paired_difference(ours, peer)
    assert d["low"] < 0 < d["high"]
    assert (d["ahead"], d["behind"]) == (3, 3)


def test_reports_of_different_prompts_are_refused():
    with pytest.raises(SystemExit, match="same prompts"):
        paired_difference(prompts([20, 30]), prompts([20, 30], tokens=61))


def test_against_compares_a_variant_with_another_draft_than_the_peer(tmp_path):
    """A variant of our recipe (here a learning rate) set against flashdraft's own draft, not the peer's."""
    for name, steps in (("flashdraft", [20, 20]), ("peer", [30, 30]), ("lr0.0012", [24, 24])):
        (tmp_path / f"{name}_report.json").write_text(json.dumps(report(steps)))
    (row,) = benchmark_rows(tmp_path, "lr0.0012", against="flashdraft")
    assert row["paired"]["difference"] == pytest.approx(2.5 - 3.0)
    assert (row["lr0.0012"]["tau_pooled"], row["flashdraft"]["tau_pooled"]) == pytest.approx((2.5, 3.0))
    (default,) = benchmark_rows(tmp_path, "lr0.0012")
    assert default["paired"]["difference"] == pytest.approx(2.5 - 2.0)


def test_a_draft_against_itself_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="both name flashdraft"):
        quality_sharegpt_report.main([str(tmp_path), "--against", "flashdraft"])
