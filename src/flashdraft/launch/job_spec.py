"""What to launch: one distributed training job on Kubernetes, described and validated before any API call.

A `LaunchSpec` holds everything the job manifests need (image, nodes, GPUs, volumes, env, scheduling).
`validate()` turns every mistake we can see offline into a `UserError` that names the fix, so a bad
launch fails on the user's machine instead of as a Pending pod an hour later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from flashdraft.errors import UserError

BACKENDS = ("pytorchjob", "trainjob")
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


@dataclass(kw_only=True)
class LaunchSpec:
    """One training job. Defaults describe a single-node, single-GPU run."""

    backend: str = "pytorchjob"
    image: str
    name: str
    namespace: str
    recipe: str | None = None
    overrides: list[str] = field(default_factory=list)
    nodes: int = 1
    gpus_per_node: int = 1
    procs_per_node: int | None = None  # only without GPUs (CPU smoke runs); with GPUs: one per GPU
    pvcs: list[PVCMount] = field(default_factory=list)
    output_dir: str | None = None  # default: <first PVC mount>/runs/<name>
    shm_size: str = "16Gi"
    cpu: str | None = None
    memory: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    secret_env: list[SecretEnv] = field(default_factory=list)
    tolerations: list[dict] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    gpu_resource: str = "nvidia.com/gpu"
    backoff_limit: int = 3  # PyTorchJob; a TrainJob's restarts are set by its runtime
    elastic_min_nodes: int | None = None  # PyTorchJob: elastic between this and `nodes`
    max_restarts: int = 3  # elastic rendezvous restarts
    runtime: str = "flashdraft-torch"  # TrainJob: the ClusterTrainingRuntime
    active_deadline_s: int | None = None

    @property
    def procs(self) -> int:
        return self.gpus_per_node if self.gpus_per_node > 0 else (self.procs_per_node or 1)

    @property
    def resolved_output_dir(self) -> str:
        if self.output_dir:
            return self.output_dir
        return str(PurePosixPath(self.pvcs[0].mount_path) / "runs" / self.name)

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
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
        if self.nodes < 1:
            raise UserError(f"--nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise UserError(f"--gpus-per-node must be >= 0, got {self.gpus_per_node}")
        if self.gpus_per_node == 0 and "cuda" in self.image.lower():
            raise UserError(
                f"image {self.image} is a CUDA image but --gpus-per-node is 0: the job would hold no GPU and "
                "train on CPU at a fraction of the speed; give --gpus-per-node >= 1 (or a CPU image for a smoke run)"
            )
        if self.procs_per_node is not None:
            if self.gpus_per_node > 0:
                raise UserError("--procs-per-node is only for CPU runs; with GPUs there is one process per GPU")
            if self.procs_per_node < 1:
                raise UserError(f"--procs-per-node must be >= 1, got {self.procs_per_node}")
        if self.elastic_min_nodes is not None:
            if self.backend != "pytorchjob":
                raise UserError(
                    "elastic training (--elastic-min-nodes) is a PyTorchJob feature; use --backend pytorchjob"
                )
            if not 1 <= self.elastic_min_nodes <= self.nodes:
                raise UserError(
                    f"--elastic-min-nodes must be between 1 and --nodes ({self.nodes}), got {self.elastic_min_nodes}"
                )
        if self.backoff_limit < 0 or self.max_restarts < 0:
            raise UserError("--backoff-limit and max restarts must be >= 0")
        if self.active_deadline_s is not None and self.active_deadline_s < 1:
            raise UserError(f"the job deadline must be >= 1 s, got {self.active_deadline_s}")
        for value, what in ((self.shm_size, "--shm-size"), (self.cpu, "--cpu"), (self.memory, "--memory")):
            if value is not None:
                check_quantity(value, what)

    def _validate_storage(self) -> None:
        if not self.pvcs:
            raise UserError(
                "no shared volume: give --pvc CLAIM:/mount/path (an RWX PersistentVolumeClaim such as "
                "flashdraft-data from manifests/): checkpoints live there so a restarted job resumes "
                "and every node sees the same files"
            )
        mounts = []
        for pvc in self.pvcs:
            check_dns_subdomain(pvc.claim, "PVC name")
            path = PurePosixPath(pvc.mount_path)
            if not path.is_absolute():
                raise UserError(f"PVC mount path {pvc.mount_path!r} must be absolute")
            if path in (PurePosixPath("/dev/shm"), PurePosixPath(SCRATCH)) or path in mounts:
                raise UserError(f"PVC mount path {pvc.mount_path} is used twice (or by /dev/shm, {SCRATCH})")
            mounts.append(path)
        out = PurePosixPath(self.resolved_output_dir)
        if not any(out == m or m in out.parents for m in mounts):
            raise UserError(
                f"output dir {out} is not on a mounted PVC ({', '.join(map(str, mounts))}): checkpoints there "
                "would vanish with the pod and a restarted job could not resume; put it under a --pvc mount"
            )

    def _validate_env(self) -> None:
        for name, value in self.env.items():
            if not isinstance(value, str):
                raise UserError(f"environment variable {name}={value!r}: values must be strings")
        if any(o.startswith("train.output_dir=") for o in self.overrides):
            raise UserError(
                "set the output dir with --output-dir (output_dir=), not train.output_dir: it must be on a PVC"
            )
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
        for name in self.image_pull_secrets:
            check_dns_subdomain(name, "image pull Secret name")

    def _validate_scheduling(self) -> None:
        if self.service_account is not None:
            check_dns_subdomain(self.service_account, "service account")
        check_dns_subdomain(self.runtime, "training runtime name")
        for toleration in self.tolerations:
            unknown = set(toleration) - TOLERATION_KEYS
            if unknown:
                raise UserError(
                    f"toleration {toleration}: unknown field(s) {sorted(unknown)}; valid: {sorted(TOLERATION_KEYS)}"
                )
            if toleration.get("operator", "Equal") not in TOLERATION_OPERATORS:
                raise UserError(f"toleration {toleration}: operator must be one of {sorted(TOLERATION_OPERATORS)}")
            if "effect" in toleration and toleration["effect"] not in TOLERATION_EFFECTS:
                raise UserError(f"toleration {toleration}: effect must be one of {sorted(TOLERATION_EFFECTS)}")
        for key, value in self.node_selector.items():
            if not key or not isinstance(value, str):
                raise UserError(f"node selector {key}={value!r}: expected KEY=VALUE strings")
