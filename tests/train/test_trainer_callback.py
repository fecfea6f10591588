"""The trainer knows nothing of MLflow: logged metrics go to metrics.jsonl and to the caller's callback,
and the run returns the summary it writes to summary.json."""

from __future__ import annotations

import json
import sys

from flashdraft.config import load_config
from train_helpers import alphabet_chats, read_metrics, tiny_train_args


def test_metrics_reach_the_callback_without_mlflow(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # unimportable: the trainer must not need it
    from flashdraft.train.distributed import teardown
    from flashdraft.train.trainer import Trainer

    data = alphabet_chats(tmp_path / "chats.jsonl", rows=8)
    out = tmp_path / "run"
    config = load_config(None, tiny_train_args(tiny_target("qwen3"), data, out, **{
        "train.max_steps": 3, "train.log_every": 1, "data.eval_samples": 2}))
    seen = []
    try:
        summary = Trainer(config).run(on_metrics=lambda step, values: seen.append({"step": step, **values}))
    finally:
        teardown()
    assert seen == read_metrics(out) and [m["step"] for m in seen] == [1, 2, 3, 3]  # 3 steps, then the eval
    assert "eval_tau" in seen[-1] and summary["eval_tau"] == seen[-1]["eval_tau"]
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["export"] == str(out / "export") and (out / "export" / "model.safetensors").is_file()
