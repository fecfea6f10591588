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
import threading
import time
from datetime import datetime, timezone

import kmock
import pytest
from kubernetes import client

from flashdraft.errors import UserError
from flashdraft.launch import (
    JobFailedError,
    JobStuckError,
    JobTimeoutError,
    kube,
    launch_training,
)

IMAGE = "reg.example/flashdraft-trainer:0.1.0-cuda12.8"
PTJ = ("kubeflow.org", "v1", "pytorchjobs")
TJ = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
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
        def target():
            try:
                script(self)
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


def launch(emulator, namespace, **kw):
    args = dict(
        launcher="pytorchjob",
        image=IMAGE,
        recipe="smollm2_135m",
        nodes=2,
        gpus_per_node=1,
        pvcs=["flashdraft-data:/data"],
        namespace=namespace,
        name="fd-job",
        timeout_s=15,
        poll_s=0.05,
        api_client=emulator.api(),
    )
    args.update(kw)
    return launch_training(**args)


def test_success_streams_master_log_across_a_restart_and_deletes_the_job(emulator, namespace, caplog):
    def script(op: Operator):
        job = op.wait_job()
        name = job["metadata"]["name"]
        emulator.write(f"{name}-master-0", "step 1 loss 2.5", "step 2 loss 2.1")
        emulator.write(f"{name}-worker-0", "worker output is not streamed")
        op.set_conditions(name, "Created", "Running")
        before = emulator.log_requests()
        op.pod(f"{name}-master-0", master_labels(name), "pytorch", running("pytorch"))
        op.pod(f"{name}-worker-0", master_labels(name, "worker", 0), "pytorch", running("pytorch"))
        wait_for(lambda: emulator.log_requests() > before, what="the first log stream")
        # The container restarts (OnFailure): the trainer resumes and the launcher follows the new log.
        emulator.restart(f"{name}-master-0", "resumed from step 2", "step 3 loss 1.9")
        op.pod_status(f"{name}-master-0", running("pytorch", restarts=1))
        wait_for(lambda: emulator.log_requests() > before + 1, what="the second log stream")
        op.set_conditions(name, "Created", "Succeeded")

    caplog.set_level(logging.INFO)
    op = Operator(emulator, namespace).run(script)
    result = launch(emulator, namespace)
    op.join()
    assert result.state == "succeeded" and result.kind == "PyTorchJob"
    assert result.output_dir == "/data/runs/fd-job"
    streamed = [r.getMessage() for r in caplog.records if r.name == "flashdraft.launch.job"]
    assert streamed == [
        "[fd-job-master-0] step 1 loss 2.5",
        "[fd-job-master-0] step 2 loss 2.1",
        "[fd-job-master-0] resumed from step 2",
        "[fd-job-master-0] step 3 loss 1.9",
    ]
    assert result.log_lines == 4
    assert op.job() is None  # cleanup on success


def test_dropped_log_stream_is_reopened_without_loss_or_repeats(emulator, namespace, caplog):
    """A follow stream that ends while the container runs is reopened from its last timestamp."""

    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        pod = f"{name}-master-0"
        emulator.write(pod, "epoch 1", "epoch 2")
        before = len(emulator.log_params)
        op.pod(pod, master_labels(name), "pytorch", running("pytorch"))
        wait_for(lambda: len(emulator.log_params) > before, what="the first log stream")
        emulator.write(pod, "epoch 3")  # written after the stream dropped
        wait_for(
            lambda: any("sinceSeconds" in p for p in emulator.log_params[before:]), what="the stream to be reopened"
        )
        emulator.write(pod, "epoch 4")
        op.set_conditions(name, "Succeeded")

    caplog.set_level(logging.INFO)
    op = Operator(emulator, namespace).run(script)
    result = launch(emulator, namespace, name="fd-drop")
    op.join()
    streamed = [r.getMessage() for r in caplog.records if r.name == "flashdraft.launch.job"]
    assert streamed == [f"[fd-drop-master-0] epoch {i}" for i in (1, 2, 3, 4)]
    assert result.log_lines == 4


