"""`quality_sharegpt.sh variants`: every variant is checked before any of them trains, and a bad one stops
the phase with a message that names it, leaving WORK and OUT as they were."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality_sharegpt.sh"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A WORK folder as the warmup phase leaves it (the files' contents are not read before the checks)."""
    work = tmp_path / "work"
    (work / "warmup_prompts_0").mkdir(parents=True)
    for name in ("warmup_prompts_0/train.jsonl", "target_path", "sharegpt_second_turn.jsonl"):
        (work / name).write_text("")
    return work


def variants(tmp_path: Path, work: Path, spec: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("TRAIN_ARGS", "STEPS", "MAX_LENGTH")}
    return subprocess.run(["bash", str(SCRIPT), "variants", str(tmp_path / "data"), str(work), str(tmp_path / "out")],
                          env={**base, "VARIANTS": spec, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("spec, message", [
    ("", "VARIANTS is empty"),
    ("lr3e-4 train.lr=3e-4", "is not 'NAME: key=value"),
    ("lr 3e-4: train.lr=3e-4", "is not 'NAME: key=value"),
    ("flashdraft: train.lr=3e-4", "variant name flashdraft is a draft of the comparison itself"),
    ("peer: train.lr=3e-4", "variant name peer is a draft of the comparison itself"),
    ("lr3e-4: train.lr 3e-4", "variant lr3e-4: 'train.lr' is not key=value"),
    ("lr3e-4: train.lr=3e-4; gamma2:  ", "variant gamma2 changes nothing"),
    ("lr3e-4: train.lr=3e-4; lr3e-4: train.lr=2e-4", "variant lr3e-4 is given twice"),
])
def test_a_bad_variant_stops_the_phase_before_any_work(tmp_path, work, spec, message):
    result = variants(tmp_path, work, spec)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not list(work.glob("variant_*")) and not (tmp_path / "out").exists()


def test_a_variant_folder_or_output_already_there_is_kept(tmp_path, work):
    (work / "variant_gamma2").mkdir()
    result = variants(tmp_path, work, "lr3e-4: train.lr=3e-4; gamma2: objective.gamma=2")
    assert result.returncode == 2 and f"{work}/variant_gamma2 exists with other settings (none recorded; " \
        "now objective.gamma=2 STEPS=400 MAX_LENGTH=1024)" in result.stderr
    assert [p.name for p in work.glob("variant_*")] == ["variant_gamma2"]
    assert not list((work / "variant_gamma2").iterdir())
    (work / "variant_gamma2").rmdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "gamma2_report.json").write_text("{}")
    result = variants(tmp_path, work, "lr3e-4: train.lr=3e-4; gamma2: objective.gamma=2")
    assert result.returncode == 2 and "already holds gamma2_* files" in result.stderr
    assert not list(work.glob("variant_*")) and (out / "gamma2_report.json").read_text() == "{}"


def test_work_without_answers_is_refused(tmp_path):
    empty = tmp_path / "work"
    empty.mkdir()
    result = variants(tmp_path, empty, "lr3e-4: train.lr=3e-4")
    assert result.returncode == 2 and "lacks the warmup phase's answers" in result.stderr
    assert not list(empty.iterdir())


def test_variants_over_several_lines_are_read_by_name(tmp_path, work):
    """VARIANTS written over lines, as in RESULTS.md's commands: each variant gets its folder, linked to the
    warmup's answers (the training then fails here on the empty answer files, which is not under test)."""
    (work / "warmup_prompts_0.log").write_text("the warmup's log, not an input")
    result = variants(tmp_path, work, "gamma3: objective.gamma=3;\n  lr3e-4: train.lr=3e-4\n    train.seed=1;\n")
    assert "error: variant" not in result.stderr, result.stderr
    assert sorted(p.name for p in work.glob("variant_*")) == ["variant_gamma3", "variant_lr3e-4"]
    for name in ("gamma3", "lr3e-4"):
        assert (work / f"variant_{name}" / "warmup_prompts_0").resolve() == (work / "warmup_prompts_0").resolve()
        assert not (work / f"variant_{name}" / "warmup_prompts_0.log").exists()


def started_variant(work: Path, name: str, record: str) -> Path:
    """A variant folder as the phase makes it before training: the run's answers linked, its settings kept."""
    folder = work / f"variant_{name}"
    folder.mkdir()
    (folder / "variant_settings").write_text(record + "\n")
    for linked in ("warmup_prompts_0", "target_path", "sharegpt_second_turn.jsonl"):
        (folder / linked).symlink_to(work / linked)
    return folder


def finished_variant(work: Path, name: str, record: str) -> Path:
    """A variant folder as the phase leaves it once the variant trained and was evaluated."""
    folder = started_variant(work, name, record)
    for path, text in {"results/flashdraft_report.json": "{}",
                       "results/flashdraft_heldout_tau.json": "{}", "train_flashdraft/metrics.jsonl": "",
                       "train_flashdraft/config.yaml": "", "train_flashdraft/export/model.safetensors": "weights",
                       "train_flashdraft/summary.json": '{"steps": 300}'}.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def test_a_variant_of_the_same_settings_continues_and_what_it_did_is_not_redone(tmp_path, work):
    """A machine window that ended inside the phase: run again with the same settings, a finished variant is
    only collected (training it again would fail here on the empty answers), an unfinished one trains on."""
    finished_variant(work, "gamma2", "train.seed=1 objective.gamma=2 STEPS=300 MAX_LENGTH=1024")
    result = variants(tmp_path, work, "gamma2: objective.gamma=2", TRAIN_ARGS="train.seed=1", STEPS="300")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "gamma2_report.json").read_text() == "{}"
    assert not (work / "variant_gamma2" / "prepare_data.log").exists()

    unfinished = started_variant(work, "gamma3", "train.seed=1 objective.gamma=3 STEPS=300 MAX_LENGTH=1024")
    result = variants(tmp_path, work, "gamma3: objective.gamma=3", TRAIN_ARGS="train.seed=1", STEPS="300")
    assert "exists with other settings" not in result.stderr
    assert (unfinished / "prepare_data.log").exists()  # it trains on (and fails on the empty answers)
    result = variants(tmp_path, work, "gamma3: objective.gamma=3", TRAIN_ARGS="train.seed=1", STEPS="1200")
    assert result.returncode == 2 and "exists with other settings (train.seed=1 objective.gamma=3 STEPS=300 " \
        "MAX_LENGTH=1024; now train.seed=1 objective.gamma=3 STEPS=1200 MAX_LENGTH=1024)" in result.stderr


