"""LaunchSpec validation (bad input -> a UserError naming the fix), the pod's training command and
`flashdraft launch --dry-run`."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
import yaml

from flashdraft.cli import main
from flashdraft.config import load_config, parse_overrides
from flashdraft.errors import UserError
from flashdraft.launch import job_manifest
from flashdraft.launch.arguments import command_arguments, yaml_value
from flashdraft.launch.job_spec import job_spec
from flashdraft.launch.jobs import build_job
from flashdraft.stages import launch as launch_stage
from flashdraft.stages.args import config_from_args

GPU_IMAGE = "reg/flashdraft-trainer:0.1.0-cuda12.8"


def spec(recipe="smollm2_135m", overrides=(), **launch):
    """The job spec of `recipe` + `overrides` with these `launch.*` settings."""
    values = dict(backend="pytorchjob", image=GPU_IMAGE, namespace="team-a", name="fd")
    values.update(launch)
    return job_spec(load_config(recipe, list(overrides), {f"launch.{k}": v for k, v in values.items()}))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(gpus_per_node=0), "CUDA image but --gpus-per-node is 0"),
        (dict(gpus_per_node=-1), "launch.gpus_per_node must be >= 0"),
        (dict(nodes=0), "launch.nodes must be >= 1"),
        (dict(image=None), "launch.image is not set; give the trainer image with --image"),
        (dict(secret_env=["HF_TOKEN"]), "expected ENV=SECRET:KEY"),
        (dict(secret_env=["HF_TOKEN=flashdraft-hf-token"]), "expected ENV=SECRET:KEY"),
        (dict(secret_env=["HF_TOKEN=:HF_TOKEN"]), "expected ENV=SECRET:KEY"),
        (dict(secret_env=["HF_TOKEN=HF_Token_Secret:HF_TOKEN"]), "Secret name for HF_TOKEN"),
        (dict(pvcs=[]), "no shared volume: give --pvc"),
        (dict(pvcs=["flashdraft-data"]), "expected CLAIM:/mount/path"),
        (dict(pvcs=["flashdraft-data:data"]), "must be absolute"),
        (dict(output_dir="/tmp/out"), "not on a mounted PVC"),
        (dict(env={"WORLD_SIZE": "8"}), "set by the training operator"),
        (dict(env={"PET_NNODES": "2"}), "set by the training operator"),
        (dict(name="Flashdraft_Job"), "job name"),
        (dict(name="x" * 41), "at most 40"),
        (dict(backend="slurm"), "launch.backend must be one of local, pytorchjob, trainjob"),
        (dict(backend="local"), "not a Kubernetes job"),
        (dict(backend="trainjob", elastic_min_nodes=1, nodes=2), "PyTorchJob feature"),
        (dict(elastic_min_nodes=3, nodes=2), "between 1 and --nodes"),
        (dict(procs_per_node=2), "only for runs without GPUs"),
        (dict(memory="lots"), "not a Kubernetes quantity"),
        (dict(tolerations=[{"key": "gpu", "operator": "Exist"}]), "operator must be one of"),
        (dict(image="my image"), "not a container image"),
        (dict(overrides=["draft.num_layer=2"]), "unknown config key(s) draft.num_layer"),
        (dict(overrides=["train.output_dir=/tmp/x"]), "--output-dir"),
        (dict(env={"OMP_NUM_THREADS": 4}), "launch.env.OMP_NUM_THREADS: expected str"),
        (dict(recipe="no_such_recipe"), "unknown recipe"),
        (dict(colour="blue"), "unknown config key(s) launch.colour"),
    ],
)
def test_bad_input_is_a_clear_error(kw, message):
    with pytest.raises(UserError) as err:
        spec(**kw)
    assert message in str(err.value)


def test_cpu_image_with_zero_gpus_is_fine():
    s = spec(image="reg/flashdraft-runtime:0.1.0", gpus_per_node=0, procs_per_node=2)
    job = build_job(s)
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert "resources" not in container and job["spec"]["nprocPerNode"] == "2"


def test_command_env_and_volumes():
    s = spec(
        nodes=2,
        gpus_per_node=8,
        overrides=["train.max_steps=5", "launch.memory=64Gi"],
        secret_env=["HF_TOKEN=flashdraft-hf-token:HF_TOKEN"],
        env={"NCCL_DEBUG": "INFO"},
    )
    pod = build_job(s)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    # The recipe by name and the training overrides; the launch section stays behind.
    assert container["command"] == [
        "torchrun",
        "--no-python",
        "flashdraft",
        "train",
        "--config",
        "smollm2_135m",
        "train.max_steps=5",
        "train.output_dir=/data/runs/fd",
    ]
    env = {e["name"]: e for e in container["env"]}
    for var in ("HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR"):
        assert env[var]["value"].startswith("/scratch")
    assert env["HF_HOME"]["value"] == "/data/hf-cache"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "flashdraft-hf-token", "key": "HF_TOKEN"}}
    assert env["NCCL_DEBUG"]["value"] == "INFO"
    assert not any(name.startswith("PET_") or name in ("RANK", "WORLD_SIZE", "MASTER_ADDR") for name in env)
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8", "memory": "64Gi"}, "requests": {"memory": "64Gi"}}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["pvc-0"]["persistentVolumeClaim"]["claimName"] == "flashdraft-data"
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_tracking_env_is_passed_on(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://flashdraft-mlflow:5000")
    monkeypatch.setenv("FLASHDRAFT_PARENT_RUN_ID", "abc123")
    container = build_job(spec(backend="trainjob"))["spec"]["trainer"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLFLOW_TRACKING_URI"] == "http://flashdraft-mlflow:5000" and env["FLASHDRAFT_PARENT_RUN_ID"] == "abc123"


@pytest.mark.parametrize(
    "value",
    [
        1e-05,
        3e-4,
        0.1,
        2.0,
        1e20,
        7,
        True,
        None,
        "packaged:smollm2",
        "a b",
        "1.0",
        [1, 7, 14],
        {"a": 1},
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "",
    ],
)
def test_yaml_value_round_trips(value):
    assert parse_overrides([f"k={yaml_value(value)}"])["k"] == value


def test_recipe_file_travels_as_overrides(tmp_path):
    """A recipe file on the launching machine is not in the pod: its values become overrides that
    rebuild exactly the same config."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "target": {"name_or_path": "Qwen/Qwen3-8B", "dtype": "bfloat16"},
                "draft": {"num_layers": 5, "target_layer_ids": [1, 9, 17, 25, 33], "rope_theta": 1e6},
                "train": {"lr": 6e-4},
                "launch": {"nodes": 2},
            }
        )
    )
    config = load_config(str(recipe), ["train.max_steps=3"])
    command, *args = command_arguments(config, "/data/runs/x", portable=True)
    assert command == "train" and "--config" not in args and "train.max_steps=3" in args and args[-1] == "train.output_dir=/data/runs/x"
    assert not any(a.startswith("launch.") for a in args)
    assert len({a.partition("=")[0] for a in args}) == len(args)  # each key once: no order decides
    travelled = load_config(None, args)
    # Only the name of the recipe stays behind: the pod's config says it came from no recipe file.
    assert travelled.recipe is None
    expected = load_config(str(recipe), ["train.max_steps=3", "train.output_dir=/data/runs/x"])
    assert travelled == replace(expected, recipe=None, launch=travelled.launch)
    # On this machine (the local backend) the file itself is read again.
    assert command_arguments(config, "out", portable=False)[:3] == ["train", "--config", str(recipe)]


