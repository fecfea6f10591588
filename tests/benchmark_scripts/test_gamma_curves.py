"""Held-out teacher-forced tau by step and gamma from training curves: means over seed folders, the count of
draft pairs it orders as decoding does, and clear refusals of curves that cannot be compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gamma_curves  # noqa: E402
from quality_report_helpers import report  # noqa: E402


def draft(folder: Path, name: str, gamma: float | None, seed: int, taus: list[float], decoded: list[int] | None = None,
          steps: tuple[int, ...] = (100, 200), lr: float = 6e-4) -> None:
    """A draft of the variants phase: its curve (a training row, then a held-out row at each of `steps`),
    config and, where `decoded` gives its verify steps per prompt, its decoding report."""
    folder.mkdir(exist_ok=True)
    rows = []
    for step, tau in zip(steps, taus):
        rows.append({"step": step, "loss": 3.0, "tau": tau + 1})  # a training row: not the held-out measure
        rows.append({"step": step, "eval_loss": 3.5, "eval_tau": tau, "eval_acc_slot_1": (tau - 1) / 2})
    (folder / f"{name}_training_curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"draft": {"block_size": 16}, "objective": {"gamma": gamma},
              "data": {"train": [f"WORK/variant_{name}/warmup_prompts_0/train.jsonl"]},
              "train": {"seed": seed, "lr": lr, "output_dir": f"WORK/variant_{name}/train_flashdraft"}}
    (folder / f"{name}_config.yaml").write_text(yaml.safe_dump(config))
    if decoded:
        (folder / f"{name}_report.json").write_text(json.dumps(report(decoded)))


def test_taus_by_step_and_gamma_and_their_agreement_with_decoding(tmp_path):
    a, b = tmp_path / "seed0", tmp_path / "seed1"
    draft(a, "flashdraft", None, 0, [1.1, 1.3], decoded=[30, 30])  # gamma 7 (paper's rule); decoding tau 2.0
    draft(a, "gamma2", 2, 0, [1.2, 1.6], decoded=[20, 20])  # tau 3.0: ordered as eval_tau orders it
    draft(a, "gamma4", 4, 0, [1.15, 1.5], decoded=[15, 15])  # tau 4.0: above gamma 2, against eval_tau
    draft(b, "gamma2", 2, 1, [1.3, 1.8])  # no decoding report: in the means, not in the agreement
    draft(b, "gamma7", 7, 1, [1.0, 1.5])
    assert gamma_curves.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    table = json.loads((tmp_path / "out" / "gamma_curves.json").read_text())
    last = table["eval_tau"][-1]
    assert last["step"] == 200
    assert [(g["gamma"], g["seeds"]) for g in last["gammas"]] == [
        (2.0, {"seed0": 1.6, "seed1": 1.8}), (4.0, {"seed0": 1.5}), (7.0, {"seed0": 1.3, "seed1": 1.5})]
    assert [g["mean"] for g in last["gammas"]] == pytest.approx([1.7, 1.5, 1.4])
    assert [g["mean"] for g in table["eval_acc_slot_1"][0]["gammas"]] == pytest.approx([0.125, 0.075, 0.025])
    # seed0's three pairs: gamma 2 / 7 and gamma 4 / 7 agree, gamma 2 / 4 does not; seed1 was not decoded.
    assert table["order_agreement"] == {"gsm8k": {"concordant": 2, "pairs": 3}}
    text = (tmp_path / "out" / "gamma_curves.md").read_text()
    assert "| 200 | 1.700 (2) | 1.500 (1) | 1.400 (2) |" in text
    assert "| gsm8k | 2 / 3 |" in text
    assert (tmp_path / "out" / "gamma_curves.png").stat().st_size > 0


def test_drafts_evaluated_at_other_steps_are_refused(tmp_path):
    a = tmp_path / "seed0"
    draft(a, "gamma2", 2, 0, [1.2, 1.6])
    draft(a, "gamma7", 7, 0, [1.1, 1.3, 1.4], steps=(100, 200, 300))
    with pytest.raises(SystemExit, match=r"seed0/gamma7 evaluated at steps \[100, 200, 300\], seed0/gamma2 at "
                                         r"\[100, 200\]; compare drafts evaluated at the same steps"):
        gamma_curves.main([str(a), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_drafts_that_differ_in_more_than_gamma_and_seed_are_refused(tmp_path):
    a = tmp_path / "seed0"
    draft(a, "gamma2", 2, 0, [1.2, 1.6])
    draft(a, "gamma7", 7, 0, [1.1, 1.3], lr=3e-4)
    with pytest.raises(SystemExit, match=r"seed0/gamma7 differs from seed0/gamma2 in train\.lr"):
        gamma_curves.main([str(a), "--out", str(tmp_path / "out")])


def test_a_curve_without_held_out_rows_or_config_is_refused(tmp_path):
    a = tmp_path / "seed0"
    draft(a, "gamma2", 2, 0, [1.2, 1.6])
    curve = a / "gamma2_training_curve.jsonl"
    curve.write_text("".join(line + "\n" for line in curve.read_text().splitlines() if "eval_tau" not in line))
    with pytest.raises(SystemExit, match=r"gamma2_training_curve.jsonl has no held-out evaluation.*train.eval_every"):
        gamma_curves.main([str(a), "--out", str(tmp_path / "out")])
    draft(a, "gamma2", 2, 0, [1.2, 1.6])
    (a / "gamma2_config.yaml").unlink()
    with pytest.raises(SystemExit, match="has gamma2_training_curve.jsonl but lacks gamma2_config.yaml"):
        gamma_curves.main([str(a), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="no NAME_training_curve.jsonl"):
        gamma_curves.main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
