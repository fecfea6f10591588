"""torchrun on this machine: the `local` backend, and a PyTorchJob pod's re-exec of `flashdraft train`
(or `warmup`).

`local` runs `torchrun --standalone --nproc-per-node N -m flashdraft.cli train ...`; the command picks
its process-group backend itself (NCCL with CUDA, gloo without). Output goes straight to ours, so
progress and errors show as they happen.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from flashdraft.config import Config
from flashdraft.errors import UserError
from flashdraft.files import check_output_dir
from flashdraft.launch.arguments import OUTPUT_DIR_KEYS, command_arguments
from flashdraft.launch.watch import JobFailedError

log = logging.getLogger(__name__)


def torchrun_command(argv: Sequence[str], nproc_per_node: int | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m flashdraft.cli ARGV`.

    With `nproc_per_node`: a standalone run of that many processes here. Without: torchrun takes the
    nodes, processes and rendezvous from the PET_* variables a Kubeflow operator sets on the pod.
    """
    standalone = ["--standalone", f"--nproc-per-node={nproc_per_node}"] if nproc_per_node else []
    return [sys.executable, "-m", "torch.distributed.run", *standalone, "-m", "flashdraft.cli", *argv]


def pet_relaunch_command(argv: Sequence[str]) -> list[str] | None:
    """The command that re-runs `flashdraft ARGV` under torchrun, when a PyTorchJob asked for several
    processes per pod (PET_NPROC_PER_NODE) and this process is not a torchrun worker yet; else None."""
    if "PET_NPROC_PER_NODE" not in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        return None
    return torchrun_command(argv)


def output_dir(config: Config) -> str:
    section, _, key = OUTPUT_DIR_KEYS[config.launch.command].partition(".")
    return config.launch.output_dir or getattr(getattr(config, section), key)


def local_command(config: Config) -> list[str]:
    """The torchrun command that runs `config.launch.command` with `config` on this machine."""
    launch = config.launch
    if launch.nodes != 1:
        raise UserError(
            f"launch.nodes is {launch.nodes}, but the local backend runs on this machine only; "
            "use --backend pytorchjob or trainjob for several nodes (or --nodes 1)"
        )
    return torchrun_command(command_arguments(config, output_dir(config), portable=False), launch.procs)


def train_here(config: Config) -> str:
    """Run `config.launch.command` under torchrun on this machine; returns the output dir. Raises JobFailedError
    when a process fails (its error is in the output above)."""
    # What no command may write into (a file, the working or home folder) fails here, before torchrun starts;
    # whether a non-empty folder may be resumed or replaced is the command's own decision.
    check_output_dir(output_dir(config), config.launch.command, flag="the output folder", overwrite=True)
    command = local_command(config)
    log.info("running %s", shlex.join(command))
    returncode = subprocess.run(command, env={**os.environ, **config.launch.env}).returncode
    if returncode != 0:
        raise JobFailedError(
            f"`flashdraft {config.launch.command}` under torchrun ({config.launch.procs} processes) exited with code "
            f"{returncode}; "
            "the failing rank's error is in the output above"
        )
    return output_dir(config)
