"""What to launch: one distributed training job on Kubernetes, described and validated before any API call.

A `LaunchSpec` holds everything the job manifests need (image, nodes, GPUs, volumes, env, scheduling).
Building one turns every mistake we can see offline into a `UserError` that names the fix, so a bad
launch fails on the user's machine instead of as a Pending pod an hour later.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import PurePosixPath

from flashdraft.config import Config, LaunchConfig, redact
from flashdraft.errors import UserError
from flashdraft.launch.arguments import OUTPUT_DIR_KEYS, changed_values, command_arguments
from flashdraft.launch.kube import default_namespace

# Tracking settings of the launching process that the job's trainer needs to log into the same MLflow
# run tree (FLASHDRAFT_PARENT_RUN_ID: the pipeline's parent run, tracking/runs.py).
PROPAGATED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "FLASHDRAFT_PARENT_RUN_ID")
KUBERNETES_BACKENDS = ("pytorchjob", "trainjob")
# Variables the Training Operator / Trainer inject; a user value would fight the operator's.
RESERVED_ENV = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE"}
)
# Pod names add "-worker-<i>" (PyTorchJob) or "-node-0-<i>-xxxxx" (TrainJob/JobSet) to the job name
# and must stay within 63 characters.
MAX_NAME = 40
SCRATCH = "/scratch"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
TOLERATION_OPERATORS = {"Exists", "Equal"}
TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


def check_dns_subdomain(value: str, what: str) -> None:
    if not value or len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise UserError(
            f"{what} {value!r} is not a valid Kubernetes name: use lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )


def check_quantity(value: str, what: str) -> None:
    if not _QUANTITY.match(value):
        raise UserError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 16Gi, 500Mi, 8, 250m)")


@dataclass(frozen=True)
class PVCMount:
    """A PersistentVolumeClaim mounted into every training pod."""

    claim: str
    mount_path: str
    sub_path: str | None = None

    @classmethod
    def parse(cls, text: str) -> PVCMount:
        """`claim:/mount/path[:sub/path]`."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not all(parts):
            raise UserError(f"--pvc {text!r}: expected CLAIM:/mount/path or CLAIM:/mount/path:sub/path")
        return cls(*parts)


@dataclass(frozen=True)
class SecretEnv:
    """An environment variable read from one key of a Secret (HF_TOKEN, MLflow credentials)."""

    env: str
    secret: str
    key: str

    @classmethod
    def parse(cls, text: str) -> SecretEnv:
        """`ENV=secret-name:key`."""
        env, sep, ref = text.partition("=")
        secret, sep2, key = ref.partition(":")
        if not (sep and sep2 and env and secret and key):
            raise UserError(
                f"--secret-env {text!r}: expected ENV=SECRET:KEY, e.g. HF_TOKEN=flashdraft-hf-token:HF_TOKEN "
                "(the Secret's name and the key inside it)"
            )
        return cls(env, secret, key)


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """One training job on Kubernetes: the `launch` section (sizes, resources, scheduling, watching) with
    its defaults resolved and its text parsed, and the trainer's arguments. Validated when built."""

    launch: LaunchConfig
    name: str
    namespace: str
    image: str
    pvcs: list[PVCMount]
    secret_env: list[SecretEnv]
    env: dict[str, str]  # launch.env and the launching process's tracking variables
    output_dir: str  # checkpoints and export, on a PVC
    command_args: list[str]  # each pod's `flashdraft train` (or `warmup`) command and arguments

    def __post_init__(self) -> None:
        self._validate_name_and_image()
        self._validate_sizes()
        self._validate_storage()
        self._validate_env()
        self._validate_scheduling()

    def _validate_name_and_image(self) -> None:
        if len(self.name) > MAX_NAME or not _DNS_LABEL.match(self.name):
            raise UserError(
                f"job name {self.name!r} must be at most {MAX_NAME} lower-case letters, digits or '-' "
                "(pod names append replica suffixes to it)"
            )
        if not _DNS_LABEL.match(self.namespace):
            raise UserError(f"namespace {self.namespace!r} is not a valid namespace name")
        if not self.image or any(c.isspace() for c in self.image):
            raise UserError(f"image {self.image!r} is not a container image reference (registry/name:tag)")

    def _validate_sizes(self) -> None:
        launch = self.launch
        if launch.gpus_per_node == 0 and "cuda" in self.image.lower():
            raise UserError(
                f"image {self.image} is a CUDA image but --gpus-per-node is 0: the job would hold no GPU and "
                "train on CPU at a fraction of the speed; give --gpus-per-node >= 1 (or a CPU image for a smoke run)"
            )
        if launch.elastic_min_nodes is not None:
            if launch.backend != "pytorchjob":
                raise UserError(
                    "elastic training (--elastic-min-nodes) is a PyTorchJob feature; use --backend pytorchjob"
                )
            if not 1 <= launch.elastic_min_nodes <= launch.nodes:
                raise UserError(
                    f"--elastic-min-nodes must be between 1 and --nodes ({launch.nodes}), got {launch.elastic_min_nodes}"
                )
        for value, what in ((launch.shm_size, "--shm-size"), (launch.cpu, "--cpu"), (launch.memory, "--memory")):
            if value is not None:
                check_quantity(value, what)

    def _validate_storage(self) -> None:
        mounts = []
        for pvc in self.pvcs:
            check_dns_subdomain(pvc.claim, "PVC name")
            path = PurePosixPath(pvc.mount_path)
            if not path.is_absolute():
                raise UserError(f"PVC mount path {pvc.mount_path!r} must be absolute")
            if path in (PurePosixPath("/dev/shm"), PurePosixPath(SCRATCH)) or path in mounts:
                raise UserError(f"PVC mount path {pvc.mount_path} is used twice (or by /dev/shm, {SCRATCH})")
            mounts.append(path)
        out = PurePosixPath(self.output_dir)
        if not any(out == m or m in out.parents for m in mounts):
            raise UserError(
                f"output dir {out} is not on a mounted PVC ({', '.join(map(str, mounts))}): checkpoints there "
                "would vanish with the pod and a restarted job could not resume; put it under a --pvc mount"
            )

    def _validate_env(self) -> None:
        for name in list(self.env) + [s.env for s in self.secret_env]:
            if not _ENV_NAME.match(name):
                raise UserError(f"environment variable name {name!r} is not valid (letters, digits, '_')")
            if name in RESERVED_ENV or name.startswith("PET_"):
                raise UserError(f"{name} is set by the training operator for each pod; do not set it yourself")
        for secret in self.secret_env:
            check_dns_subdomain(secret.secret, f"Secret name for {secret.env}")
            if not _SECRET_KEY.match(secret.key):
                raise UserError(
                    f"Secret key {secret.key!r} for {secret.env} is not valid (letters, digits, '-', '_', '.')"
                )
        for name in self.launch.image_pull_secrets:
            check_dns_subdomain(name, "image pull Secret name")

    def _validate_scheduling(self) -> None:
        launch = self.launch
        if launch.service_account is not None:
            check_dns_subdomain(launch.service_account, "service account")
        check_dns_subdomain(launch.runtime, "training runtime name")
        for toleration in launch.tolerations:
            unknown = set(toleration) - TOLERATION_KEYS
            if unknown:
                raise UserError(
                    f"toleration {toleration}: unknown field(s) {sorted(unknown)}; valid: {sorted(TOLERATION_KEYS)}"
                )
            if toleration.get("operator", "Equal") not in TOLERATION_OPERATORS:
                raise UserError(f"toleration {toleration}: operator must be one of {sorted(TOLERATION_OPERATORS)}")
            if "effect" in toleration and toleration["effect"] not in TOLERATION_EFFECTS:
                raise UserError(f"toleration {toleration}: effect must be one of {sorted(TOLERATION_EFFECTS)}")
        if "" in launch.node_selector:
            raise UserError(f"node selector {launch.node_selector}: every label needs a key")


