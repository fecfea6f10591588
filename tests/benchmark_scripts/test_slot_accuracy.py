"""Per-slot teacher-forced accuracy from heldout_tau.py results: slots in block order (slot 10 after 9), one
curve per evaluation set, and clear refusals of inputs that are not such results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import slot_accuracy  # noqa: E402


def result(path: Path, anchors: str, sets: dict[str, list[float]]) -> Path:
    """A file in heldout_tau.py's shape: per set, eval_tau and eval_acc_slot_1..B-1 (written in key order,
    so slot 10 comes before slot 2 as text)."""
    results = {}
    for name, slots in sets.items():
        row = {"eval_loss": 1.0, "eval_supervised_tokens": 1000.0, "eval_accuracy": sum(slots) / len(slots),
               "eval_tau": 1 + sum(slots), "samples": 4}
        row.update({f"eval_acc_slot_{k}": a for k, a in enumerate(slots, 1)})
        results[name] = dict(sorted(row.items()))
    path.write_text(json.dumps({"draft": "WORK/export", "anchors": anchors, "results": results}))
    return path


def test_slots_in_block_order_one_curve_per_set(tmp_path):
    falling = [round(0.9 - 0.05 * k, 2) for k in range(15)]
    looped = result(tmp_path / "looped.json", "looped", {"heldout": falling})
    both = result(tmp_path / "train.json", "train", {"a": [0.5] * 15, "b": [0.25] * 15})
    curves = slot_accuracy.slot_curves([f"loops={looped}", f"all={both}"])
    assert list(curves) == ["loops", "all/a", "all/b"]
    assert curves["loops"]["slots"] == falling  # numeric order, not the keys' text order
    assert curves["loops"]["anchors"] == "looped"
    out = tmp_path / "slots"
    assert slot_accuracy.main([f"loops={looped}", f"all={both}", "--out", str(out)]) == 0
    table = (tmp_path / "slots.md").read_text().splitlines()
    assert table[2].startswith("| loops | looped | ")
    assert table[2].endswith(" | 0.20 |")  # slot 15: 0.9 - 0.05 * 14
    assert (tmp_path / "slots.png").stat().st_size > 0


@pytest.mark.parametrize("spec, message", [
    ("looped.json", "is not LABEL=FILE"),
    ("x=missing.json", "does not exist"),
    ("x=empty.json", "holds no 'results'"),
    ("x=torn.json", "is not JSON"),
    ("x=summary.json", "set 'heldout' has no eval_tau and per-slot accuracy"),
])
def test_bad_input_is_refused_with_the_fix(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "torn.json").write_text('{"results": {"heldout": {"eval_tau": 2.')
    (tmp_path / "summary.json").write_text('{"results": {"heldout": {"eval_loss": 1.5}}}')
    with pytest.raises(SystemExit, match=message):
        slot_accuracy.main([spec, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out.md").exists()


def test_one_label_twice_is_refused(tmp_path):
    path = result(tmp_path / "a.json", "train", {"heldout": [0.5] * 15})
    with pytest.raises(SystemExit, match="given twice"):
        slot_accuracy.slot_curves([f"x={path}", f"x={path}"])
