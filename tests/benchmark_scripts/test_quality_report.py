"""The side-by-side quality report's paired comparison of two drafts' decoding tau."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quality_sharegpt_report  # noqa: E402
from quality_report_helpers import report  # noqa: E402
from quality_sharegpt_report import benchmark_rows, paired_difference  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality_sharegpt.sh"


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


def collected(tmp_path: Path, name: str, answers: str) -> Path:
    """`quality_sharegpt.sh collect` of a WORK folder holding one trained draft and the given answers."""
    work = tmp_path / f"work_{name}"
    for path, text in {"results/flashdraft_report.json": json.dumps(report([20, 20])),
                       "results/flashdraft_heldout_tau.json": "{}", "train_flashdraft/metrics.jsonl": "",
                       "train_flashdraft/config.yaml": "", "train_flashdraft/export/model.safetensors": "weights",
                       "train_flashdraft/summary.json": '{"steps": 3}', "warmup_prompts_0/manifest.json": "{}",
                       "warmup_prompts_0/train.jsonl": answers, "sharegpt_second_turn.jsonl": "{}"}.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    out = tmp_path / f"out_{name}"
    subprocess.run(["bash", str(SCRIPT), "collect", str(work), str(out)], env={**os.environ, "DRAFTS": "flashdraft"},
                   check=True, capture_output=True, timeout=60)
    return out


def checked(folder: Path, variant: str) -> str:
    return quality_sharegpt_report.answers_checked(
        {name: quality_sharegpt_report.answers_record(folder, name) for name in (variant, "flashdraft")})


def test_a_variant_trained_on_other_answers_is_refused(tmp_path):
    """collect records the answers' sha256; the report compares a variant with our draft only where both
    trained on the same answers (a session that regenerated other ones would mix data into the recipe's effect)."""
    base = collected(tmp_path, "base", '{"messages": "an answer"}\n')
    evidence = json.loads((base / "evidence.json").read_text())
    assert evidence["answers sha256"] == {
        "warmup_prompts_0/train.jsonl": hashlib.sha256(b'{"messages": "an answer"}\n').hexdigest(),
        "sharegpt_second_turn.jsonl": hashlib.sha256(b"{}").hexdigest()}
    same = collected(tmp_path, "same", '{"messages": "an answer"}\n')
    shutil.copy(same / "evidence.json", base / "gamma2_evidence.json")
    assert checked(base, "gamma2") == (
        "Training answers: the same for both (2 files, sha256 checked).")
    other = collected(tmp_path, "other", '{"messages": "another answer"}\n')
    shutil.copy(other / "evidence.json", base / "gamma3_evidence.json")
    with pytest.raises(SystemExit, match=r"gamma3 and flashdraft trained on other answers "
                                         r"\(warmup_prompts_0/train.jsonl differ\)"):
        checked(base, "gamma3")
    (base / "gamma4_evidence.json").write_text(json.dumps({"flashdraft": {}}))  # collected before the hashes
    assert "not recorded for gamma4" in checked(base, "gamma4")


def test_a_data_comparison_names_its_other_answers_and_refuses_the_same(tmp_path):
    """--other-answers is for drafts trained on other data on purpose: the line says how many files differ;
    drafts of the same answers are then refused, as the comparison would not be of data."""
    base = collected(tmp_path, "base", '{"messages": "an answer"}\n')
    shutil.copy(collected(tmp_path, "more", '{"messages": "more answers"}\n') / "evidence.json",
                base / "more_evidence.json")
    records = {name: quality_sharegpt_report.answers_record(base, name) for name in ("more", "flashdraft")}
    assert quality_sharegpt_report.answers_checked(records, other_answers=True) == (
        "Training answers: other for more than for flashdraft on purpose, a comparison of training data "
        "(1 of 2 files differ, sha256 checked).")
    shutil.copy(base / "evidence.json", base / "same_evidence.json")
    with pytest.raises(SystemExit, match="--other-answers, but same and flashdraft trained on the same answers"):
        quality_sharegpt_report.answers_checked(
            {name: quality_sharegpt_report.answers_record(base, name) for name in ("same", "flashdraft")},
            other_answers=True)


def evidence_folder(tmp_path: Path, speed: dict[str, tuple[list[int], float]], tag: str = "bfloat16") -> Path:
    """A collect folder of flashdraft and the peer decoded in float32, and at bfloat16 where `speed` says:
    draft -> (verify steps a prompt, speedup), the speed reports tagged `tag`."""
    settings = {"device_name": "a GPU", "dtype": "torch.float32", "max_new_tokens": 60, "block_size": 16,
                "compiled": True, "versions": {"torch": "t", "transformers": "tf"}}
    for name in ("flashdraft", "peer"):
        (tmp_path / f"{name}_report.json").write_text(json.dumps({**report([30, 30]), "settings": settings}))
        (tmp_path / f"{name}_heldout_tau.json").write_text(json.dumps({"results": {"sharegpt_heldout": {
            "eval_tau": 2.0, "eval_acc_slot_1": 0.5, "eval_accuracy": 0.2, "samples": 4}}}))
        (tmp_path / f"{name}_training_curve.jsonl").write_text(
            json.dumps({"step": 10, "accuracy": 0.1}) + "\n" + json.dumps({"step": 10, "eval_accuracy": 0.1}) + "\n")
    for name, (steps, speedup) in speed.items():
        fast = report(steps)
        fast["benchmarks"]["gsm8k"].update(speedup=speedup, lossless=0.5)
        fast["settings"] = {**settings, "dtype": "torch.bfloat16"}
        (tmp_path / f"{name}_report_{tag}.json").write_text(json.dumps(fast))
    return tmp_path


def test_the_speed_phase_reports_show_beside_the_float32_tables(tmp_path):
    """The speed phase's bfloat16 reports get their own table, its numbers from those reports (not the float32
    ones), and say that their equality with plain decoding is not the lossless check."""
    folder = evidence_folder(tmp_path, {"flashdraft": ([20, 20], 1.25), "peer": ([24, 24], 1.05)})
    assert quality_sharegpt_report.main([str(folder)]) == 0
    text = (folder / "quality.md").read_text()
    assert "| gsm8k | 2 | 2.00 / 2.00 | 1.00 / 1.00 | 0.50x / 0.50x |" in text  # float32, as written
    assert "Speed at bfloat16, the dtype a server runs (a GPU" in text and "losslessness is the float32 table's" in text
    assert "| gsm8k | 3.00 / 2.50 | 1.25x / 1.05x | 1.00 / 1.00 | 2.00 / 2.00 | 0.50 / 0.50 |" in text


def test_drafts_decoded_on_other_cards_are_named_as_such(tmp_path):
    """Speedups of two cards are each against their own plain decoding; the report says so where the two
    drafts' reports name other cards, in the float32 note and the speed table alike."""
    folder = evidence_folder(tmp_path, {"flashdraft": ([20, 20], 1.25), "peer": ([24, 24], 1.05)})
    for name in ("peer_report.json", "peer_report_bfloat16.json"):
        data = json.loads((folder / name).read_text())
        data["settings"]["device_name"] = "another GPU"
        (folder / name).write_text(json.dumps(data))
    assert quality_sharegpt_report.main([str(folder)]) == 0
    line = ("flashdraft decoded on a GPU, peer on another GPU: each speedup is against plain decoding on its own "
            "card, and the milliseconds do not compare.")
    assert (folder / "quality.md").read_text().count(line) == 2


def test_a_speed_report_of_one_draft_alone_is_named_not_tabled(tmp_path):
    folder = evidence_folder(tmp_path, {"peer": ([24, 24], 1.05)})
    assert quality_sharegpt_report.main([str(folder)]) == 0
    text = (folder / "quality.md").read_text()
    assert "Speed at bfloat16: only peer was decoded at it (the speed phase, SPEED_DTYPE)." in text
    assert "sequences equal to plain |" not in text


def test_a_shorter_verify_gets_its_own_table_after_the_full_blocks(tmp_path):
    """SPEED_BLOCK's reports (NAME_report_DTYPE_blockN.json) are tabled under their block, after the dtype's
    full-block pass and before shorter ones; a file that only looks like a speed report is not one."""
    folder = evidence_folder(tmp_path, {"flashdraft": ([20, 20], 1.25), "peer": ([24, 24], 1.05)})
    evidence_folder(tmp_path, {"flashdraft": ([30, 30], 1.5), "peer": ([30, 30], 1.5)}, tag="bfloat16_block4")
    evidence_folder(tmp_path, {"flashdraft": ([15, 15], 1.4), "peer": ([20, 20], 1.3)}, tag="bfloat16_block8")
    (folder / "flashdraft_report_bfloat16_block08.json").write_text("not a report")
    assert quality_sharegpt_report.main([str(folder)]) == 0
    text = (folder / "quality.md").read_text()
    headings = [line.split(",")[0:2] for line in text.splitlines() if line.startswith("Speed at")]
    assert headings == [["Speed at bfloat16", " the dtype a server runs (a GPU"],
                        ["Speed at bfloat16", " verifying 8 tokens a step"],
                        ["Speed at bfloat16", " verifying 4 tokens a step"]]
    assert "| gsm8k | 4.00 / 3.00 | 1.40x / 1.30x |" in text


def test_no_speed_report_no_speed_section(tmp_path):
    folder = evidence_folder(tmp_path, {})
    assert quality_sharegpt_report.main([str(folder)]) == 0
    assert "Speed at" not in (folder / "quality.md").read_text()


def test_the_curves_title_names_unequal_steps_instead_of_claiming_the_same():
    title = quality_sharegpt_report.curves_title
    assert "same data and steps" in title("a", "b", True, {"a": 3600, "b": 3600})
    assert "same data, 7200 vs 3600 steps" in title("a", "b", True, {"a": 7200, "b": 3600})
    assert "other training data, 3600 vs 1800 steps" in title("a", "b", False, {"a": 3600, "b": 1800})
    assert "steps" not in title("a", "b", False, {"a": 3600, "b": 3600})
