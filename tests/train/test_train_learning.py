"""Training learns: on data whose continuation is fully determined by the anchor token, expected tau
climbs from ~1 towards the block size within a few hundred CPU steps (tiny random target)."""

from __future__ import annotations

import json

import pytest

from train_helpers import alphabet_chats, read_metrics, run_cli_here, tiny_train_args


@pytest.mark.slow
def test_expected_tau_climbs(tiny_target, tmp_path, capfd, caplog):
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=200)
    out = tmp_path / "run"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = run_cli_here(["train", *tiny_train_args(tiny_target("qwen3"), data, out, **{
        "tracking.uri": store, "tracking.experiment": "learn",
        "draft.block_size": 8, "objective.num_anchors": 8, "train.micro_batch_size": 4, "train.lr": "3e-3",
        "train.epochs": 100, "train.max_steps": 200, "train.log_every": 20, "data.eval_samples": 16,
        "train.checkpoint_every": 1000})], capfd, caplog)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(out)
    assert metrics[0]["tau"] < 1.5  # a fresh draft guesses nothing
    summary = json.loads((out / "summary.json").read_text())
    # Block size 8: tau can reach 8. Measured: ~7 after 200 steps (held-out eval set).
    assert summary["eval_tau"] > 5.0, summary
    assert summary["eval_acc_slot_7"] > 0.5
    assert summary["loss"] < metrics[0]["loss"]

    # The same metrics and the resolved config are in the MLflow run.
    from mlflow import MlflowClient

    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("learn").experiment_id])
    assert run.data.params["train.max_steps"] == "200" and run.data.params["draft.block_size"] == "8"
    taus = [m.value for m in client.get_metric_history(run.info.run_id, "tau")]
    assert taus == [m["tau"] for m in metrics if "tau" in m]
    assert run.data.metrics["final_eval_tau"] == summary["eval_tau"]

