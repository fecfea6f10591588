"""Why a job is not running: job conditions and pod statuses (plain API dicts) -> states and readable causes.

Job conditions alone hide most causes (ilab-on-ocp's lesson): a job stays "Created" while its pods
cannot pull the image or find a GPU. So every poll also reads the pods and the events.
"""

from __future__ import annotations

from dataclasses import dataclass

# Waiting reasons that never resolve by waiting: fail fast instead of burning the timeout.
FATAL_WAITING = {
    "ImagePullBackOff": "check the image name and tag, and that the cluster can pull it (--image-pull-secret)",
    "InvalidImageName": "fix --image",
    "ErrImageNeverPull": "the image is not on the node and imagePullPolicy forbids pulling it",
    "CreateContainerConfigError": (
        "create the missing Secret/ConfigMap (manifests/base/secrets.template.yaml) or fix --secret-env"
    ),
}
HINTS = {
    "OOMKilled": "the container ran out of memory: raise --memory, or lower the batch size / sequence length",
    "Unschedulable": "no node fits the pod: check free GPUs, --gpus-per-node, --node-selector and --toleration",
    "CrashLoopBackOff": "the training process keeps exiting; its log above shows why",
    "Evicted": "the node ran short of a resource (often disk or memory) and evicted the pod",
}
# Reasons of Warning events when the operator (PyTorchJob) or the Job controller (TrainJob) cannot
# create pods, e.g. an unknown service account or an admission denial.
CREATE_FAILURES = {"FailedCreatePod", "FailedCreate", "FailedCreatePodSandBox"}
PYTORCHJOB_LABELS = (
    "training.kubeflow.org/job-name",
    "training.kubeflow.org/replica-type",
    "training.kubeflow.org/replica-index",
)
JOBSET_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "batch.kubernetes.io/job-completion-index",
)


@dataclass(frozen=True)
class Problem:
    pod: str
    text: str
    fatal: bool = False


def job_state(backend: str, job: dict) -> tuple[str, str]:
    """("succeeded" | "failed" | "running" | "pending", message of the deciding condition)."""
    conditions = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    by_type = {c.get("type"): c for c in conditions}
    done, failed = ("Succeeded", "Failed") if backend == "pytorchjob" else ("Complete", "Failed")
    for kind, state in ((failed, "failed"), (done, "succeeded")):
        if kind in by_type:
            cond = by_type[kind]
            return state, ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
    if "Running" in by_type:
        return "running", ""
    return "pending", ""


def pod_selector(backend: str, job_name: str) -> str:
    return f"{(PYTORCHJOB_LABELS if backend == 'pytorchjob' else JOBSET_LABELS)[0]}={job_name}"


def belongs_to(backend: str, job_name: str, pod: dict) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    key = (PYTORCHJOB_LABELS if backend == "pytorchjob" else JOBSET_LABELS)[0]
    return labels.get(key) == job_name


def is_master(backend: str, pod: dict) -> bool:
    """The rank-0 node: the PyTorchJob Master, or node index 0 of a TrainJob."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if backend == "pytorchjob":
        return labels.get(PYTORCHJOB_LABELS[1], "").lower() == "master" and labels.get(PYTORCHJOB_LABELS[2], "0") == "0"
    return labels.get(JOBSET_LABELS[1]) == "node" and labels.get(JOBSET_LABELS[2]) == "0"


def _terminated_text(term: dict) -> str:
    reason = term.get("reason") or "Error"
    text = f"exited with code {term.get('exitCode')} ({reason})"
    if term.get("message"):
        text += f": {term['message'].strip()}"
    if reason in HINTS:
        text += f" -> {HINTS[reason]}"
    return text


def pod_problems(pod: dict) -> list[Problem]:
    """Every cause visible in one pod's status."""
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    out: list[Problem] = []
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
            reason = cond["reason"]
            hint = HINTS.get(reason)
            out.append(Problem(name, f"{reason}: {cond.get('message', '')}" + (f" -> {hint}" if hint else "")))
    if status.get("phase") == "Failed" and status.get("reason"):
        reason = status["reason"]
        hint = HINTS.get(reason)
        out.append(
            Problem(name, f"pod failed: {reason}: {status.get('message', '')}" + (f" -> {hint}" if hint else ""))
        )
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        container = cs.get("name", "?")
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        if reason in FATAL_WAITING:
            out.append(
                Problem(
                    name,
                    f"container {container}: {reason}: {waiting.get('message', '')} -> {FATAL_WAITING[reason]}",
                    fatal=True,
                )
            )
        elif reason == "CrashLoopBackOff":
            out.append(
                Problem(
                    name,
                    f"container {container}: CrashLoopBackOff after {cs.get('restartCount', 0)} restarts"
                    f" -> {HINTS[reason]}",
                )
            )
        for term in ((state.get("terminated") or {}), ((cs.get("lastState") or {}).get("terminated") or {})):
            if term and term.get("exitCode", 0) != 0:
                out.append(Problem(name, f"container {container} {_terminated_text(term)}"))
                break
    return out


def create_failures(events: list[dict], job_name: str) -> list[str]:
    """Warning events saying pods of this job could not be created."""
    out = []
    for event in events:
        involved = (event.get("involvedObject") or {}).get("name", "")
        if event.get("type") != "Warning" or event.get("reason") not in CREATE_FAILURES:
            continue
        if involved == job_name or involved.startswith(f"{job_name}-"):
            message = event.get("message", "")
            hint = ""
            if "serviceaccount" in message.lower() or "service account" in message.lower():
                hint = " -> create the service account in this namespace or fix --service-account"
            out.append(f"{involved}: {event['reason']}: {message}{hint}")
    return out


def warning_events(events: list[dict], names: set[str], job_name: str, limit: int = 5) -> list[str]:
    """The last few Warning events about the job, its child objects or its pods."""
    out = []
    for event in events:
        involved = (event.get("involvedObject") or {}).get("name", "")
        if event.get("type") == "Warning" and (
            involved in names or involved == job_name or involved.startswith(f"{job_name}-")
        ):
            out.append(f"{involved}: {event.get('reason')}: {event.get('message', '')}")
    return out[-limit:]
