"""An evaluation that survives interruption: each finished benchmark's result is saved beside the report
(`<report stem>.partial.json`, atomically), and a rerun of the same evaluation takes the saved ones and
runs only the rest. An evaluation of several benchmarks takes many minutes on a GPU, and losing all of it
to a preempted machine or a time limit is the common failure.

"The same evaluation" is a fingerprint of everything a result depends on: the resolved target and
evaluate settings, the draft's weight files, the prompts as token ids, and the torch and transformers
versions. A saved file with another fingerprint is replaced, not used. The file is removed once the
report is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
import transformers

from flashdraft.files import write_json

log = logging.getLogger(__name__)


def fingerprint(settings: dict, draft: Path, prompts: dict[str, list[torch.Tensor]]) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for weights in sorted(draft.glob("*.safetensors")):
        with open(weights, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 24), b""):
                digest.update(chunk)
    for name, encoded in prompts.items():
        digest.update(name.encode())
        for ids in encoded:
            digest.update(ids.cpu().numpy().tobytes())
    digest.update(f"{torch.__version__} {transformers.__version__}".encode())
    return digest.hexdigest()


class PartialReport:
    """The benchmarks already done (`results`), and `save` / `finish` as the evaluation goes on."""

    def __init__(self, report: Path, key: str):
        self.path = report.with_name(f"{report.stem}.partial.json")
        self.key = key
        self.results: dict[str, dict] = {}
        if not self.path.is_file():
            return
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            log.warning("ignoring unreadable partial results %s (%s)", self.path, err)
            return
        if not isinstance(saved, dict) or saved.get("fingerprint") != key:
            log.warning("ignoring %s: saved by another evaluation (settings, draft weights or prompts differ)",
                        self.path)
            return
        self.results = dict(saved.get("benchmarks", {}))
        log.info("resuming: %s already done (%s)", ", ".join(self.results) or "nothing", self.path)

    def save(self, name: str, result: dict) -> None:
        self.results[name] = result
        write_json(self.path, {"fingerprint": self.key, "benchmarks": self.results})

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
