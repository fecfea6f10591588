"""Follow the rank-0 pod's training log into our log, across container restarts and dropped streams.

Each container start (pod, restart count) is followed from its beginning. A follow stream can end
while the container still runs (an idle or broken connection on a days-long job); it is then reopened
from shortly before the last line seen, and lines are de-duplicated by the kubelet's timestamps, so
nothing is lost or printed twice.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import datetime, timezone

log = logging.getLogger(__name__)
job_log = logging.getLogger("flashdraft.launch.job")  # the training job's own output, line by line

Stamp = tuple[int, int]  # (unix seconds, nanoseconds)


def parse_stamp(text: bytes) -> Stamp | None:
    """The kubelet's RFC 3339 (nanosecond, UTC) line prefix, e.g. b"2026-11-30T04:02:33.207123456Z"."""
    try:
        raw = text.decode("ascii")
        if not raw.endswith("Z"):
            return None
        whole, _, fraction = raw[:-1].partition(".")
        moment = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
        return int(moment.timestamp()), int((fraction or "0").ljust(9, "0")[:9])
    except (UnicodeDecodeError, ValueError):
        return None


class LogFollower(threading.Thread):
    """Streams one container of whatever pod `set_pod` last named (the main loop updates it each poll)."""

    def __init__(self, core, namespace: str, container: str, refollow_s: float = 2.0):
        super().__init__(daemon=True, name="flashdraft-log-follower")
        self.core, self.namespace, self.container = core, namespace, container
        self.refollow_s = refollow_s
        self._pod: dict | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._response = None
        self._last: dict[tuple, Stamp] = {}  # last line seen per container start
        self._ended: dict[tuple, float] = {}  # when its last stream ended
        self._done: set[tuple] = set()  # container starts read to their end
        self.lines = 0

    def set_pod(self, pod: dict | None) -> None:
        with self._lock:
            self._pod = pod

    def _current(self) -> tuple[str, tuple, bool] | None:
        """(pod name, container-start key, terminated) of the container to read now, if any."""
        with self._lock:
            pod = self._pod
        if pod is None:
            return None
        meta = pod["metadata"]
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            state = status.get("state") or {}
            if status.get("name") == self.container and ("running" in state or "terminated" in state):
                key = (meta["name"], meta.get("uid", ""), int(status.get("restartCount") or 0))
                if key not in self._done:
                    return meta["name"], key, "terminated" in state
        return None

    def run(self) -> None:
        while True:
            stopping = self._stopping.is_set()
            current = self._current()
            if current is not None:
                name, key, terminated = current
                if stopping or terminated:
                    # Read to the end without following: the container has stopped (or the job is
                    # done and its status lags).
                    self._read(name, key, follow=False)
                    self._done.add(key)
                    continue
                if time.monotonic() - self._ended.get(key, -math.inf) >= self.refollow_s:
                    self._read(name, key, follow=True)
                    self._ended[key] = time.monotonic()
                    continue
            if stopping:
                return
            self._stopping.wait(0.2)

    def _read(self, pod_name: str, key: tuple, follow: bool) -> None:
        from kubernetes.client import ApiException

        kwargs = {"container": self.container, "follow": follow, "timestamps": True, "_preload_content": False}
        if key in self._last:  # generous: clocks differ; duplicates are dropped by timestamp
            kwargs["since_seconds"] = max(1, math.ceil(time.time() - self._last[key][0]) + 5)
        try:
            self._response = self.core.read_namespaced_pod_log(pod_name, self.namespace, **kwargs)
            pending = b""
            for chunk in self._response.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._emit(pod_name, key, line)
            if pending:
                self._emit(pod_name, key, pending)
        except ApiException as err:
            log.warning("cannot read the log of %s: HTTP %s %s", pod_name, err.status, err.reason)
        except Exception as err:  # the connection dropped (or we closed it on shutdown): read again later
            if not self._stopping.is_set():
                log.warning("log stream of %s ended: %s", pod_name, err)
        finally:
            self._response = None

    def _emit(self, pod_name: str, key: tuple, line: bytes) -> None:
        prefix, _, text = line.partition(b" ")
        stamp = parse_stamp(prefix)
        if stamp is None:
            text = line
        else:
            if key in self._last and stamp <= self._last[key]:
                return
            self._last[key] = stamp
        self.lines += 1
        job_log.info("[%s] %s", pod_name, text.decode("utf-8", "replace").rstrip("\r"))

    def finish(self, timeout_s: float) -> None:
        """Read what is left, then stop; a stream still open after `timeout_s` is closed."""
        self._stopping.set()
        self.join(timeout_s)
        response = self._response
        if self.is_alive() and response is not None:
            response.close()
            self.join(1.0)