def test_trainjob_success(emulator, namespace, caplog):
    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        labels = {
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "batch.kubernetes.io/job-completion-index": "0",
        }
        emulator.write(f"{name}-node-0-0-abcde", "trainjob rank 0 says hi")
        before = emulator.log_requests()
        op.pod(f"{name}-node-0-0-abcde", labels, "node", running("node"))
        op.pod(
            f"{name}-node-0-1-fghij",
            {**labels, "batch.kubernetes.io/job-completion-index": "1"},
            "node",
            running("node"),
        )
        wait_for(lambda: emulator.log_requests() > before, what="the log stream")
        op.set_conditions(name, "Complete")

    caplog.set_level(logging.INFO)
    op = Operator(emulator, namespace, TJ).run(script)
    result = launch(emulator, namespace, launcher="trainjob", name="fd-tj")
    op.join()
    assert result.state == "succeeded" and result.kind == "TrainJob"
    assert "[fd-tj-node-0-0-abcde] trainjob rank 0 says hi" in [r.getMessage() for r in caplog.records]


def test_failure_names_the_pod_reason_and_keeps_the_job(emulator, namespace):
    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.pod(
            f"{name}-master-0",
            master_labels(name),
            "pytorch",
            container_status("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, restarts=3),
        )
        op.set_conditions(
            name,
            "Created",
            "Failed",
            message="PyTorchJob fd-job has failed because it has reached the specified backoff limit",
        )

    op = Operator(emulator, namespace).run(script)
    with pytest.raises(JobFailedError) as err:
        launch(emulator, namespace)
    op.join()
    text = str(err.value)
    assert "PyTorchJob fd-job failed" in text and "backoff limit" in text
    assert "fd-job-master-0" in text and "exited with code 137 (OOMKilled)" in text and "--memory" in text
    assert op.job() is not None  # kept for inspection (cleanup=on-success)


def test_crashloop_exit_code_in_failure(emulator, namespace):
    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.pod(
            f"{name}-master-0",
            master_labels(name),
            "pytorch",
            container_status(
                "Running",
                {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
                restarts=4,
                last_state={"terminated": {"exitCode": 1, "reason": "Error"}},
            ),
        )
        time.sleep(0.3)
        op.set_conditions(name, "Failed")

    op = Operator(emulator, namespace).run(script)
    with pytest.raises(JobFailedError) as err:
        launch(emulator, namespace, cleanup="always")
    op.join()
    assert "CrashLoopBackOff after 4 restarts" in str(err.value) and "exited with code 1 (Error)" in str(err.value)
    assert op.job() is None  # cleanup=always


def test_image_pull_backoff_fails_fast_and_frees_the_gpus(emulator, namespace):
    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.pod(
            f"{name}-master-0",
            master_labels(name),
            "pytorch",
            container_status(
                "Pending",
                {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}},
            ),
        )

    op = Operator(emulator, namespace).run(script)
    start = time.monotonic()
    with pytest.raises(JobStuckError) as err:
        launch(emulator, namespace, timeout_s=60)
    op.join()
    assert time.monotonic() - start < 10
    assert "ImagePullBackOff" in str(err.value) and "image name and tag" in str(err.value)
    assert op.job() is None  # a stuck job still holds its GPUs: deleted


def test_missing_secret_is_named(emulator, namespace):
    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.pod(
            f"{name}-master-0",
            master_labels(name),
            "pytorch",
            container_status(
                "Pending",
                {"waiting": {"reason": "CreateContainerConfigError",
                             "message": 'secret "flashdraft-hf-token" not found'}},
            ),
        )

    op = Operator(emulator, namespace).run(script)
    with pytest.raises(JobStuckError) as err:
        launch(emulator, namespace, secret_env=["HF_TOKEN=flashdraft-hf-token:HF_TOKEN"])
    op.join()
    assert 'secret "flashdraft-hf-token" not found' in str(err.value) and "secrets.template.yaml" in str(err.value)


def test_timeout_reports_unschedulable_pods_and_deletes(emulator, namespace):
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."

    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.pod(
            f"{name}-master-0",
            master_labels(name),
            "pytorch",
            {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
                ],
            },
        )
        op.event(f"{name}-master-0", "Pod", "FailedScheduling", message)

    op = Operator(emulator, namespace).run(script)
    with pytest.raises(JobTimeoutError) as err:
        launch(emulator, namespace, timeout_s=1.0)
    op.join()
    text = str(err.value)
    assert "did not finish within 1 s" in text
    assert f"Unschedulable: {message}" in text and "free GPUs" in text
    assert f"event fd-job-master-0: FailedScheduling: {message}" in text
    assert op.job() is None  # a running job is not left behind