def job_spec(config: Config) -> LaunchSpec:
    """The Kubernetes job that trains with `config`, resolved and validated without a cluster."""
    launch = config.launch
    if launch.backend not in KUBERNETES_BACKENDS:
        raise UserError(f"launch.backend is {launch.backend!r}, not a Kubernetes job: use pytorchjob or trainjob")
    if not launch.image:
        raise UserError(
            "launch.image is not set; give the trainer image with --image or launch.image=..., "
            "e.g. REGISTRY/flashdraft-trainer:TAG (images/trainer)"
        )
    if not launch.pvcs:
        raise UserError(
            "no shared volume: give --pvc CLAIM:/mount/path (an RWX PersistentVolumeClaim such as "
            "flashdraft-data from manifests/): checkpoints live there so a restarted job resumes "
            "and every node sees the same files"
        )
    output_key = OUTPUT_DIR_KEYS[launch.command]
    if output_key in changed_values(config, config.recipe):
        raise UserError(
            f"set the output dir with --output-dir (launch.output_dir=), not {output_key}: it must be on a PVC"
        )
    env = {**{k: os.environ[k] for k in PROPAGATED_ENV if os.environ.get(k)}, **launch.env}
    for where, value in (("tracking.uri", config.tracking.uri), *((f"the env {k}", v) for k, v in env.items())):
        if value and redact(value) != value:
            raise UserError(f"{where} holds a password: it would be written into the job's manifest for anyone "
                            "who can read it; give credentials through a Secret instead (--secret-env "
                            "MLFLOW_TRACKING_PASSWORD=flashdraft-mlflow-auth:MLFLOW_TRACKING_PASSWORD)")
    name = launch.name or f"flashdraft-train-{uuid.uuid4().hex[:8]}"
    pvcs = [PVCMount.parse(text) for text in launch.pvcs]
    output_dir = launch.output_dir or str(PurePosixPath(pvcs[0].mount_path) / "runs" / name)
    return LaunchSpec(
        launch=launch,
        name=name,
        namespace=launch.namespace or default_namespace(),
        image=launch.image,
        pvcs=pvcs,
        secret_env=[SecretEnv.parse(text) for text in launch.secret_env],
        env=env,
        output_dir=output_dir,
        command_args=command_arguments(config, output_dir, portable=True),
    )
