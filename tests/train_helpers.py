"""Helpers for the trainer tests: pattern data and running `flashdraft train` in a subprocess or in this one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
# Scripts under tests/<package>/ run as subprocesses import these helpers from here.
TESTS = str(Path(__file__).resolve().parent)


def alphabet_chats(path: Path, rows: int, length: int = 48, seed: int = 0) -> Path:
    """Replies that run through the alphabet from a random letter: the token at anchor + k is fully
    determined by the anchor, so a draft can learn every slot."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            start = rng.randrange(26)
            reply = "".join(chr(97 + (start + k) % 26) for k in range(length))
            messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": reply}]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def tiny_train_args(target: Path, data: Path, output: Path, **overrides) -> list[str]:
    values = {
        "target.name_or_path": str(target),
        "data.train": str(data),
        "train.output_dir": str(output),
        "draft.num_layers": 1,
        "draft.block_size": 4,
        "objective.num_anchors": 4,
        **overrides,
    }
    return [f"{k}={v}" for k, v in values.items()]


def cpu_env(**extra: str) -> dict:
    """The environment of a CPU subprocess: one thread, and no GPU even where there is one (the CPU
    tests rely on the CPU path: dense mask, fp32, deterministic kernels)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": TESTS, **extra}


def run_cli(args: list[str], *, env: dict | None = None, torchrun: int = 0, cpu: bool = False, timeout: int = 300):
    """`python -m flashdraft.cli ...` (or torchrun with `torchrun` processes), one thread per process;
    `cpu` hides any GPU."""
    launcher = [sys.executable]
    if torchrun:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun}"]
    full_env = {**(cpu_env() if cpu else {**os.environ, "OMP_NUM_THREADS": "1"}), **(env or {})}
    return subprocess.run(
        [*launcher, "-m", "flashdraft.cli", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


@contextlib.contextmanager
def as_in_a_cpu_subprocess():
    """This process set up as `cpu_env` sets up a subprocess: no GPU and one thread (the same numerics)."""
    from unittest import mock

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            yield
    finally:
        torch.set_num_threads(threads)


def run_cli_here(args: list[str], capfd, caplog) -> subprocess.CompletedProcess:
    """`flashdraft ARGS` in this process, as `run_cli(..., cpu=True)` runs it, without an interpreter to start
    and torch to import; for runs with no fault to inject. What it printed comes back as stdout, what it
    printed to stderr and logged as stderr."""
    from flashdraft import cli

    caplog.set_level(logging.INFO)
    capfd.readouterr()
    caplog.clear()
    with as_in_a_cpu_subprocess():
        code = cli.main(args)
    printed, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, code, printed, err + caplog.text)


def read_metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
