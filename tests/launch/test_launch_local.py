"""torchrun here: the one torchrun command, a PyTorchJob pod's re-exec under torchrun (PET_* variables), and
`flashdraft launch --backend local` training with two processes on this CPU."""

from __future__ import annotations

import json
import sys

import pytest
from mlflow import MlflowClient
from train_helpers import alphabet_chats, tiny_train_args

from flashdraft.cli import main
from flashdraft.launch.local import pet_relaunch_command, torchrun_command

RUN = [sys.executable, "-m", "torch.distributed.run"]


def test_torchrun_command_standalone_here():
    assert torchrun_command(["train", "--config", "x"], 4) == [
        *RUN, "--standalone", "--nproc-per-node=4", "-m", "flashdraft.cli", "train", "--config", "x"]


def test_pet_variables_relaunch_under_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    assert pet_relaunch_command(["train", "--config", "x"]) is None  # a plain single process
    monkeypatch.setenv("PET_NPROC_PER_NODE", "8")
    # torchrun itself reads PET_NNODES / PET_NODE_RANK / PET_MASTER_ADDR / PET_MASTER_PORT.
    assert pet_relaunch_command(["train", "--config", "x"]) == [*RUN, "-m", "flashdraft.cli", "train", "--config", "x"]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # already a torchrun worker: no second launch
    assert pet_relaunch_command(["train"]) is None


@pytest.mark.slow
@pytest.mark.distributed
def test_local_backend_trains_with_two_processes(tiny_target, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the gloo CPU path, even where there is a GPU
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=16)
    overrides = tiny_train_args(tiny_target("qwen3"), data, tmp_path / "not-here", **{"train.max_steps": 2})
    out, tracking = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = main(["launch", "--backend", "local", "--gpus-per-node", "0", "--procs-per-node", "2",
                 "--env", "OMP_NUM_THREADS=1", "--output-dir", str(out), *overrides, f"tracking.uri={tracking}"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "torchrun succeeded in" in printed and f"output in {out}" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2
    assert not (tmp_path / "not-here").exists()  # --output-dir (launch.output_dir) wins over train.output_dir
    # The launch step logs its resolved config; the trainer got the tracking section and logs its own run.
    client = MlflowClient(tracking)
    runs = {run.info.run_name: run for run in client.search_runs([client.get_experiment_by_name("flashdraft").experiment_id])}
    assert set(runs) == {"launch", "train"} and all(run.info.status == "FINISHED" for run in runs.values())
    launch = runs["launch"].data
    assert launch.params["launch.procs_per_node"] == "2" and launch.tags["flashdraft.launched"] == "torchrun"
    assert runs["train"].data.params["launch.procs_per_node"] == "None"  # the launch section stayed behind
