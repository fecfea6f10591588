"""Training metrics: summed over micro-steps and ranks, written to `metrics.jsonl` and MLflow (rank 0)."""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from flashdraft.tracking.runs import StepRun


def add_sums(total: dict[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for key, value in new.items():
        value = value.detach().double().cpu()
        total[key] = total[key] + value if key in total else value
    return total


def peak_memory_gb(device: torch.device) -> float:
    """Peak allocated accelerator memory, or the process's peak resident memory on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (2**30 if sys.platform == "darwin" else 2**20)


class MetricsLog:
    """Appends one JSON line per logged step; mirrors it to the MLflow run (a no-op when tracking is off)."""

    def __init__(self, path: Path, run: StepRun, enabled: bool):
        self.path, self.run, self.enabled = path, run, enabled

    def truncate_after(self, step: int) -> None:
        """Drop lines of steps after `step`: all of them for a fresh run (step 0), those a run that died
        before its next checkpoint wrote for a resumed one."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [line for line in self.path.read_text().splitlines() if json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.run.log_metrics(metrics, step=step)
