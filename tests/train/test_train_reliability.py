"""Resume never runs bytes from a checkpoint, survives torn files, refuses changed settings, and ends with
the uninterrupted run's weights, log and summary (tiny qwen3 target, CPU, one process)."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from flashdraft import cli
from train_helpers import (alphabet_chats, as_in_a_cpu_subprocess, read_metrics, run_cli, run_cli_here,
                           tiny_train_args)

SETTINGS = {"train.max_steps": 6, "train.checkpoint_every": 2, "train.keep_checkpoints": 3,
            "train.micro_batch_size": 2, "train.grad_accum_steps": 2, "data.eval_samples": 4, "train.eval_every": 3}
DETERMINISTIC = ("loss", "tau", "accuracy", "grad_norm", "lr", "eval_loss", "eval_tau")


class Planted:
    """Unpickling this writes a file: if the file exists after a resume, the trainer ran planted bytes."""

    def __init__(self, witness: str):
        self.witness = witness

    def __reduce__(self):
        return (open, (self.witness, "w"))


@pytest.fixture(scope="module")
def run(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    target, data = tiny_target("qwen3"), alphabet_chats(root / "chats.jsonl", rows=28)

    def train(out, crash_after: int | None = None, **extra):
        env = {"FLASHDRAFT_CRASH_AFTER_STEP": str(crash_after)} if crash_after else {}
        return run_cli(["train", *tiny_train_args(target, data, out, **{**SETTINGS, **extra})], env=env, cpu=True)

    whole = root / "whole"
    with as_in_a_cpu_subprocess():  # the uninterrupted run has no crash to inject: no process of its own
        assert cli.main(["train", *tiny_train_args(target, data, whole, **SETTINGS)]) == 0
    return train, whole, root


@pytest.fixture(scope="module")
def killed_after_5(run):
    """A run killed after step 5: checkpoints step-2 and step-4, and the log one step past the newest.
    Tests damage a copy of it."""
    train, _, root = run
    out = root / "killed-after-5"
    assert train(out, crash_after=5).returncode == 17
    return out


@pytest.fixture
def train_here(run, tiny_target, capfd, caplog):
    """The runs with no crash to inject, in this process."""
    _, _, root = run

    def train(out, **extra) -> subprocess.CompletedProcess:
        args = tiny_train_args(tiny_target("qwen3"), root / "chats.jsonl", out, **{**SETTINGS, **extra})
        return run_cli_here(["train", *args], capfd, caplog)

    return train


def same_run(whole, other) -> None:
    a, b = load_file(whole / "export" / "model.safetensors"), load_file(other / "export" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = read_metrics(whole), read_metrics(other)
    assert [m["step"] for m in ma] == [m["step"] for m in mb]  # no line lost, none twice
    for x, y in zip(ma, mb):
        assert {k: x[k] for k in DETERMINISTIC if k in x} == {k: y[k] for k in DETERMINISTIC if k in y}


@pytest.mark.slow
def test_planted_pickles_never_run_and_the_resume_is_exact(run, killed_after_5, train_here, tmp_path):
    train, whole, _ = run
    out = shutil.copytree(killed_after_5, tmp_path / "out")
    step = out / "checkpoints" / "step-4"
    witness = tmp_path / "ran-planted-code"
    for name in (".metadata", "rng-rank0.pt", "__0_0.distcp.planted"):  # what DCP and torch.load would read
        (step / name).write_bytes(pickle.dumps(Planted(str(witness))))
    assert not list(step.glob("*.pt")) or (step / "rng-rank0.pt").exists()
    resumed = train_here(out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and str(step) in resumed.stderr
    assert not witness.exists()
    same_run(whole, out)


@pytest.mark.slow
@pytest.mark.parametrize("tear", ["shard", "trainer_state", "metadata"])
def test_a_torn_newest_checkpoint_falls_back_to_an_intact_one(run, killed_after_5, train_here, tmp_path, tear):
    train, whole, _ = run
    out = shutil.copytree(killed_after_5, tmp_path / "out")
    newest = out / "checkpoints" / "step-4"
    if tear == "shard":
        (shard,) = newest.glob("*.distcp")
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif tear == "trainer_state":
        (newest / "trainer.json").write_text('{"step": 4, "sched')
    else:
        (newest / "metadata.json").write_text("[1, 2")
    with open(out / "metrics.jsonl", "a") as log:  # and a kill in the middle of a metrics line
        log.write('{"step": 5, "loss": 1.2')
    resumed = train_here(out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"checkpoint {newest} cannot be loaded" in resumed.stderr
    assert "resumed from" in resumed.stderr and str(out / "checkpoints" / "step-2") in resumed.stderr
    same_run(whole, out)


@pytest.mark.slow
def test_changed_settings_are_refused_unless_forced_and_more_steps_are_fine(run, train_here, tmp_path):
    train, _, root = run
    out = tmp_path / "out"
    assert train(out, crash_after=2).returncode == 17
    refused = train_here(out, **{"train.lr": 0.5, "train.seed": 3})
    assert refused.returncode == 2
    assert "train.lr 0.0006 -> 0.5" in refused.stderr and "train.seed 0 -> 3" in refused.stderr
    assert "train.resume=force" in refused.stderr and "Traceback" not in refused.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]  # untouched
    other_data = alphabet_chats(root / "other.jsonl", rows=28, seed=5)
    refused = train_here(out, **{"data.train": str(other_data)})
    assert refused.returncode == 2 and "data.train" in refused.stderr
    forced = train_here(out, **{"train.lr": 0.5, "train.resume": "force"})
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "resuming with changed settings: train.lr 0.0006 -> 0.5" in forced.stderr
    # The forced run recorded lr 0.5; more steps and epochs need no force.
    longer = train_here(out, **{"train.lr": 0.5, "train.max_steps": 8, "train.epochs": 2})
    assert longer.returncode == 0 and json.loads((out / "summary.json").read_text())["steps"] == 8


@pytest.mark.slow
def test_a_kill_during_the_export_leaves_nothing_behind_and_the_summary_covers_the_whole_run(
    run, train_here, tmp_path
):
    train, whole, _ = run
    out = tmp_path / "out"
    # Killed right after the last checkpoint, before the final evaluation and the export...
    assert train(out, crash_after=6).returncode == 17
    # ... and, as a kill during the export leaves it, a temp folder of the export and a logged final eval.
    (out / ".export.abc123.tmp").mkdir()
    (out / ".export.abc123.tmp" / "model.safetensors").write_bytes(b"half")
    with open(out / "metrics.jsonl", "a") as log:
        log.write(json.dumps({"step": 6, "eval_loss": 1.0, "eval_tau": 1.0}) + "\n")
    resumed = train_here(out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not list(out.glob(".export.*"))
    same_run(whole, out)
    a, b = json.loads((whole / "summary.json").read_text()), json.loads((out / "summary.json").read_text())
    assert b["resumed_from_step"] == 6
    for key in ("loss", "tau", "summary_window_steps", "eval_tau"):
        assert a[key] == b[key], key
    assert b["tokens_per_s"] > 0


def test_leftovers_of_a_dead_checkpoint_save_are_removed(tmp_path):
    from flashdraft.train.checkpoint import Checkpointer

    leftover = tmp_path / ".step-4.xyz.tmp"
    leftover.mkdir()
    mine = tmp_path / "notes.txt"
    mine.write_text("a user's file")
    Checkpointer(tmp_path, dist=None, keep=2).remove_leftovers()
    assert not leftover.exists() and mine.read_text() == "a user's file"
    shutil.rmtree(tmp_path / "x", ignore_errors=True)
