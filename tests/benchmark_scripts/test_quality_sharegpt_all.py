"""`quality_sharegpt.sh all`: run again after a machine window ended inside it, it skips the phases whose
outputs WORK holds and goes on with the rest; a rerun with other settings is refused before any work."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality_sharegpt.sh"
# A real collected run: its reports, curves and configs stand in for what the phases leave in WORK.
EVIDENCE = SCRIPT.parent / "results" / "quality_sharegpt"
SETTINGS = ("TEMPERATURE", "TOP_P", "MAX_LENGTH", "STEPS", "TRAIN_ARGS", "EVAL_PROMPTS", "EVAL_NEW_TOKENS",
            "SPEED_DTYPE", "SPEED_BLOCK", "DRAFTS")


def run_env(**env: str) -> dict[str, str]:
    # The script's python3 is this interpreter (flashdraft installed), as in an activated environment.
    base = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    return {**base, **env}


def run_all(tmp_path: Path, work: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "all", str(tmp_path / "model.gguf"), str(tmp_path / "data"),
                           str(work), str(tmp_path / "out")],
                          check=False, env=run_env(**env), capture_output=True, text=True, timeout=300)


def finished_work(tmp_path: Path) -> Path:
    """WORK as the phases leave it once both drafts trained, were evaluated and the anchors phase ran."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "prompts_0.jsonl").write_text('{"messages": []}\n')
    work = tmp_path / "work"
    (work / "warmup_prompts_0").mkdir(parents=True)
    (work / "warmup_prompts_0" / "train.jsonl").write_text('{"answer": "kept"}\n')
    (work / "warmup_prompts_0" / "manifest.json").write_text("{}")
    (work / "sharegpt_second_turn.jsonl").write_text("")
    (work / "target_path").write_text(str(tmp_path / "no-target") + "\n")
    (work / "results").mkdir()
    (work / "results" / "heldout_tau_by_anchors.json").write_text("{}")
    for name in ("flashdraft", "peer"):
        run = work / f"train_{name}"
        (run / "export").mkdir(parents=True)
        shutil.copy(EVIDENCE / f"{name}_training_curve.jsonl", run / "metrics.jsonl")
        shutil.copy(EVIDENCE / f"{name}_config.yaml", run / "config.yaml")
        (run / "export" / "model.safetensors").write_bytes(name.encode())
        (run / "summary.json").write_text('{"steps": 400}')
        for part in ("report", "heldout_tau"):
            shutil.copy(EVIDENCE / f"{name}_{part}.json", work / "results" / f"{name}_{part}.json")
    return work


def logs(work: Path) -> list[str]:
    """The logs of phases that started: the warmup's, prepare-data's, a training's, an evaluation's."""
    return sorted(str(p.relative_to(work)) for p in work.rglob("*.log"))


def test_a_finished_work_is_only_collected_and_reported(tmp_path):
    work = finished_work(tmp_path)
    result = run_all(tmp_path, work)
    assert result.returncode == 0, result.stderr
    assert logs(work) == []  # no phase ran again (each would fail here: the GGUF and target are absent)
    out = tmp_path / "out"
    evidence = json.loads((out / "evidence.json").read_text())
    assert evidence["flashdraft"]["steps"] == evidence["peer"]["steps"] == 400
    assert evidence["answers sha256"]["warmup_prompts_0/train.jsonl"] == \
        hashlib.sha256(b'{"answer": "kept"}\n').hexdigest()
    for name in ("flashdraft", "peer"):
        assert (out / f"{name}_report.json").read_bytes() == (EVIDENCE / f"{name}_report.json").read_bytes()
    assert "| gsm8k |" in (out / "quality.md").read_text()  # the report ran on the collected folder
    assert (work / "all_settings").read_text().startswith("TEMPERATURE=0.2 TOP_P=0.9 MAX_LENGTH=1024 STEPS=400 ")
    assert (work / "all_settings").read_text().endswith(" DATA_SHARDS=prompts_0.jsonl\n")


def test_an_unevaluated_draft_is_evaluated_and_nothing_before_it_runs_again(tmp_path):
    """The window ended after training and one evaluation: the rerun evaluates the other draft only (which
    fails here on the absent target, so the phase stops before collecting)."""
    work = finished_work(tmp_path)
    (work / "results" / "peer_heldout_tau.json").unlink()
    result = run_all(tmp_path, work)
    assert result.returncode != 0
    assert logs(work) == ["results/peer.log"]
    assert not (tmp_path / "out").exists()


def test_a_missing_speed_report_runs_the_speed_phase_only(tmp_path):
    work = finished_work(tmp_path)
    shutil.copy(EVIDENCE / "flashdraft_report.json", work / "results" / "flashdraft_report_bfloat16.json")
    result = run_all(tmp_path, work, SPEED_DTYPE="bfloat16")
    assert result.returncode != 0  # the peer's speed pass fails on the absent target
    assert logs(work) == ["results/peer_bfloat16.log"]


def test_a_shorter_verify_is_a_speed_pass_of_its_own(tmp_path):
    """SPEED_BLOCK: the full-block report does not count for it; its pass asks evaluate for that block and
    writes its own log (the pass fails here on the absent target)."""
    work = finished_work(tmp_path)
    for name in ("flashdraft", "peer"):
        shutil.copy(EVIDENCE / f"{name}_report.json", work / "results" / f"{name}_report_bfloat16.json")
    result = run_all(tmp_path, work, SPEED_DTYPE="bfloat16", SPEED_BLOCK="8")
    assert result.returncode != 0
    assert logs(work) == ["results/flashdraft_bfloat16_block8.log"]
    command = (work / "results" / "flashdraft_bfloat16_block8.log").read_text().splitlines()[0]
    assert " --dtype bfloat16 " in command and " --block-size 8 " in command
    assert f" --output {work}/results/flashdraft_report_bfloat16_block8.json " in command


