"""benchmarks/objective_ablation.py refuses an unknown variant before it builds or trains anything."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import objective_ablation  # noqa: E402


@pytest.mark.parametrize("variants, unknown", [("gamma3", "unknown gamma3"), ("ours,peer,gamma", "unknown gamma;"),
                                               (",", "unknown none given")])
def test_an_unknown_variant_is_refused_before_any_work(tmp_path, variants, unknown):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=unknown) as refusal:
        objective_ablation.main(["--out", str(out), "--variants", variants])
    assert "known: ours, ours_loose_clip, peer, gamma1, gamma2, gamma4, gamma8" in str(refusal.value)
    assert not out.exists()
