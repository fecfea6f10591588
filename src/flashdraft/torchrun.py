"""Run a flashdraft command under torchrun on this machine: N local processes, output streamed.

The trainer picks its process-group backend itself (NCCL with CUDA, gloo without), so this only starts
the processes. Their output goes straight to ours, so progress and errors show as they happen.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence

from flashdraft.errors import UserError

log = logging.getLogger(__name__)


def torchrun_command(argv: Sequence[str], nproc_per_node: int) -> list[str]:
    if nproc_per_node < 1:
        raise UserError(f"nproc per node must be >= 1, got {nproc_per_node}")
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}",
        "-m", "flashdraft.cli", *argv,
    ]


def run_torchrun(argv: Sequence[str], nproc_per_node: int, env: Mapping[str, str] | None = None) -> None:
    """`torchrun --standalone --nproc-per-node N -m flashdraft.cli ARGV`; raises when any process fails."""
    command = torchrun_command(argv, nproc_per_node)
    log.info("running %s", " ".join(command))
    returncode = subprocess.run(command, env=dict(env) if env is not None else None).returncode
    if returncode != 0:
        raise RuntimeError(
            f"`flashdraft {argv[0]}` under torchrun ({nproc_per_node} processes) exited with code {returncode}; "
            "the failing rank's error is in the output above"
        )
