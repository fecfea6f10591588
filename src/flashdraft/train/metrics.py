"""Training metrics: written to `metrics.jsonl` and handed to the caller's callback (rank 0)."""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from flashdraft.files import write_text

# on_metrics(step, values): where logged metrics go besides metrics.jsonl (the stage: its MLflow run)
MetricsCallback = Callable[[int, Mapping[str, float]], None]


def peak_memory_gb(device: torch.device) -> float:
    """Peak allocated accelerator memory, or the process's peak resident memory on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (2**30 if sys.platform == "darwin" else 2**20)


class MetricsLog:
    """Appends one JSON line per logged step and passes it to `on_metrics`; a no-op when not `enabled`."""

    def __init__(self, path: Path, enabled: bool, on_metrics: MetricsCallback | None = None):
        self.path, self.enabled, self.on_metrics = path, enabled, on_metrics

    def truncate_after(self, step: int, *, finished: bool) -> None:
        """Drop lines of steps after `step`: all of them for a fresh run (step 0), those a run that died
        before its next checkpoint wrote for a resumed one, and a line torn by a kill mid-write. When
        training had `finished` at `step` (the run died in its final evaluation or export), the final
        evaluation's line goes too: it runs again."""
        if not self.enabled or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # torn: the process died while writing it, and nothing follows
            at = record.get("step", 0)
            final_eval = finished and at == step and all(k == "step" or k.startswith("eval_") for k in record)
            if at <= step and not final_eval:
                kept.append(line)
        write_text(self.path, "".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.on_metrics is not None:
            self.on_metrics(step, metrics)
