"""Create a training job, watch it to the end, stream rank 0's log, explain failures, clean up by policy."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from flashdraft.errors import UserError
from flashdraft.launch import diagnose
from flashdraft.launch.jobs import (
    PYTORCH_CONTAINER,
    PYTORCHJOB_API,
    TRAINJOB_API,
    TRAINJOB_CONTAINER,
)
from flashdraft.launch.kube import create_error, read_error
from flashdraft.launch.logs import LogFollower

log = logging.getLogger(__name__)

CLEANUP_POLICIES = ("on-success", "always", "never")


class JobFailedError(UserError):
    """Training ran and failed (a job, or torchrun here), or its job cannot start; the message carries the
    causes."""


class JobStuckError(JobFailedError):
    """The job cannot start (image, Secret, pod creation): it would hold its GPUs waiting forever."""


class JobTimeoutError(UserError):
    """The job did not finish within the timeout."""


@dataclass
class JobResult:
    name: str
    namespace: str
    kind: str
    state: str
    seconds: float
    log_lines: int = 0
    problems: list[str] = field(default_factory=list)


class JobWatch:
    """One job on the cluster: create it, poll it and its pods, and delete it when the policy says so."""

    def __init__(self, api_client, manifest: dict, *, poll_s: float = 5.0, log_drain_s: float = 10.0):
        from kubernetes import client

        self.manifest = manifest
        self.kind = manifest["kind"]
        self.backend = "pytorchjob" if self.kind == "PyTorchJob" else "trainjob"
        self.group, self.version, self.plural = PYTORCHJOB_API if self.backend == "pytorchjob" else TRAINJOB_API
        self.name = manifest["metadata"]["name"]
        self.namespace = manifest["metadata"]["namespace"]
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.serialize = api_client.sanitize_for_serialization
        self.poll_s = poll_s
        self.log_drain_s = log_drain_s
        self._warned: set[str] = set()

    def create(self) -> None:
        from kubernetes.client import ApiException

        try:
            self.custom.create_namespaced_custom_object(
                self.group, self.version, self.namespace, self.plural, self.manifest
            )
        except ApiException as err:
            raise create_error(err, self.kind, self.name, self.namespace) from err
        log.info("created %s %s/%s", self.kind, self.namespace, self.name)

    def delete(self) -> None:
        from kubernetes.client import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                self.group, self.version, self.namespace, self.plural, self.name, propagation_policy="Background"
            )
            log.info("deleted %s %s/%s", self.kind, self.namespace, self.name)
        except ApiException as err:
            if err.status != 404:
                log.warning("could not delete %s %s: HTTP %s %s", self.kind, self.name, err.status, err.reason)

    def _read(self):
        from kubernetes.client import ApiException

        try:
            job = self.custom.get_namespaced_custom_object(
                self.group, self.version, self.namespace, self.plural, self.name
            )
        except ApiException as err:
            if err.status == 404:
                raise JobFailedError(
                    f"{self.kind} {self.namespace}/{self.name} was deleted while we watched it"
                ) from err
            raise read_error(err, self.plural, self.namespace) from err
        try:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=diagnose.pod_selector(self.backend, self.name)
            )
            pods = [p for p in map(self.serialize, pods.items) if diagnose.belongs_to(self.backend, self.name, p)]
        except ApiException as err:
            raise read_error(err, "pods", self.namespace) from err
        return job, sorted(pods, key=lambda p: p["metadata"]["name"])

    def _events(self) -> list[dict]:
        from kubernetes.client import ApiException

        try:
            return [self.serialize(e) for e in self.core.list_namespaced_event(self.namespace).items]
        except ApiException as err:
            log.warning("cannot list events in %s: HTTP %s %s", self.namespace, err.status, err.reason)
            return []

    def _explain(self, headline: str, problems: list[diagnose.Problem], pods: list[dict]) -> str:
        names = {p["metadata"]["name"] for p in pods}
        lines = [headline]
        lines += [f"  pod {p.pod}: {p.text}" for p in problems]
        lines += [f"  event {e}" for e in diagnose.warning_events(self._events(), names, self.name)]
        if not pods:
            lines.append("  no pods were created")
        lines.append(f"  inspect: kubectl describe {self.kind.lower()} {self.name} -n {self.namespace}")
        return "\n".join(lines)

    def wait(self, timeout_s: float) -> JobResult:
        start = time.monotonic()
        follower = LogFollower(
            self.core, self.namespace, PYTORCH_CONTAINER if self.backend == "pytorchjob" else TRAINJOB_CONTAINER
        )
        follower.start()
        try:
            while True:
                job, pods = self._read()
                state, message = diagnose.job_state(self.backend, job)
                follower.set_pod(next((p for p in pods if diagnose.is_master(self.backend, p)), None))
                problems = [problem for pod in pods for problem in diagnose.pod_problems(pod)]
                for problem in problems:
                    if problem.text not in self._warned:
                        self._warned.add(problem.text)
                        log.warning("pod %s: %s", problem.pod, problem.text)
                if state == "succeeded":
                    follower.finish(self.log_drain_s)
                    return JobResult(
                        name=self.name,
                        namespace=self.namespace,
                        kind=self.kind,
                        state=state,
                        seconds=time.monotonic() - start,
                        log_lines=follower.lines,
                        problems=[p.text for p in problems],
                    )
                if state == "failed":
                    follower.finish(self.log_drain_s)
                    raise JobFailedError(self._explain(f"{self.kind} {self.name} failed: {message}", problems, pods))
                fatal = [p for p in problems if p.fatal]
                if fatal:
                    raise JobStuckError(self._explain(f"{self.kind} {self.name} cannot start", problems, pods))
                if not pods:
                    failures = diagnose.create_failures(self._events(), self.name)
                    if failures:
                        raise JobStuckError(
                            f"{self.kind} {self.name}: its pods cannot be created:\n"
                            + "\n".join(f"  {f}" for f in failures)
                        )
                elapsed = time.monotonic() - start
                if elapsed > timeout_s:
                    raise JobTimeoutError(
                        self._explain(
                            f"{self.kind} {self.name} did not finish within {timeout_s:g} s (state: {state})",
                            problems,
                            pods,
                        )
                    )
                time.sleep(self.poll_s)
        finally:
            if follower.is_alive():
                follower.finish(1.0)


def run_job(
    api_client,
    manifest: dict,
    *,
    timeout_s: float,
    cleanup: str = "on-success",
    poll_s: float = 5.0,
    log_drain_s: float = 10.0,
) -> JobResult:
    """Create `manifest`, wait for it, and clean up.

    cleanup: "on-success" deletes a finished job and keeps a failed one for inspection (its pods
    hold no GPUs any more); a job that cannot start or is still running when we give up (timeout,
    Ctrl-C) is deleted unless cleanup is "never"; "always" deletes in every case.
    """
    if cleanup not in CLEANUP_POLICIES:
        raise UserError(f"unknown cleanup policy {cleanup!r}; choose one of {', '.join(CLEANUP_POLICIES)}")
    watch = JobWatch(api_client, manifest, poll_s=poll_s, log_drain_s=log_drain_s)
    watch.create()
    delete = cleanup != "never"
    try:
        result = watch.wait(timeout_s)
    except JobStuckError:
        raise
    except JobFailedError:
        delete = cleanup == "always"
        raise
    finally:
        if delete:
            watch.delete()
        elif cleanup != "never":
            log.info("kept %s %s/%s for inspection", watch.kind, watch.namespace, watch.name)
    return result
