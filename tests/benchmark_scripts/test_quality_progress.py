"""The quality runs against the tau goals: each run's pooled taus tabled in order with the goals beside them, and
bad run lists refused before anything is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quality_progress  # noqa: E402
from quality_report_helpers import report  # noqa: E402


def two_benchmarks(folder: Path, gsm8k_steps: list[int], chat_steps: list[int], lossless: float = 1.0) -> str:
    """A report whose gsm8k and chat taus are 60 tokens over the given verify steps, pooled."""
    gsm8k, chat = report(gsm8k_steps)["benchmarks"]["gsm8k"], report(chat_steps)["benchmarks"]["gsm8k"]
    path = folder / f"report_{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps({"benchmarks": {"gsm8k": gsm8k, "chat": {**chat, "lossless": lossless}}}))
    return str(path)


def test_runs_are_tabled_in_order_with_the_goals_met_in_bold(tmp_path):
    early = two_benchmarks(tmp_path, gsm8k_steps=[30, 30], chat_steps=[20, 20], lossless=0.5)  # 2.00, 3.00
    late = two_benchmarks(tmp_path, gsm8k_steps=[15, 15], chat_steps=[12, 12])  # 4.00, 5.00
    assert quality_progress.main(["--out", str(tmp_path / "out"), f"early={early}", f"late={late}"]) == 0
    rows = (tmp_path / "out" / "progress.md").read_text().splitlines()
    assert "| benchmark | goal | early | late |" in rows
    assert "| gsm8k | 3.8 | 2.00 | **4.00** |" in rows
    assert "| chat | 3.4 | 3.00 | **5.00** |" in rows
    assert "| lossless, lowest | 1.00 | 0.50 | 1.00 |" in rows
    assert (tmp_path / "out" / "progress.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_out_that_is_a_file_is_refused_and_kept(tmp_path):
    good = two_benchmarks(tmp_path, gsm8k_steps=[30], chat_steps=[20])
    (tmp_path / "out").write_text("a user's notes")
    with pytest.raises(SystemExit, match="is a file; give a folder"):
        quality_progress.main(["--out", str(tmp_path / "out"), f"a={good}"])
    assert (tmp_path / "out").read_text() == "a user's notes"


@pytest.mark.parametrize(("runs", "message"), [
    (lambda good: [f"a={good}.missing"], "is not an evaluate report"),
    (lambda good: ["no_equals_sign"], "is not LABEL=REPORT"),
    (lambda good: [f"a={good}", f"a={good}"], "the label 'a' is given twice"),
    (lambda good: [f"a={good}", f"b={Path(good).parent / 'gsm8k_only.json'}"], "the reports hold other benchmarks"),
])
def test_a_bad_run_list_is_refused_before_anything_is_written(tmp_path, runs, message):
    good = two_benchmarks(tmp_path, gsm8k_steps=[30], chat_steps=[20])
    (tmp_path / "gsm8k_only.json").write_text(json.dumps(report([30])))
    with pytest.raises(SystemExit) as failed:
        quality_progress.main(["--out", str(tmp_path / "out"), *runs(good)])
    assert message in str(failed.value)
    assert not (tmp_path / "out").exists()
