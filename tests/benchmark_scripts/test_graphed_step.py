"""The graphed-step benchmark runs (tiny CPU mode): compiled and eager layers choose the same tokens in
float32, and both settings' step times are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import graphed_step  # noqa: E402


def test_tiny_run_decodes_alike_with_compiled_and_eager_layers(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "graphed.json"
    assert graphed_step.main(["--tiny", "--rows", "3", "--new", "6", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["rows_with_equal_tokens"] == 3
    assert set(report["runs"]) == {"eager", "compiled"}
    assert all(run["ms_per_step"] > 0 for run in report["runs"].values())
