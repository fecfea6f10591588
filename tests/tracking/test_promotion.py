"""The pure promotion decision: lossless required, the primary tau must beat the champion by a margin."""

from __future__ import annotations

import pytest

from flashdraft.config import PromoteConfig
from flashdraft.errors import UserError
from flashdraft.tracking.registry import CHALLENGER, CHAMPION, Scores, should_promote

POLICY = PromoteConfig(primary_benchmark="gsm8k", min_tau_gain=0.05, min_lossless=1.0)


def report(tau: float, lossless: float = 1.0, chat_tau: float = 2.0) -> dict[str, Scores]:
    return {
        "gsm8k": Scores(tau=tau, lossless=lossless, speedup=tau * 0.8),
        "chat": Scores(tau=chat_tau, lossless=1.0, speedup=1.5),
    }


def test_first_model_is_promoted():
    decision = should_promote(report(2.0), None, POLICY)
    assert decision.promote and decision.alias == CHAMPION
    assert "no champion" in decision.reason


def test_better_by_more_than_the_margin_is_promoted():
    decision = should_promote(report(3.2), report(3.0), POLICY)
    assert decision.promote and decision.alias == CHAMPION
    assert "+0.200" in decision.reason


def test_worse_stays_challenger():
    decision = should_promote(report(2.5), report(3.0), POLICY)
    assert not decision.promote and decision.alias == CHALLENGER


@pytest.mark.parametrize("tau", [3.0, 3.04, 3.05])
def test_equal_within_the_margin_stays_challenger(tau):
    decision = should_promote(report(tau), report(3.0), POLICY)
    assert not decision.promote and decision.alias == CHALLENGER
    assert "<= margin" in decision.reason


def test_not_lossless_is_never_promoted_even_without_champion():
    candidate = report(9.0, lossless=0.97)
    for champion in (None, report(1.0)):
        decision = should_promote(candidate, champion, POLICY)
        assert not decision.promote
        assert "not lossless" in decision.reason and "gsm8k 0.970" in decision.reason


def test_a_lossy_secondary_benchmark_also_blocks():
    candidate = {"gsm8k": Scores(tau=5.0, lossless=1.0), "chat": Scores(tau=5.0, lossless=0.5)}
    assert not should_promote(candidate, None, POLICY).promote


def test_unmeasured_losslessness_blocks():
    candidate = {"gsm8k": Scores(tau=5.0, lossless=None)}
    decision = should_promote(candidate, None, POLICY)
    assert not decision.promote and "not measured" in decision.reason


def test_relaxed_lossless_threshold_for_low_precision():
    relaxed = PromoteConfig(primary_benchmark="gsm8k", min_tau_gain=0.05, min_lossless=0.95)
    assert should_promote(report(3.5, lossless=0.97), report(3.0), relaxed).promote


def test_champion_without_the_primary_benchmark_is_not_replaced_blindly():
    champion = {"chat": Scores(tau=2.0, lossless=1.0)}
    decision = should_promote(report(3.0), champion, POLICY)
    assert not decision.promote and "no 'gsm8k' result" in decision.reason


def test_candidate_without_the_primary_benchmark_is_a_user_error():
    with pytest.raises(UserError, match="no 'humaneval' benchmark.*gsm8k"):
        should_promote(report(3.0), None, PromoteConfig(primary_benchmark="humaneval"))


def test_decision_is_pure():
    candidate, champion = report(3.2), report(3.0)
    first = should_promote(candidate, champion, POLICY)
    assert should_promote(candidate, champion, POLICY) == first
    assert candidate == report(3.2) and champion == report(3.0)