def test_a_launched_warmup_writes_where_the_launcher_says(tmp_path):
    config = load_config("smollm2_135m", values={"launch.command": "warmup", "launch.backend": "pytorchjob",
                                                 "launch.image": "r/flashdraft-trainer:1", "launch.name": "w",
                                                 "launch.namespace": "ns", "warmup.num_samples": 100})
    command, *args = command_arguments(config, "/data/runs/w", portable=True)
    assert (command, args[:2], args[-1]) == ("warmup", ["--config", "smollm2_135m"], "warmup.output_dir=/data/runs/w")
    assert "warmup.num_samples=100" in args
    job = job_manifest(config)
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"][:4] == ["torchrun", "--no-python", "flashdraft", "warmup"]


def test_parse_toleration():
    assert launch_stage.parse_toleration("nvidia.com/gpu:NoSchedule") == {
        "key": "nvidia.com/gpu",
        "operator": "Exists",
        "effect": "NoSchedule",
    }
    assert launch_stage.parse_toleration("pool=h200") == {"key": "pool", "operator": "Equal", "value": "h200"}
    with pytest.raises(argparse.ArgumentTypeError):
        launch_stage.parse_toleration(":NoSchedule")


def parse_launch(argv: list[str]):
    parser = argparse.ArgumentParser()
    launch_stage.add_arguments(parser)
    return config_from_args(parser.parse_intermixed_args(argv))


