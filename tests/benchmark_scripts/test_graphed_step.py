"""The graphed-step benchmark runs (tiny CPU mode): compiled and eager layers choose the same tokens in
float32, and both settings' step times are written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "graphed_step.py"


def test_tiny_run_decodes_alike_with_compiled_and_eager_layers(tmp_path):
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("graphed_step_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "graphed.json"
    assert module.main(["--tiny", "--rows", "3", "--new", "6", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["rows_with_equal_tokens"] == 3
    assert set(report["runs"]) == {"eager", "compiled"}
    assert all(run["ms_per_step"] > 0 for run in report["runs"].values())
