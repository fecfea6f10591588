"""The quality comparison over training seeds: per benchmark the runs' paired differences, their mean and
spread, and refusals of runs that differ in more than the seed or decoded other prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quality_seeds_report  # noqa: E402
from quality_report_helpers import report  # noqa: E402

CONFIG = {"train": {"seed": 0, "lr": 6e-4, "output_dir": "WORK/train"}, "objective": {"num_anchors": 64}}


def run(folder: Path, ours: list[int], peer: list[int], seed: int, tokens: int = 60, lr: float = 6e-4,
        distill: list[int] | None = None, checkpoint_every: int = 100000) -> Path:
    folder.mkdir()
    for name, steps in (("flashdraft", ours), ("peer", peer), *([("distill", distill)] if distill else [])):
        (folder / f"{name}_report.json").write_text(json.dumps(report(steps, tokens)))
        config = {**CONFIG, "train": {**CONFIG["train"], "seed": seed, "lr": lr, "output_dir": f"WORK/{name}",
                                      "checkpoint_every": checkpoint_every}}
        (folder / f"{name}_config.yaml").write_text(yaml.safe_dump(config))
    return folder


def test_the_mean_difference_and_spread_over_seeds(tmp_path):
    a = run(tmp_path / "a", ours=[20, 20], peer=[30, 30], seed=0)  # ours ahead: 3.0 vs 2.0
    b = run(tmp_path / "b", ours=[30, 30], peer=[24, 24], seed=1)  # ours behind: 2.0 vs 2.5
    assert quality_seeds_report.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    (row,) = json.loads((tmp_path / "out" / "seeds.json").read_text())["benchmarks"]
    assert [r["difference"] for r in row["runs"]] == pytest.approx([1.0, -0.5])
    assert row["mean_difference"] == pytest.approx(0.25)
    assert row["sd_across_runs"] == pytest.approx(1.5 / 2 ** 0.5)
    assert row["runs_ahead"] == 1
    table = (tmp_path / "out" / "seeds.md").read_text()
    assert "| gsm8k | 3.00 / 2.00, +1.000 | 2.00 / 2.50, -0.500 | +0.250 |" in table


def test_ours_picks_an_experiments_draft_of_the_same_folders(tmp_path):
    """A run folder with a third draft (an experiment's, e.g. distill): --ours sets that one against the
    peer; the default still compares flashdraft's."""
    a = run(tmp_path / "a", ours=[20, 20], peer=[30, 30], seed=0, distill=[15, 15])  # distill 4.0 vs 2.0
    b = run(tmp_path / "b", ours=[30, 30], peer=[24, 24], seed=1, distill=[20, 20])  # distill 3.0 vs 2.5
    assert quality_seeds_report.main([str(a), str(b), "--out", str(tmp_path / "out"), "--ours", "distill"]) == 0
    result = json.loads((tmp_path / "out" / "seeds.json").read_text())
    (row,) = result["benchmarks"]
    assert result["ours"] == "distill" and row["runs_ahead"] == 2
    assert [r["difference"] for r in row["runs"]] == pytest.approx([2.0, 0.5])
    table = (tmp_path / "out" / "seeds.md").read_text()
    assert "| gsm8k | 4.00 / 2.00, +2.000 | 3.00 / 2.50, +0.500 | +1.250 |" in table
    assert quality_seeds_report.main([str(a), str(b), "--out", str(tmp_path / "default")]) == 0
    (row,) = json.loads((tmp_path / "default" / "seeds.json").read_text())["benchmarks"]
    assert [r["difference"] for r in row["runs"]] == pytest.approx([1.0, -0.5])
    with pytest.raises(SystemExit, match="both name peer"):
        quality_seeds_report.main([str(a), str(b), "--out", str(tmp_path / "peer"), "--ours", "peer"])


def test_against_sets_a_recipe_variant_against_our_own_draft_over_seeds(tmp_path):
    """The variants phase's drafts (here `distill` standing in for a variant) against flashdraft's draft of
    the same seed, not the peer's."""
    a = run(tmp_path / "a", ours=[20, 20], peer=[30, 30], seed=0, distill=[15, 15])  # 4.0 vs ours 3.0
    b = run(tmp_path / "b", ours=[30, 30], peer=[24, 24], seed=1, distill=[24, 24])  # 2.5 vs ours 2.0
    out = tmp_path / "out"
    assert quality_seeds_report.main([str(a), str(b), "--out", str(out), "--ours", "distill",
                                      "--against", "flashdraft"]) == 0
    result = json.loads((out / "seeds.json").read_text())
    (row,) = result["benchmarks"]
    assert (result["ours"], result["against"]) == ("distill", "flashdraft")
    assert [r["difference"] for r in row["runs"]] == pytest.approx([1.0, 0.5])
    assert row["mean_difference"] == pytest.approx(0.75) and row["runs_ahead"] == 2
    table = (out / "seeds.md").read_text()
    assert "a: distill / flashdraft, difference" in table
    assert "| gsm8k | 4.00 / 3.00, +1.000 | 2.50 / 2.00, +0.500 | +0.750 |" in table
    with pytest.raises(SystemExit, match="both name flashdraft"):
        quality_seeds_report.main([str(a), str(b), "--out", str(out), "--against", "flashdraft"])


def test_runs_that_differ_in_more_than_the_seed_are_refused(tmp_path):
    a = run(tmp_path / "a", [20, 20], [30, 30], seed=0)
    b = run(tmp_path / "b", [20, 20], [30, 30], seed=1, lr=1e-3)
    with pytest.raises(SystemExit, match=r"differ in train\.lr, not in the seed alone"):
        quality_seeds_report.main([str(a), str(b), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_settings_that_do_not_shape_the_run_are_not_differences(tmp_path):
    """Checkpoint cadence (the trainer's resumable changes) differs between sessions; it changes no weights."""
    a = run(tmp_path / "a", [20, 20], [30, 30], seed=0)
    b = run(tmp_path / "b", [30, 30], [24, 24], seed=1, checkpoint_every=100)
    assert quality_seeds_report.differing_settings([a, b]) == []


def test_runs_that_decoded_other_prompts_are_refused(tmp_path):
    a = run(tmp_path / "a", [20, 20], [30, 30], seed=0)
    b = run(tmp_path / "b", [20, 20], [30, 30], seed=1, tokens=61)
    with pytest.raises(SystemExit, match="decoded other prompts"):
        quality_seeds_report.main([str(a), str(b), "--out", str(tmp_path / "out")])


def test_one_run_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="at least two"):
        quality_seeds_report.main([str(run(tmp_path / "a", [20], [30], seed=0)), "--out", str(tmp_path / "o")])
