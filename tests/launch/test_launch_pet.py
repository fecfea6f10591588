"""The PET_* wiring, for real: two "nodes" x one process on this CPU run the generated container command
with exactly the environment each operator injects, form one gloo process group and train.

No cluster can run here, so each "pod" is a local process: its command and env come from the generated
manifest, its /scratch emptyDir is a temp dir, the shared PVC is a temp dir both nodes see, and the
operator's variables are added as the operators write them (Training Operator 1.9 envvar.go for
PyTorchJob; Trainer v2's torch plugin for TrainJob), with the master address pointing at this host.

Run 1 is a PyTorchJob whose trainer is killed after step 3 (the trainer's crash hook); run 2 is the
restart: the same command on the same shared volume resumes from the step-2 checkpoint and finishes.
To cover both operators in two runs, the restart uses the TrainJob's environment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import alphabet_chats, tiny_train_args

from flashdraft.config import load_config
from flashdraft.launch.job_spec import job_spec
from flashdraft.launch.jobs import build_job

LEAKY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_env(kind: str, rank: int, nodes: int, nproc: str, port: int) -> dict[str, str]:
    """What the operator adds to node `rank`'s training container (master service -> this host)."""
    if kind == "PyTorchJob":  # Training Operator v1.9, non-elastic, with a Master
        return {
            "PYTHONUNBUFFERED": "0",
            "MASTER_PORT": str(port),
            "PET_MASTER_PORT": str(port),
            "MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_ADDR": "127.0.0.1",
            "WORLD_SIZE": str(nodes * int(nproc)),
            "RANK": str(rank),
            "PET_NPROC_PER_NODE": nproc,
            "PET_NODE_RANK": str(rank),
            "PET_NNODES": str(nodes),
        }
    return {
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }


def pod_containers(job: dict) -> list[tuple[list[str], list[dict]]]:
    """(command, env) of each node's training container, node rank order."""
    if job["kind"] == "PyTorchJob":
        replicas = job["spec"]["pytorchReplicaSpecs"]
        out = []
        for role in ("Master", "Worker"):  # Master is node rank 0, Worker i is rank i + 1
            if role in replicas:
                (container,) = replicas[role]["template"]["spec"]["containers"]
                out += [(container["command"], container["env"])] * replicas[role]["replicas"]
        return out
    trainer = job["spec"]["trainer"]
    return [(trainer["command"], trainer["env"])] * trainer["numNodes"]


def run_pods(job: dict, scratch_root: Path, timeout: int = 600) -> list[subprocess.CompletedProcess]:
    port = free_port()
    nodes = 2
    nproc = (
        job["spec"]["nprocPerNode"] if job["kind"] == "PyTorchJob" else str(job["spec"]["trainer"]["numProcPerNode"])
    )
    base = {k: v for k, v in os.environ.items() if k not in LEAKY and not k.startswith(("PET_", "TORCHELASTIC_"))}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"  # the image's PATH
    procs = []
    for rank, (command, env_list) in enumerate(pod_containers(job)):
        scratch = scratch_root / f"{job['kind']}-{rank}"  # each pod's emptyDir
        scratch.mkdir(parents=True)
        container_env = {e["name"]: e["value"].replace("/scratch", str(scratch)) for e in env_list}
        env = {**base, **container_env, **operator_env(job["kind"], rank, nodes, nproc, port)}
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    return results


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_form_one_group_train_and_resume_after_restart(tiny_target, tmp_path):
    pvc = tmp_path / "pvc"  # the shared RWX volume both nodes mount
    pvc.mkdir()
    data = alphabet_chats(pvc / "chats.jsonl", rows=16)
    overrides = [
        a
        for a in tiny_train_args(
            tiny_target("qwen3"),
            data,
            pvc / "unused",
            **{"train.max_steps": 4, "train.checkpoint_every": 2, "train.log_every": 1},
        )
        if not a.startswith("train.output_dir=")
    ]

    def job(backend: str, env: dict) -> dict:
        launch = dict(
            backend=backend,
            image="reg/flashdraft-runtime:0.1.0",
            gpus_per_node=0,
            nodes=2,
            pvcs=[f"flashdraft-data:{pvc}"],
            namespace="team-a",
            name="fd-pet",
            env={"OMP_NUM_THREADS": "1", **env},
        )
        return build_job(job_spec(load_config(None, overrides, {f"launch.{k}": v for k, v in launch.items()})))

    out = pvc / "runs" / "fd-pet"
    first = run_pods(job("pytorchjob", {"FLASHDRAFT_CRASH_AFTER_STEP": "3"}), tmp_path / "scratch1")
    # Each trainer process exits 17 after step 3; torchrun reports the child's failure with exit 1.
    assert [p.returncode for p in first] == [1, 1], first[0].stdout[-3000:]
    assert all("exitcode  : 17" in p.stdout for p in first)
    assert "rank 0 of 2" in first[0].stdout and "rank 1 of 2" in first[1].stdout, first[0].stdout[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]

    second = run_pods(job("trainjob", {}), tmp_path / "scratch2")
    for pod in second:
        assert pod.returncode == 0, pod.stdout[-4000:]
    assert "rank 0 of 2" in second[0].stdout and "rank 1 of 2" in second[1].stdout
    assert "resumed from" in second[0].stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["resumed_from_step"] == 2
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert (out / "export" / "config.json").is_file()