def test_evaluate_0_collects_trained_variants_without_decoding_them(tmp_path, work):
    """EVALUATE=0: a trained variant is collected with its curve, config and evidence but no decoding
    (evaluating it would fail here on the empty target path); its evidence says it was not evaluated."""
    folder = finished_variant(work, "gamma4", "train.seed=0 objective.gamma=4 STEPS=300 MAX_LENGTH=1024")
    for evaluation in ("flashdraft_report.json", "flashdraft_heldout_tau.json"):
        (folder / "results" / evaluation).unlink()
    result = variants(tmp_path, work, "gamma4: objective.gamma=4", TRAIN_ARGS="train.seed=0", STEPS="300",
                      EVALUATE="0")
    assert result.returncode == 0, result.stderr
    assert "note: flashdraft has no decoding evaluation" in result.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gamma4_config.yaml", "gamma4_evidence.json",
                                                     "gamma4_training_curve.jsonl"]
    assert json.loads((out / "gamma4_evidence.json").read_text())["flashdraft"] == {
        "model.safetensors sha256": hashlib.sha256(b"weights").hexdigest(), "steps": 300, "evaluated": False}
    assert not (folder / "results" / "flashdraft.log").exists()  # no decoding was started


def test_evaluate_other_than_0_or_1_is_refused(tmp_path, work):
    result = variants(tmp_path, work, "gamma4: objective.gamma=4", EVALUATE="no")
    assert result.returncode == 2 and "EVALUATE=no; give 1" in result.stderr
    assert not list(work.glob("variant_*")) and not (tmp_path / "out").exists()