def test_unknown_service_account_from_operator_events(emulator, namespace):
    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.event(
            name,
            "PyTorchJob",
            "FailedCreatePod",
            f'Error creating: pods "{name}-master-0" is forbidden: error looking up service account {namespace}/trainer: serviceaccount "trainer" not found',
        )

    op = Operator(emulator, namespace).run(script)
    with pytest.raises(JobStuckError) as err:
        launch(emulator, namespace, service_account="trainer")
    op.join()
    assert 'serviceaccount "trainer" not found' in str(err.value) and "--service-account" in str(err.value)


def test_job_deleted_externally(emulator, namespace):
    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.custom.delete_namespaced_custom_object(*PTJ[:2], namespace, PTJ[2], name)

    op = Operator(emulator, namespace).run(script)
    with pytest.raises(JobFailedError, match="was deleted while we watched it"):
        launch(emulator, namespace)
    op.join()


def test_owner_reference_from_kfp_env(emulator, namespace, monkeypatch):
    monkeypatch.setenv("KFP_POD_NAME", "dflash-pipeline-train-123")
    monkeypatch.setenv("KFP_POD_UID", "4f1c-uid")
    monkeypatch.setenv("KFP_NAMESPACE", namespace)
    seen = {}

    def script(op: Operator):
        job = op.wait_job()
        seen.update(job)
        op.set_conditions(job["metadata"]["name"], "Succeeded")

    op = Operator(emulator, namespace).run(script)
    launch(emulator, namespace, cleanup="never")
    op.join()
    assert (
        seen["spec"]["runPolicy"]["activeDeadlineSeconds"] == 15
    )  # the launcher's timeout, enforced by the cluster too
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


def test_api_errors_are_clear(emulator, namespace):
    forbidden = f'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:{namespace}:pipeline-runner" cannot create resource "pytorchjobs"'
    emulator.emu[
        "post", kmock.namespace(namespace), kmock.resource("kubeflow.org/v1/pytorchjobs")
    ] << kmock.KubernetesError(status=403, reason="Forbidden", message=forbidden)
    with pytest.raises(UserError) as err:
        launch(emulator, namespace)
    assert forbidden in str(err.value) and "manifests/" in str(err.value)

    missing = f"team-missing-{namespace}"
    emulator.emu["post", kmock.namespace(missing)] << kmock.KubernetesError(
        status=404, reason="NotFound", message=f'namespaces "{missing}" not found'
    )
    with pytest.raises(UserError, match=f"namespace '{missing}' does not exist"):
        launch(emulator, missing)

    no_crd = f"team-nocrd-{namespace}"
    emulator.emu[
        "post", kmock.namespace(no_crd), kmock.resource("trainer.kubeflow.org/v1alpha1/trainjobs")
    ] << kmock.KubernetesError(
        status=404, reason="NotFound", message="the server could not find the requested resource"
    )
    with pytest.raises(UserError, match=r"does not serve TrainJob .* install Kubeflow Trainer"):
        launch(emulator, no_crd, launcher="trainjob")


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

    def script(op: Operator):
        name = op.wait_job()["metadata"]["name"]
        op.pod(
            f"{name}-master-0",
            master_labels(name),
            "pytorch",
            container_status(
                "Failed",
                {"terminated": {"exitCode": 2, "reason": "Error", "message": "flashdraft train: error: unknown recipe"}},
            ),
        )
        op.set_conditions(name, "Failed")

    op = Operator(emulator, namespace).run(script)
    code = main(
        [
            "launch",
            "--image",
            IMAGE,
            "--config",
            "smollm2_135m",
            "--name",
            "fd-cli",
            "--timeout",
            "15",
            "--poll-interval",
            "0.05",
        ]
    )
    op.join()
    assert code == 2
    err = capsys.readouterr().err
    assert "flashdraft launch: error: PyTorchJob fd-cli failed" in err and "exited with code 2" in err
