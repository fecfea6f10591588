"""The launcher against the kmock Kubernetes emulator (no real API server can run here).

kmock serves an in-memory Kubernetes API over HTTP from a background thread; the unmodified
`kubernetes` client talks to it. It runs no operator and no kubelet, so each test plays them: it
creates the pods the Training Operator / JobSet would create (with their real labels), sets their
statuses and the job's conditions, and emits events. kmock does not emulate pods/log (a GET of the
subresource returns the pod object), so the test registers a reaction on the `log` subresource that
serves each pod's lines as a kubelet does: RFC 3339 timestamps on request, `sinceSeconds` honoured. Its
follow streams end at once (a kubelet's stay open), which is what a dropped connection looks like.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading
import time
from datetime import datetime, timezone

import kmock
import pytest
from kubernetes import client

from flashdraft.config import load_config
from flashdraft.errors import UserError
from flashdraft.launch import kube, launch_training
from flashdraft.launch.watch import JobFailedError, JobStuckError, JobTimeoutError

IMAGE = "reg.example/flashdraft-trainer:0.1.0-cuda12.8"
PTJ = ("kubeflow.org", "v1", "pytorchjobs")
TJ = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
KINDS = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}
_ns = itertools.count()


class Emulator:
    """kmock's emulator and server on their own event loop thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(30), "kmock did not start"
        self.logs: dict[str, list[tuple[float, str]]] = {}  # pod -> its current container's lines
        self.log_params: list[dict] = []
        self.emu[kmock.subresource("log")] << self._serve_log

    def write(self, pod: str, *lines: str) -> None:
        for line in lines:
            self.logs.setdefault(pod, []).append((time.time(), line))
            time.sleep(0.001)  # distinct timestamps, as lines written apart have

    def restart(self, pod: str, *lines: str) -> None:
        """A new container: the kubelet serves only its log."""
        self.logs[pod] = []
        self.write(pod, *lines)

    def _serve_log(self, req) -> bytes:
        pod = req.url.path.split("/")[-2]
        self.log_params.append(dict(req.params))
        since = req.params.get("sinceSeconds")
        stamps = str(req.params.get("timestamps", "")).lower() == "true"
        now = time.time()
        out = []
        for ts, text in list(self.logs.get(pod, [])):
            if since is not None and ts < now - int(since):
                continue
            moment = datetime.fromtimestamp(ts, timezone.utc)
            fraction = f"{int(round(ts % 1 * 1e9)) % 1_000_000_000:09d}".rstrip("0")
            stamp = moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"
            out.append(f"{stamp} {text}\n" if stamps else f"{text}\n")
        return "".join(out).encode()

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start():
            self.emu = kmock.KubernetesEmulator()
            await self.emu.__aenter__()
            self.server = kmock.Server(self.emu)
            await self.server.__aenter__()
            for resource in (
                "kubeflow.org/v1/pytorchjobs",
                "trainer.kubeflow.org/v1alpha1/trainjobs",
                "v1/pods",
                "v1/events",
            ):
                self.emu.resources[resource] = {}

        self.loop.run_until_complete(start())
        started.set()
        self.loop.run_forever()

    def api(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = str(self.server.url)
        return client.ApiClient(cfg)

    def log_requests(self) -> int:
        return len(self.emu[kmock.subresource("log")])


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


@pytest.fixture
def namespace():
    return f"team-{next(_ns)}"


def wait_for(predicate, timeout=15.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Operator:
    """Plays the Training Operator / JobSet controller and the kubelet, in a background thread."""

    def __init__(self, emulator: Emulator, namespace: str, api_group=PTJ):
        api = emulator.api()
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.emulator, self.namespace, self.api_group = emulator, namespace, api_group
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def job(self) -> dict:
        group, version, plural = self.api_group
        items = self.custom.list_namespaced_custom_object(group, version, self.namespace, plural)["items"]
        return items[0] if items else None

    def wait_job(self) -> dict:
        return wait_for(self.job, what="the job to be created")

    def set_conditions(self, name: str, *types: str, message: str = "") -> None:
        group, version, plural = self.api_group
        conditions = [{"type": t, "status": "True", "reason": f"Job{t}", "message": message} for t in types]
        self.custom.patch_namespaced_custom_object(
            group, version, self.namespace, plural, name, {"status": {"conditions": conditions}}
        )

    def pod(self, name: str, labels: dict, container: str, status: dict) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": container, "image": IMAGE}]},
            "status": status,
        }
        self.core.create_namespaced_pod(self.namespace, body)

    def master(self, job: str, status: dict) -> None:
        """The PyTorchJob's Master pod (node rank 0, whose log the launcher streams)."""
        self.pod(f"{job}-master-0", master_labels(job), "pytorch", status)

    def pod_status(self, name: str, status: dict) -> None:
        self.core.patch_namespaced_pod(name, self.namespace, {"status": status})

    def event(self, involved: str, kind: str, reason: str, message: str) -> None:
        self.core.create_namespaced_event(
            self.namespace,
            {
                "metadata": {"name": f"{involved}.{reason.lower()}", "namespace": self.namespace},
                "involvedObject": {"kind": kind, "name": involved, "namespace": self.namespace},
                "type": "Warning",
                "reason": reason,
                "message": message,
            },
        )

    def run(self, script) -> Operator:
        """`script(operator, job_name)` once the launcher has created the job."""

        def target():
            try:
                script(self, self.wait_job()["metadata"]["name"])
            except BaseException as err:  # surfaced by the test after the launcher returns
                self.error = err

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join(15)
        if self.error:
            raise self.error


def master_labels(job: str, role: str = "master", index: int = 0) -> dict:
    return {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/replica-type": role,
        "training.kubeflow.org/replica-index": str(index),
    }


def container_status(phase: str, state: dict, *, container: str = "pytorch", ready: bool = False,
                     restarts: int = 0, last_state: dict | None = None) -> dict:
    """A pod status with one container in `state`, as the kubelet reports it."""
    status = {"name": container, "ready": ready, "restartCount": restarts, "image": IMAGE, "imageID": "",
              "state": state}
    if last_state is not None:
        status["lastState"] = last_state
    return {"phase": phase, "containerStatuses": [status]}


def running(container: str, restarts: int = 0) -> dict:
    return container_status("Running", {"running": {}}, container=container, ready=True, restarts=restarts)


def launch(emulator, namespace, **launch):
    values = dict(backend="pytorchjob", image=IMAGE, nodes=2, namespace=namespace, name="fd-job", timeout_s=15,
                  poll_s=0.1)
    values.update(launch)
    config = load_config("smollm2_135m", values={f"launch.{k}": v for k, v in values.items()})
    return launch_training(config, api_client=emulator.api())


def streamed(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "flashdraft.launch.job"]


# --- jobs that succeed: rank 0's log is streamed, the job deleted ----------------------------------
def restarted_master(op: Operator, name: str) -> None:
    emulator = op.emulator
    emulator.write(f"{name}-master-0", "step 1 loss 2.5", "step 2 loss 2.1")
    emulator.write(f"{name}-worker-0", "worker output is not streamed")
    op.set_conditions(name, "Created", "Running")
    before = emulator.log_requests()
    op.master(name, running("pytorch"))
    op.pod(f"{name}-worker-0", master_labels(name, "worker", 0), "pytorch", running("pytorch"))
    wait_for(lambda: emulator.log_requests() > before, what="the first log stream")
    # The container restarts (OnFailure): the trainer resumes and the launcher follows the new log.
    emulator.restart(f"{name}-master-0", "resumed from step 2", "step 3 loss 1.9")
    op.pod_status(f"{name}-master-0", running("pytorch", restarts=1))
    wait_for(lambda: emulator.log_requests() > before + 1, what="the second log stream")
    op.set_conditions(name, "Created", "Succeeded")


def dropped_stream(op: Operator, name: str) -> None:
    """A follow stream that ends while the container runs is reopened from its last timestamp."""
    emulator, pod = op.emulator, f"{name}-master-0"
    emulator.write(pod, "epoch 1", "epoch 2")
    before = len(emulator.log_params)
    op.master(name, running("pytorch"))
    wait_for(lambda: len(emulator.log_params) > before, what="the first log stream")
    emulator.write(pod, "epoch 3")  # written after the stream dropped
    wait_for(lambda: any("sinceSeconds" in p for p in emulator.log_params[before:]), what="the stream to be reopened")
    emulator.write(pod, "epoch 4")
    op.set_conditions(name, "Succeeded")


def trainjob_nodes(op: Operator, name: str) -> None:
    labels = {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "batch.kubernetes.io/job-completion-index": "0",
    }
    op.emulator.write(f"{name}-node-0-0-abcde", "trainjob rank 0 says hi")
    before = op.emulator.log_requests()
    op.pod(f"{name}-node-0-0-abcde", labels, "node", running("node"))
    op.pod(f"{name}-node-0-1-fghij", {**labels, "batch.kubernetes.io/job-completion-index": "1"}, "node", running("node"))
    wait_for(lambda: op.emulator.log_requests() > before, what="the log stream")
    op.set_conditions(name, "Complete")


@pytest.mark.parametrize(
    "backend, name, script, lines",
    [
        pytest.param("pytorchjob", "fd-job", restarted_master,
                     ["[fd-job-master-0] step 1 loss 2.5", "[fd-job-master-0] step 2 loss 2.1",
                      "[fd-job-master-0] resumed from step 2", "[fd-job-master-0] step 3 loss 1.9"],
                     id="pytorchjob-across-a-container-restart"),
        pytest.param("pytorchjob", "fd-drop", dropped_stream, [f"[fd-drop-master-0] epoch {i}" for i in (1, 2, 3, 4)],
                     id="dropped-stream-reopened-without-loss-or-repeats"),
        pytest.param("trainjob", "fd-tj", trainjob_nodes, ["[fd-tj-node-0-0-abcde] trainjob rank 0 says hi"],
                     id="trainjob"),
    ],
)
def test_success_streams_rank_0_log_and_deletes_the_job(emulator, namespace, caplog, backend, name, script, lines):
    caplog.set_level(logging.INFO)
    op = Operator(emulator, namespace, PTJ if backend == "pytorchjob" else TJ).run(script)
    result = launch(emulator, namespace, backend=backend, name=name)
    op.join()
    assert result.job.state == "succeeded" and result.job.kind == KINDS[backend]
    assert result.backend == backend and result.output_dir == f"/data/runs/{name}"
    assert streamed(caplog) == lines and result.job.log_lines == len(lines)
    assert op.job() is None  # cleanup on success


# --- jobs that fail, cannot start or time out: the error names the cause ---------------------------
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def oom_killed(op: Operator, name: str) -> None:
    op.master(name, container_status("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, restarts=3))
    op.set_conditions(name, "Created", "Failed",
                      message="PyTorchJob fd-job has failed because it has reached the specified backoff limit")


def crash_loop(op: Operator, name: str) -> None:
    op.master(name, container_status(
        "Running",
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        restarts=4,
        last_state={"terminated": {"exitCode": 1, "reason": "Error"}},
    ))
    time.sleep(0.3)
    op.set_conditions(name, "Failed")


def waiting_master(reason: str, message: str):
    def script(op: Operator, name: str) -> None:
        op.master(name, container_status("Pending", {"waiting": {"reason": reason, "message": message}}))

    return script


def unschedulable(op: Operator, name: str) -> None:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
    op.master(name, {"phase": "Pending", "conditions": [condition]})
    op.event(f"{name}-master-0", "Pod", "FailedScheduling", UNSCHEDULABLE)


def unknown_service_account(op: Operator, name: str) -> None:
    op.event(name, "PyTorchJob", "FailedCreatePod",
             f'Error creating: pods "{name}-master-0" is forbidden: error looking up service account '
             f'{op.namespace}/trainer: serviceaccount "trainer" not found')


def deleted_by_someone_else(op: Operator, name: str) -> None:
    op.custom.delete_namespaced_custom_object(*PTJ[:2], op.namespace, PTJ[2], name)


@pytest.mark.parametrize(
    "script, settings, error, texts, kept",
    [
        pytest.param(oom_killed, {}, JobFailedError,
                     ["PyTorchJob fd-job failed", "backoff limit", "fd-job-master-0", "exited with code 137 (OOMKilled)",
                      "--memory"],
                     True, id="failure-names-the-pod-reason-and-keeps-the-job"),
        pytest.param(crash_loop, {"cleanup": "always"}, JobFailedError,
                     ["CrashLoopBackOff after 4 restarts", "exited with code 1 (Error)"],
                     False, id="crashloop-exit-code-cleanup-always"),
        pytest.param(waiting_master("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'), {"timeout_s": 60},
                     JobStuckError, ["ImagePullBackOff", "image name and tag"],
                     False, id="image-pull-backoff-fails-fast-and-frees-the-gpus"),
        pytest.param(waiting_master("CreateContainerConfigError", 'secret "flashdraft-hf-token" not found'),
                     {"secret_env": ["HF_TOKEN=flashdraft-hf-token:HF_TOKEN"]}, JobStuckError,
                     ['secret "flashdraft-hf-token" not found', "secrets.template.yaml"],
                     False, id="missing-secret-is-named"),
        pytest.param(unschedulable, {"timeout_s": 1}, JobTimeoutError,
                     ["did not finish within 1 s", f"Unschedulable: {UNSCHEDULABLE}", "free GPUs",
                      f"event fd-job-master-0: FailedScheduling: {UNSCHEDULABLE}"],
                     False, id="timeout-reports-unschedulable-pods-and-deletes"),
        pytest.param(unknown_service_account, {"service_account": "trainer"}, JobStuckError,
                     ['serviceaccount "trainer" not found', "--service-account"],
                     False, id="unknown-service-account-from-operator-events"),
        pytest.param(deleted_by_someone_else, {}, JobFailedError, ["was deleted while we watched it"],
                     False, id="job-deleted-externally"),
    ],
)
def test_failure_is_explained(emulator, namespace, script, settings, error, texts, kept):
    op = Operator(emulator, namespace).run(script)
    start = time.monotonic()
    with pytest.raises(error) as err:
        launch(emulator, namespace, **settings)
    op.join()
    # A job that cannot start would hold its GPUs waiting forever: the launcher gives up at once.
    assert time.monotonic() - start < 10
    for text in texts:
        assert text in str(err.value)
    # Kept for inspection only when it ran and failed (cleanup on-success); a stuck or running job is deleted.
    assert (op.job() is not None) == kept


# --- ownership, API errors, the command line -------------------------------------------------------
def test_owner_reference_from_kfp_env(emulator, namespace, monkeypatch):
    monkeypatch.setenv("KFP_POD_NAME", "dflash-pipeline-train-123")
    monkeypatch.setenv("KFP_POD_UID", "4f1c-uid")
    monkeypatch.setenv("KFP_NAMESPACE", namespace)
    seen = {}

    def script(op: Operator, name: str):
        seen.update(op.job())
        op.set_conditions(name, "Succeeded")

    op = Operator(emulator, namespace).run(script)
    launch(emulator, namespace, cleanup="never")
    op.join()
    # the launcher's timeout, enforced by the cluster too
    assert seen["spec"]["runPolicy"]["activeDeadlineSeconds"] == 15
    assert seen["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "dflash-pipeline-train-123", "uid": "4f1c-uid"}
    ]
    assert op.job() is not None  # cleanup=never keeps it; the owner's deletion will collect it


def test_owner_reference_in_cluster_reads_the_pod_uid(emulator, namespace, monkeypatch, tmp_path):
    """Inside a pod without KFP's variables: the hostname is the pod name, the uid comes from the API."""
    import socket

    for var in ("KFP_POD_NAME", "KFP_POD_UID", "KFP_NAMESPACE", "POD_NAME", "POD_UID", "POD_NAMESPACE"):
        monkeypatch.delenv(var, raising=False)
    ns_file = tmp_path / "namespace"
    ns_file.write_text(namespace)
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_NAMESPACE", ns_file)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    op = Operator(emulator, namespace)
    op.pod(socket.gethostname(), {}, "main", {"phase": "Running"})
    owner = kube.pipeline_pod_owner(op.core, namespace)
    assert owner == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": socket.gethostname(),
        "uid": f"uid-{socket.gethostname()}",
    }
    assert kube.default_namespace() == namespace
    # A job in another namespace cannot be owned by this pod.
    assert kube.pipeline_pod_owner(op.core, "elsewhere") is None


@pytest.mark.parametrize(
    "backend, resource, status, message, expected",
    [
        pytest.param("pytorchjob", "kubeflow.org/v1/pytorchjobs", 403,
                     'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:{ns}:pipeline-runner" '
                     'cannot create resource "pytorchjobs"',
                     ["manifests/"], id="forbidden-names-the-rbac-fix"),
        pytest.param("pytorchjob", None, 404, 'namespaces "{ns}" not found', ["namespace '{ns}' does not exist"],
                     id="missing-namespace"),
        pytest.param("trainjob", "trainer.kubeflow.org/v1alpha1/trainjobs", 404,
                     "the server could not find the requested resource",
                     [r"does not serve TrainJob .* install Kubeflow Trainer"], id="missing-crd"),
    ],
)
def test_api_errors_are_clear(emulator, namespace, backend, resource, status, message, expected):
    criteria = ("post", kmock.namespace(namespace), *([kmock.resource(resource)] if resource else []))
    reason = {403: "Forbidden", 404: "NotFound"}[status]
    emulator.emu[criteria] << kmock.KubernetesError(status=status, reason=reason, message=message.format(ns=namespace))
    with pytest.raises(UserError) as err:
        launch(emulator, namespace, backend=backend)
    assert message.format(ns=namespace) in str(err.value)  # the API server's own words
    for pattern in expected:
        assert re.search(pattern.format(ns=namespace), str(err.value))


def test_name_clash_is_clear(emulator, namespace):
    op = Operator(emulator, namespace)
    op.custom.create_namespaced_custom_object(
        *PTJ[:2], namespace, PTJ[2], {"metadata": {"name": "fd-job", "namespace": namespace}}
    )
    with pytest.raises(UserError, match="already exists .* choose another --name"):
        launch(emulator, namespace)


def test_cli_against_the_emulator(emulator, namespace, tmp_path, monkeypatch, capsys):
    """`flashdraft launch` end to end through a kubeconfig that points at the emulator."""
    from flashdraft.cli import main

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{emulator.server.url}'}}}}]\n"
        f"contexts: [{{name: kmock, context: {{cluster: kmock, user: u, namespace: {namespace}}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    for var in ("KFP_POD_NAME", "KFP_POD_UID", "KFP_NAMESPACE", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)

    def script(op: Operator, name: str):
        op.master(name, container_status(
            "Failed",
            {"terminated": {"exitCode": 2, "reason": "Error", "message": "flashdraft train: error: unknown recipe"}},
        ))
        op.set_conditions(name, "Failed")

    op = Operator(emulator, namespace).run(script)
    code = main(["launch", "--backend", "pytorchjob", "--image", IMAGE, "--config", "smollm2_135m", "--name", "fd-cli",
                 "--timeout", "15", "--poll-interval", "0.1"])
    op.join()
    assert code == 2
    err = capsys.readouterr().err
    assert "flashdraft launch: error: PyTorchJob fd-cli failed" in err and "exited with code 2" in err