def test_collect_refuses_an_unfinished_training_and_writes_nothing(tmp_path, work):
    finished_variant(work, "gamma2", "train.seed=0 objective.gamma=2 STEPS=300 MAX_LENGTH=1024")
    (work / "variant_gamma2" / "train_flashdraft" / "summary.json").unlink()
    out = tmp_path / "collected"
    result = subprocess.run(["bash", str(SCRIPT), "collect", str(work / "variant_gamma2"), str(out)],
                            env={**os.environ, "DRAFTS": "flashdraft"}, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "train_flashdraft in" in result.stderr
    assert "did not finish training (no summary.json); run the train phase again" in result.stderr
    assert not out.exists()


def test_a_speed_dtype_other_than_bf16_or_fp16_is_refused(tmp_path, work):
    result = variants(tmp_path, work, "gamma4: objective.gamma=4", SPEED_DTYPE="float64")
    assert result.returncode == 2 and "SPEED_DTYPE=float64; give bfloat16 or float16" in result.stderr
    assert not list(work.glob("variant_*")) and not (tmp_path / "out").exists()


def test_the_speed_phase_runs_where_its_report_is_missing_and_is_collected(tmp_path, work):
    """SPEED_DTYPE: a variant decoded at it is collected with that report and not decoded again; one decoded
    in float32 alone gets the speed phase only (which fails here on the empty target path, not under test)."""
    done = finished_variant(work, "gamma2", "train.seed=0 objective.gamma=2 STEPS=300 MAX_LENGTH=1024")
    (done / "results" / "flashdraft_report_bfloat16.json").write_text('{"speed": 1}')
    result = variants(tmp_path, work, "gamma2: objective.gamma=2", TRAIN_ARGS="train.seed=0", STEPS="300",
                      SPEED_DTYPE="bfloat16")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "gamma2_report_bfloat16.json").read_text() == '{"speed": 1}'
    assert not (done / "results" / "flashdraft_bfloat16.log").exists()
    assert not (done / "results" / "flashdraft.log").exists()

    half = finished_variant(work, "gamma3", "train.seed=0 objective.gamma=3 STEPS=300 MAX_LENGTH=1024")
    variants(tmp_path, work, "gamma3: objective.gamma=3", TRAIN_ARGS="train.seed=0", STEPS="300",
             SPEED_DTYPE="bfloat16")
    assert (half / "results" / "flashdraft_bfloat16.log").exists()  # the speed phase started
    assert not (half / "results" / "flashdraft.log").exists()  # the float32 evaluation was not redone


def test_the_variants_speed_passes_run_one_at_a_time(tmp_path, work):
    """Each alone on the GPU, after the variants' side-by-side work: the first fails here on the empty target
    path, and the second never starts."""
    halves = [finished_variant(work, name, f"train.seed=0 objective.gamma={gamma} STEPS=300 MAX_LENGTH=1024")
              for name, gamma in (("gamma2", 2), ("gamma3", 3))]
    result = variants(tmp_path, work, "gamma2: objective.gamma=2; gamma3: objective.gamma=3",
                      TRAIN_ARGS="train.seed=0", STEPS="300", SPEED_DTYPE="bfloat16")
    assert result.returncode != 0
    assert [(half / "results" / "flashdraft_bfloat16.log").exists() for half in halves] == [True, False]


def test_a_variants_teacher_forced_score_loads_its_draft_with_its_own_settings(tmp_path, work):
    """The evaluate phase, run by the variants phase with TRAIN_ARGS holding the variant's settings, hands
    them to heldout_tau.py before the measure's own keys: an 8-layer variant's export is then loaded as the
    8-layer draft it is (with the recipe's 6 layers the load is refused), while the measure keeps its 64
    anchors. python3 is replaced by a recorder of its arguments: what runs is not under test, only what it
    is given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    recorder = bin_dir / "python3"
    recorder.write_text(f"#!{os.environ.get('SHELL', '/bin/bash')}\n"
                        f"printf '%s\\0' \"$@\" >> {calls}; printf '\\n' >> {calls}\n")
    recorder.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("STEPS", "MAX_LENGTH", "SPEED_DTYPE")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", DRAFTS="flashdraft",
               TRAIN_ARGS="train.seed=0 draft.num_layers=8 objective.num_anchors=128")
    result = subprocess.run(["bash", str(SCRIPT), "evaluate", "flashdraft", str(tmp_path / "data"), str(work)],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    runs = [line.split("\0")[:-1] for line in calls.read_text().splitlines() if line]
    scored = [args for args in runs if args[0].endswith("heldout_tau.py")]
    assert len(scored) == 1, runs
    overrides = scored[0][scored[0].index("--") + 1:]
    assert overrides[:3] == ["train.seed=0", "draft.num_layers=8", "objective.num_anchors=128"]
    assert overrides.index("objective.num_anchors=64") > overrides.index("objective.num_anchors=128")
