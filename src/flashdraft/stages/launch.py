"""`flashdraft launch --config RECIPE [--backend local|pytorchjob|trainjob] [--flag ...] [key=value ...]`:
run `flashdraft train` as torchrun here, or as a PyTorchJob or TrainJob on a Kubernetes cluster.

    flashdraft launch --backend pytorchjob --config nemotron_nano30b --nodes 2 --gpus-per-node 8 \\
        --image REGISTRY/flashdraft-trainer:TAG --pvc flashdraft-data:/data train.max_steps=1000

Every flag sets a `launch.*` key (a recipe may set the launch section too). The trainer gets the recipe
and the config's other sections; `--dry-run` prints the job manifest (or the torchrun command) instead.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import yaml

from flashdraft.config import Config
from flashdraft.launch import LaunchResult, job_manifest, launch_training
from flashdraft.launch.local import local_command
from flashdraft.launch.watch import CLEANUP_POLICIES
from flashdraft.stages.args import Flag, add_config_arguments, config_from_args
from flashdraft.tracking.runs import step_run


def parse_toleration(text: str) -> dict:
    """`KEY[=VALUE][:EFFECT]` as in `kubectl taint`; without a value the operator is Exists."""
    rest, _, effect = text.partition(":")
    key, sep, value = rest.partition("=")
    if not key:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule"
        )
    toleration = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


class KeyValues(argparse.Action):
    """Repeated `KEY=VALUE` arguments collected into one dict."""

    def __call__(self, parser, namespace, text, option_string=None):
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentError(self, f"expected KEY=VALUE, got {text!r}")
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest, None) or {}), key: value})


FLAGS = [
    Flag("--command", "launch.command", "what runs: train, or warmup (the answers regenerated on every GPU)",
         {"choices": ("train", "warmup")}),
    Flag("--backend", "launch.backend",
         "local: torchrun on this machine; pytorchjob (Training Operator v1) or trainjob (Kubeflow Trainer v2)",
         {"choices": ("local", "pytorchjob", "trainjob")}),
    Flag("--image", "launch.image", "trainer image, e.g. REGISTRY/flashdraft-trainer:TAG (images/trainer)"),
    Flag("--nodes", "launch.nodes", "number of nodes (pods)", {"type": int}),
    Flag("--gpus-per-node", "launch.gpus_per_node", "GPUs per node; one training process per GPU", {"type": int}),
    Flag("--procs-per-node", "launch.procs_per_node", "processes per node for CPU-only runs (--gpus-per-node 0)",
         {"type": int}),
    Flag("--namespace", "launch.namespace", "default: the pipeline pod's or the kubeconfig context's namespace"),
    Flag("--name", "launch.name", "job name (default: flashdraft-train-<random>)"),
    Flag("--pvc", "launch.pvcs", "shared RWX volume (repeatable); the first holds checkpoints",
         {"action": "append", "metavar": "CLAIM:/PATH[:SUBPATH]"}),
    Flag("--output-dir", "launch.output_dir",
         "checkpoints and export (default: train.output_dir for local, <first PVC>/runs/<name> for a job); "
         "a relaunch with the same dir resumes"),
    Flag("--secret-env", "launch.secret_env", "env var from a Secret, e.g. HF_TOKEN=flashdraft-hf-token:HF_TOKEN",
         {"action": "append", "metavar": "ENV=SECRET:KEY"}),
    Flag("--env", "launch.env", "extra env var of the trainer (repeatable)", {"action": KeyValues, "metavar": "KEY=VALUE"}),
    Flag("--toleration", "launch.tolerations", "as in kubectl taint; without a value the operator is Exists",
         {"action": "append", "type": parse_toleration, "metavar": "KEY[=VALUE][:EFFECT]"}),
    Flag("--node-selector", "launch.node_selector", "node label the pods need (repeatable)",
         {"action": KeyValues, "metavar": "KEY=VALUE"}),
    Flag("--service-account", "launch.service_account", "service account of the training pods"),
    Flag("--image-pull-secret", "launch.image_pull_secrets", "Secret to pull the image with (repeatable)",
         {"action": "append", "metavar": "NAME"}),
    Flag("--cpu", "launch.cpu", "CPU request per node, e.g. 32"),
    Flag("--memory", "launch.memory", "memory request and limit per node, e.g. 512Gi"),
    Flag("--shm-size", "launch.shm_size", "size of the in-memory /dev/shm"),
    Flag("--gpu-resource", "launch.gpu_resource", "extended resource name of a GPU"),
    Flag("--backoff-limit", "launch.backoff_limit", "PyTorchJob restarts before failing", {"type": int}),
    Flag("--elastic-min-nodes", "launch.elastic_min_nodes", "PyTorchJob: run elastically between this and --nodes",
         {"type": int}),
    Flag("--runtime", "launch.runtime", "TrainJob: the ClusterTrainingRuntime (manifests/)"),
    Flag("--timeout", "launch.timeout_s", "seconds to wait for the job", {"type": float}),
    Flag("--poll-interval", "launch.poll_s", "seconds between status reads", {"type": float}),
    Flag("--cleanup", "launch.cleanup",
         "when to delete the job: on-success (a failed job is kept for inspection), always or never",
         {"choices": CLEANUP_POLICIES}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FLAGS)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the job manifest as YAML (local: the torchrun command) and start nothing")


def _ran(result: LaunchResult) -> str:
    job = result.job
    return f"{job.kind} {job.namespace}/{job.name}" if job else "torchrun"


def run(config: Config) -> LaunchResult:
    """Train where `config.launch` says, logged as the `launch` step (the trainer logs its own run)."""
    with step_run("launch", tracking_uri=config.tracking.uri, experiment=config.tracking.experiment) as tracker:
        tracker.log_config(config)
        result = launch_training(config)
        tracker.set_tags({"flashdraft.launched": _ran(result), "flashdraft.output_dir": result.output_dir})
        tracker.log_metrics({"launch_seconds": result.seconds})
    return result


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.dry_run:
        if config.launch.backend == "local":
            print(shlex.join(local_command(config)))
        else:
            sys.stdout.write(yaml.safe_dump(job_manifest(config), sort_keys=False))
        return 0
    result = run(config)
    print(f"{_ran(result)} succeeded in {result.seconds:.0f} s; output in {result.output_dir}")
    return 0
