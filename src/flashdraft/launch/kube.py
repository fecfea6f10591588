"""The Kubernetes side of launching: credentials, namespace, the pipeline pod as owner, API errors as clear messages."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from flashdraft.errors import UserError

log = logging.getLogger(__name__)

# Mounted into every pod by Kubernetes: the namespace of the pod's service account.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
RBAC_FIX = (
    "apply the Role and RoleBinding in manifests/ (kubectl apply -k manifests/overlays/dev) "
    "for the service account that launches"
)


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_NAMESPACE.is_file()


def api_client():
    """An ApiClient from the in-cluster service account, else from the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    from kubernetes import client, config

    try:
        if in_cluster():
            config.load_incluster_config()
        else:
            # Read KUBECONFIG now: the client library reads it once, at import.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    except config.ConfigException as err:
        raise UserError(
            f"no Kubernetes credentials ({err}): set KUBECONFIG or run inside a cluster; "
            "use --dry-run to print the manifest without a cluster"
        ) from err
    return client.ApiClient()


def default_namespace() -> str:
    """The pipeline pod's namespace, else the kubeconfig context's, else "default"."""
    for var in ("KFP_NAMESPACE", "POD_NAMESPACE"):
        if os.environ.get(var):
            return os.environ[var]
    if in_cluster():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    try:
        from kubernetes import config

        _, context = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG"))
        return (context or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # no kubeconfig: a dry run or an error later names the real problem
        return "default"


def pipeline_pod_owner(core, namespace: str) -> dict | None:
    """An ownerReference to the pod running this launcher (a KFP step), so deleting the run deletes the job.

    KFP executor pods carry KFP_POD_NAME / KFP_POD_UID / KFP_NAMESPACE; other pods can expose
    POD_NAME / POD_UID / POD_NAMESPACE through the downward API; without them, inside a cluster the
    hostname is the pod name and the UID is read from the API.
    """
    name = os.environ.get("KFP_POD_NAME") or os.environ.get("POD_NAME")
    uid = os.environ.get("KFP_POD_UID") or os.environ.get("POD_UID")
    pod_namespace = os.environ.get("KFP_NAMESPACE") or os.environ.get("POD_NAMESPACE")
    if in_cluster():
        name = name or socket.gethostname()
        pod_namespace = pod_namespace or SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    if not name:
        return None
    if pod_namespace and pod_namespace != namespace:
        log.warning(
            "not owning the job by pod %s: it runs in namespace %s, the job in %s (owners must share a namespace)",
            name,
            pod_namespace,
            namespace,
        )
        return None
    if not uid:
        from kubernetes.client import ApiException

        try:
            uid = core.read_namespaced_pod(name, namespace).metadata.uid
        except ApiException as err:
            log.warning("not owning the job by pod %s: cannot read it (%s %s)", name, err.status, err.reason)
            return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def api_message(err) -> str:
    """The API server's own message from an ApiException (its body is a Status object)."""
    try:
        return json.loads(err.body).get("message") or str(err.reason)
    except (TypeError, ValueError, AttributeError):
        return str(err.reason)


def create_error(err, kind: str, name: str, namespace: str) -> UserError:
    """An ApiException from creating a job -> a message that names the fix."""
    message = api_message(err)
    if err.status == 404 and "namespace" in message.lower():
        return UserError(f"namespace {namespace!r} does not exist ({message}): create it or pass --namespace")
    if err.status == 404:
        operator = "the Kubeflow Training Operator (v1)" if kind == "PyTorchJob" else "Kubeflow Trainer (v2)"
        return UserError(
            f"the cluster does not serve {kind} ({message}): install {operator}, or choose the other --backend"
        )
    if err.status == 401:
        return UserError(f"the API server did not accept our credentials ({message}): refresh your kubeconfig")
    if err.status == 403:
        return UserError(f"not allowed to create {kind} {name!r} in namespace {namespace!r}: {message}; {RBAC_FIX}")
    if err.status == 409:
        return UserError(
            f"a {kind} named {name!r} already exists in namespace {namespace!r}: choose another --name "
            f"or delete it (kubectl delete {kind.lower()} {name} -n {namespace})"
        )
    if err.status == 422:
        return UserError(f"the API server rejected the {kind} manifest: {message}")
    return UserError(f"creating {kind} {name!r} failed: HTTP {err.status} {message}")


def read_error(err, what: str, namespace: str) -> UserError:
    """An ApiException while watching -> a message; 403 names the missing permission's fix."""
    message = api_message(err)
    if err.status == 403:
        return UserError(f"not allowed to read {what} in namespace {namespace!r}: {message}; {RBAC_FIX}")
    return UserError(f"reading {what} in namespace {namespace!r} failed: HTTP {err.status} {message}")
