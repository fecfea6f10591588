"""Where `flashdraft train` runs for a pipeline step: torchrun processes here, or a Kubernetes job.

`local`: `torchrun --standalone --nproc-per-node N -m flashdraft.cli train ...` on this machine; the
trainer picks its process-group backend itself (NCCL with CUDA, gloo without). Output goes straight to
ours, so progress and errors show as they happen. `pytorchjob` / `trainjob`: `flashdraft.launch`
creates the job, streams rank 0's log and raises with the pods' failure causes.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from flashdraft.errors import UserError

log = logging.getLogger(__name__)

LAUNCHERS = ("local", "pytorchjob", "trainjob")


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


def run_training(
    *,
    launcher: str,
    recipe: str | None,
    overrides: Sequence[str],
    output_dir: str,
    nproc_per_node: int = 1,
    job: Mapping[str, Any] | None = None,
) -> None:
    """Train with `flashdraft train --config RECIPE OVERRIDES train.output_dir=OUTPUT_DIR` by `launcher`.

    `job`: `flashdraft.launch.launch_training` arguments for the Kubernetes launchers (image, nodes,
    pvcs, secret_env, tolerations, node_selector, ...); `nproc_per_node` is then the GPUs per node.
    """
    if launcher not in LAUNCHERS:
        raise UserError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    if launcher == "local":
        argv = ["train", *(["--config", recipe] if recipe else []), *overrides, f"train.output_dir={output_dir}"]
        run_torchrun(argv, nproc_per_node)
        return
    from flashdraft.launch import launch_training

    launch_training(launcher=launcher, recipe=recipe or None, overrides=list(overrides), output_dir=output_dir,
                    gpus_per_node=nproc_per_node, **dict(job or {}))
