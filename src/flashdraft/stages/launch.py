"""`flashdraft launch`: run `flashdraft train` as a PyTorchJob or TrainJob on a Kubernetes cluster.

    flashdraft launch --backend pytorchjob --config nemotron_nano30b --nodes 2 --gpus-per-node 8 \\
        --image REGISTRY/flashdraft-trainer:TAG --pvc flashdraft-data:/data train.max_steps=1000
"""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

from flashdraft.errors import UserError
from flashdraft.launch.job_spec import BACKENDS
from flashdraft.launch.watch import CLEANUP_POLICIES

log = logging.getLogger(__name__)


def parse_toleration(text: str) -> dict:
    """`KEY[=VALUE][:EFFECT]` as in `kubectl taint`; without a value the operator is Exists."""
    rest, _, effect = text.partition(":")
    key, sep, value = rest.partition("=")
    if not key:
        raise UserError(f"--toleration {text!r}: expected KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule")
    toleration = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides passed to flashdraft train")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="pytorchjob",
        help="PyTorchJob (Training Operator v1) or TrainJob (Trainer v2)",
    )
    parser.add_argument("--config", dest="recipe", help="recipe name or YAML file (a local file travels as overrides)")
    parser.add_argument(
        "--image", required=True, help="trainer image, e.g. REGISTRY/flashdraft-trainer:TAG (images/trainer)"
    )
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes (pods)")
    parser.add_argument("--gpus-per-node", type=int, default=1, help="GPUs per node; one training process per GPU")
    parser.add_argument("--procs-per-node", type=int, help="processes per node for CPU-only runs (--gpus-per-node 0)")
    parser.add_argument("--namespace", help="default: the pipeline pod's or the kubeconfig context's namespace")
    parser.add_argument("--name", help="job name (default: flashdraft-train-<random>)")
    parser.add_argument(
        "--pvc",
        action="append",
        default=None,
        metavar="CLAIM:/PATH[:SUBPATH]",
        help="shared RWX volume(s); the first holds checkpoints (default flashdraft-data:/data)",
    )
    parser.add_argument(
        "--output-dir",
        help="checkpoint/export dir on a PVC (default <first PVC>/runs/<name>); a relaunch with the same dir resumes",
    )
    parser.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="ENV=SECRET:KEY",
        help="env var from a Secret, e.g. HF_TOKEN=flashdraft-hf-token:HF_TOKEN",
    )
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra env var")
    parser.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]")
    parser.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--service-account", help="service account of the training pods")
    parser.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME")
    parser.add_argument("--cpu", help="CPU request per node, e.g. 32")
    parser.add_argument("--memory", help="memory request and limit per node, e.g. 512Gi")
    parser.add_argument("--shm-size", default="16Gi", help="size of the in-memory /dev/shm")
    parser.add_argument("--gpu-resource", default="nvidia.com/gpu", help="extended resource name of a GPU")
    parser.add_argument("--backoff-limit", type=int, default=3, help="PyTorchJob restarts before failing")
    parser.add_argument("--elastic-min-nodes", type=int, help="PyTorchJob: run elastically between this and --nodes")
    parser.add_argument(
        "--runtime", default="flashdraft-torch", help="TrainJob: the ClusterTrainingRuntime (manifests/)"
    )
    parser.add_argument("--timeout", type=float, default=7 * 24 * 3600, help="seconds to wait for the job")
    parser.add_argument("--poll-interval", type=float, default=10.0, help="seconds between status reads")
    parser.add_argument(
        "--cleanup",
        choices=CLEANUP_POLICIES,
        default="on-success",
        help="delete the job after it ends (failed jobs are kept for inspection with on-success)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the job manifest as YAML and create nothing")


def main(args: argparse.Namespace) -> int:
    from flashdraft.launch import job_manifest, launch_training, make_spec

    spec_args = dict(
        image=args.image,
        recipe=args.recipe,
        overrides=args.overrides,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        procs_per_node=args.procs_per_node,
        namespace=args.namespace,
        name=args.name,
        pvcs=args.pvc or ["flashdraft-data:/data"],
        output_dir=args.output_dir,
        secret_env=args.secret_env,
        env=_pairs(args.env, "--env"),
        tolerations=[parse_toleration(t) for t in args.toleration],
        node_selector=_pairs(args.node_selector, "--node-selector"),
        service_account=args.service_account,
        image_pull_secrets=args.image_pull_secret,
        cpu=args.cpu,
        memory=args.memory,
        shm_size=args.shm_size,
        gpu_resource=args.gpu_resource,
        backoff_limit=args.backoff_limit,
        elastic_min_nodes=args.elastic_min_nodes,
        runtime=args.runtime,
    )
    if args.dry_run:
        spec = make_spec(launcher=args.backend, **spec_args)
        sys.stdout.write(yaml.safe_dump(job_manifest(spec), sort_keys=False))
        return 0
    result = launch_training(
        launcher=args.backend, timeout_s=args.timeout, cleanup=args.cleanup, poll_s=args.poll_interval, **spec_args
    )
    log.info(
        "%s %s/%s succeeded in %.0f s; output in %s",
        result.kind,
        result.namespace,
        result.name,
        result.seconds,
        result.output_dir,
    )
    return 0