def test_a_speed_block_that_is_not_a_count_is_refused_before_any_work(tmp_path):
    work = finished_work(tmp_path)
    (work / "results" / "peer_heldout_tau.json").unlink()
    result = run_all(tmp_path, work, SPEED_DTYPE="bfloat16", SPEED_BLOCK="eight")
    assert result.returncode == 2
    assert "error: SPEED_BLOCK=eight; give the tokens a verify checks" in result.stderr
    assert logs(work) == [] and not (tmp_path / "out").exists()


def test_the_speed_passes_run_one_at_a_time_after_the_evaluations(tmp_path):
    """Their step times are the measurement, so each runs alone on the GPU: after the side-by-side float32
    evaluation (which does not start a speed pass of its own), flashdraft's, then the peer's; the first
    fails here on the absent target and the second never starts."""
    work = finished_work(tmp_path)
    (work / "results" / "peer_heldout_tau.json").unlink()
    result = run_all(tmp_path, work, SPEED_DTYPE="bfloat16")
    assert result.returncode != 0
    assert logs(work) == ["results/peer.log"]  # the evaluation failed: no speed pass before it finished
    (work / "results" / "peer.log").unlink()
    shutil.copy(EVIDENCE / "peer_heldout_tau.json", work / "results" / "peer_heldout_tau.json")
    result = run_all(tmp_path, work, SPEED_DTYPE="bfloat16")
    assert result.returncode != 0
    assert logs(work) == ["results/flashdraft_bfloat16.log"]


def test_other_settings_on_the_same_work_are_refused_before_any_work(tmp_path):
    work = finished_work(tmp_path)
    (work / "results" / "peer_heldout_tau.json").unlink()
    recorded = ("TEMPERATURE=0.2 TOP_P=0.9 MAX_LENGTH=1024 STEPS=900 TRAIN_ARGS=train.seed=0 EVAL_PROMPTS=12 "
                "EVAL_NEW_TOKENS=256 DATA_SHARDS=prompts_0.jsonl")
    (work / "all_settings").write_text(recorded + "\n")
    result = run_all(tmp_path, work, STEPS="1800", TRAIN_ARGS="train.seed=0", EVAL_PROMPTS="12")
    assert result.returncode == 2
    assert f"error: {work} holds a run of other settings ({recorded}; now TEMPERATURE=0.2 TOP_P=0.9 " \
        "MAX_LENGTH=1024 STEPS=1800 TRAIN_ARGS=train.seed=0 EVAL_PROMPTS=12 EVAL_NEW_TOKENS=256 " \
        "DATA_SHARDS=prompts_0.jsonl)" in result.stderr
    assert (work / "all_settings").read_text() == recorded + "\n"
    assert logs(work) == [] and not (tmp_path / "out").exists()
    result = run_all(tmp_path, work, STEPS="900", TRAIN_ARGS="train.seed=0", EVAL_PROMPTS="12")
    assert "other settings" not in result.stderr and logs(work) == ["results/peer.log"]  # the same: it goes on

    # DATA grown by --exclude into this WORK: its drafts did not see the new shard's answers.
    (tmp_path / "data" / "prompts_10.jsonl").write_text('{"messages": []}\n')
    (tmp_path / "data" / "prompts_9.jsonl").write_text('{"messages": []}\n')
    result = run_all(tmp_path, work, STEPS="900", TRAIN_ARGS="train.seed=0", EVAL_PROMPTS="12")
    assert result.returncode == 2
    assert "now TEMPERATURE=0.2 TOP_P=0.9 MAX_LENGTH=1024 STEPS=900 TRAIN_ARGS=train.seed=0 EVAL_PROMPTS=12 " \
        "EVAL_NEW_TOKENS=256 DATA_SHARDS=prompts_0.jsonl,prompts_9.jsonl,prompts_10.jsonl)" in result.stderr


def test_a_data_without_answers_runs_the_warmup_first(tmp_path):
    """A new DATA of quality_sharegpt_prepare.py --exclude: its prompt files have no answers in WORK yet, so the
    warmup phase runs (and fails here on the absent GGUF) before any training or evaluation."""
    work = finished_work(tmp_path)
    (tmp_path / "data2").mkdir()
    (tmp_path / "data2" / "prompts_1.jsonl").write_text('{"messages": []}\n')
    result = subprocess.run(["bash", str(SCRIPT), "all", str(tmp_path / "model.gguf"), str(tmp_path / "data2"),
                             str(work), str(tmp_path / "out")], env=run_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0
    assert "warmup_prompts_1.log" in logs(work)
    assert not [log for log in logs(work) if log.startswith(("train", "results", "prepare"))]
    assert not (tmp_path / "out").exists()


def test_a_data_grown_in_place_is_refused_before_its_answered_files_are_answered_again(tmp_path):
    """A prompt file added to a DATA whose files WORK already answers: one warmup of the grown DATA would answer
    the old files a second time and train on them twice, so the warmup refuses, naming the folder and the fix."""
    work = finished_work(tmp_path)
    (tmp_path / "data" / "prompts_1.jsonl").write_text('{"messages": []}\n')
    result = run_all(tmp_path, work)
    assert result.returncode == 2
    assert f"error: {work}/warmup_prompts_0 already answers some of {tmp_path / 'data'}'s prompt files (0 to 1): " \
        "draw new prompts with quality_sharegpt_prepare.py --exclude into a new DATA" in result.stderr
    assert logs(work) == [] and not (tmp_path / "out").exists()