def test_flags_are_launch_keys():
    config = parse_launch([
        "--config", "smollm2_135m", "--backend", "trainjob", "--pvc", "a:/a", "train.max_steps=2", "--pvc", "b:/b",
        "--env", "A=1", "--env", "B=x=y", "--node-selector", "pool=h200", "--toleration", "gpu:NoSchedule",
        "--secret-env", "T=s:k", "--image-pull-secret", "regcred", "--timeout", "60", "--poll-interval", "2",
        "--cleanup", "never", "--gpus-per-node", "0", "--procs-per-node", "2", "launch.nodes=3",
    ])
    launch = config.launch
    assert launch.backend == "trainjob" and launch.nodes == 3 and launch.procs == 2
    assert launch.pvcs == ["a:/a", "b:/b"]  # replace the default volume, not add to it
    assert launch.env == {"A": "1", "B": "x=y"} and launch.node_selector == {"pool": "h200"}
    assert launch.tolerations == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert launch.secret_env == ["T=s:k"] and launch.image_pull_secrets == ["regcred"]
    assert (launch.timeout_s, launch.poll_s, launch.cleanup) == (60.0, 2.0, "never")
    assert config.train.max_steps == 2
    # key=value overrides win over flags
    assert parse_launch(["--nodes", "2", "launch.nodes=4"]).launch.nodes == 4
    with pytest.raises(SystemExit):
        parse_launch(["--env", "NOVALUE"])


def test_dry_run_prints_the_manifest_and_needs_no_cluster(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    code = main(
        [
            "launch",
            "--backend",
            "trainjob",
            "--config",
            "smollm2_135m",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--image",
            GPU_IMAGE,
            "--namespace",
            "team-a",
            "--name",
            "fd-dry",
            "--dry-run",
            "train.max_steps=10",
        ]
    )
    assert code == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert job["kind"] == "TrainJob" and job["metadata"] == {
        "name": "fd-dry",
        "namespace": "team-a",
        "labels": {"app.kubernetes.io/name": "flashdraft", "app.kubernetes.io/component": "train"},
    }
    assert job["spec"]["trainer"]["numNodes"] == 2 and job["spec"]["trainer"]["numProcPerNode"] == 4
    assert job["spec"]["trainer"]["command"][-2:] == ["train.max_steps=10", "train.output_dir=/data/runs/fd-dry"]


def test_dry_run_of_the_local_backend_prints_the_torchrun_command(capsys):
    code = main(["launch", "--config", "smollm2_135m", "--gpus-per-node", "0", "--procs-per-node", "2", "--dry-run",
                 "--output-dir", "/tmp/out", "train.max_steps=3", "launch.image=ignored:here"])
    assert code == 0
    command = capsys.readouterr().out.split()
    assert command[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
    assert command[6:] == ["flashdraft.cli", "train", "--config", "smollm2_135m", "train.max_steps=3",
                           "train.output_dir=/tmp/out"]


def test_the_local_backend_runs_on_one_node(capsys):
    assert main(["launch", "--nodes", "2", "--dry-run"]) == 2
    assert "the local backend runs on this machine only" in capsys.readouterr().err


def test_cli_bad_input_exit_code(capsys):
    code = main(["launch", "--backend", "pytorchjob", "--image", GPU_IMAGE, "--gpus-per-node", "0",
                 "--namespace", "a", "--dry-run"])
    assert code == 2
    assert "CUDA image but --gpus-per-node is 0" in capsys.readouterr().err
