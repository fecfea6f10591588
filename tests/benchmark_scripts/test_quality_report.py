"""The side-by-side quality report's paired comparison of two drafts' decoding tau."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from quality_sharegpt_report import paired_difference  # noqa: E402


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
