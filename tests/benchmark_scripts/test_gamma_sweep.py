"""The gamma sweep over seed folders: per benchmark and gamma, each seed's tau and their mean; the paper's
rule where a config leaves gamma unset; drafts that differ in more than gamma and the seed are refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gamma_sweep  # noqa: E402
from quality_report_helpers import report  # noqa: E402


def draft(folder: Path, name: str, steps: list[int], gamma: float | None, seed: int, lr: float = 6e-4,
          slot_1: float = 0.3, answers: str | None = None) -> None:
    folder.mkdir(exist_ok=True)
    if answers:  # collect's record of the answers trained on (absent in runs collected before it kept one)
        record = {"answers sha256": {"warmup_prompts_0/train.jsonl": answers}}
        (folder / f"{name}_evidence.json").write_text(json.dumps(record))
    (folder / f"{name}_report.json").write_text(json.dumps(report(steps)))
    work = f"WORK/variant_{name}" if name != "flashdraft" else "WORK"  # a variant's own folder links the answers
    config = {"draft": {"block_size": 16}, "objective": {"gamma": gamma},
              "data": {"train": [f"{work}/warmup_prompts_0/train.jsonl"], "cache_dir": f"{work}/tokenized"},
              "train": {"seed": seed, "lr": lr, "output_dir": f"{work}/train_flashdraft"}}
    (folder / f"{name}_config.yaml").write_text(yaml.safe_dump(config))
    (folder / f"{name}_heldout_tau.json").write_text(json.dumps({"results": {"sharegpt": {"eval_acc_slot_1": slot_1}}}))


def test_taus_by_gamma_over_seeds(tmp_path):
    a, b = tmp_path / "seed0", tmp_path / "seed1"
    draft(a, "flashdraft", [30, 30], None, seed=0, slot_1=0.2)  # gamma 7 by the paper's rule: tau 2.0
    draft(a, "gamma2", [20, 20], 2, seed=0, slot_1=0.4)  # tau 3.0
    draft(b, "flashdraft", [24, 24], None, seed=1, slot_1=0.3)  # tau 2.5
    draft(b, "g2", [15, 15], 2.0, seed=1, slot_1=0.5)  # tau 4.0
    assert gamma_sweep.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    table = json.loads((tmp_path / "out" / "gamma_sweep.json").read_text())
    assert [(row["gamma"], row["seeds"], row["mean"]) for row in table["gsm8k"]] == [
        (2.0, {"seed0": 3.0, "seed1": 4.0}, 3.5), (7.0, {"seed0": 2.0, "seed1": 2.5}, 2.25)]
    assert [row["mean"] for row in table[gamma_sweep.TEACHER]] == pytest.approx([0.45, 0.25])
    text = (tmp_path / "out" / "gamma_sweep.md").read_text()
    assert "| gsm8k | 3.500 (2) | 2.250 (2) |" in text
    assert "not recorded for seed0/flashdraft, seed0/gamma2, seed1/flashdraft, seed1/g2" in text
    assert (tmp_path / "out" / "gamma_sweep.png").stat().st_size > 0


def test_drafts_that_differ_in_more_than_gamma_and_seed_are_refused(tmp_path):
    a = tmp_path / "seed0"
    draft(a, "flashdraft", [30, 30], None, seed=0)
    draft(a, "lr3e-4", [20, 20], None, seed=0, lr=3e-4)
    with pytest.raises(SystemExit, match=r"seed0/lr3e-4 differs from seed0/flashdraft in train\.lr"):
        gamma_sweep.main([str(a), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_two_drafts_of_one_gamma_in_a_seed_folder_are_refused(tmp_path):
    a = tmp_path / "seed0"
    draft(a, "flashdraft", [30, 30], None, seed=0)
    draft(a, "gamma7", [20, 20], 7, seed=0)
    with pytest.raises(SystemExit, match="seed0 holds two drafts of gamma 7"):
        gamma_sweep.main([str(a), "--out", str(tmp_path / "out")])


def test_a_draft_without_its_config_or_teacher_forced_tau_is_refused(tmp_path):
    a = tmp_path / "seed0"
    draft(a, "flashdraft", [30, 30], None, seed=0)
    (a / "flashdraft_heldout_tau.json").unlink()
    with pytest.raises(SystemExit, match=r"has flashdraft_report.json but lacks flashdraft_heldout_tau.json"):
        gamma_sweep.main([str(a), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_folders_without_reports_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="no NAME_report.json"):
        gamma_sweep.main([str(tmp_path), "--out", str(tmp_path / "out")])


def test_drafts_trained_on_other_answers_are_refused(tmp_path):
    """Seed folders of different sessions: where both record their answers, those must be the same."""
    a, b = tmp_path / "seed0", tmp_path / "seed1"
    draft(a, "flashdraft", [30, 30], None, seed=0, answers="aaa")
    draft(a, "gamma2", [20, 20], 2, seed=0, answers="aaa")
    draft(b, "gamma2", [20, 20], 2, seed=1)  # collected before the record: not compared
    assert gamma_sweep.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    assert ("Training answers: the same for both (1 file, sha256 checked); not recorded for seed1/gamma2"
            in (tmp_path / "out" / "gamma_sweep.md").read_text())
    draft(b, "flashdraft", [30, 30], None, seed=1, answers="bbb")
    with pytest.raises(SystemExit, match=r"seed0/flashdraft and seed1/flashdraft trained on other answers "
                                         r"\(warmup_prompts_0/train.jsonl differ\)"):
        gamma_sweep.main([str(a), str(b), "--out", str(tmp_path / "again")])
    assert not (tmp_path / "again").exists()
