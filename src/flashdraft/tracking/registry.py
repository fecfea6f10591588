"""The MLflow model registry: one model version per trained draft, with lineage, and promotion by alias.

Promotion is a pure decision (`should_promote`), then an action (`apply_decision`): the only code in
flashdraft that moves the `champion` / `challenger` aliases. A draft is identified by the digest of its
files, so promoting the same draft twice finds its existing version.

Two promotions of the same model at once take turns: each holds `promotion_lock` (a registered model
whose creation the registry's database makes atomic) from reading the champion to moving the alias, so
neither decides against a champion that has changed underneath it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashdraft.config import PromoteConfig
from flashdraft.errors import UserError

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
DIGEST_TAG = "flashdraft.draft_sha256"  # of every file of the draft folder: finds a version again
WEIGHTS_TAG = "flashdraft.weights_sha256"  # of model.safetensors: what a deployment can check
DRAFT_ARTIFACT_PATH = "draft"


@dataclass(frozen=True, kw_only=True)
class Scores:
    """What promotion looks at for one benchmark."""

    tau: float
    # Fraction of prompts whose speculative output equals plain greedy decoding; None: not measured
    # (a sampled evaluation), which promotion treats as not shown lossless.
    lossless: float | None
    speedup: float | None = None


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str

    @property
    def alias(self) -> str:
        return CHAMPION if self.promote else CHALLENGER


def require_primary(candidate: Mapping[str, Scores], policy: PromoteConfig) -> None:
    if policy.primary_benchmark not in candidate:
        raise UserError(
            f"the evaluation report has no {policy.primary_benchmark!r} benchmark (it has "
            f"{', '.join(sorted(candidate)) or 'none'}); evaluate on it or set the primary benchmark to one of those"
        )


def should_promote(
    candidate: Mapping[str, Scores],
    champion: Mapping[str, Scores] | None,
    policy: PromoteConfig,
) -> Decision:
    """Pure: promote a lossless candidate, at least `min_speedup` times as fast as plain decoding, when there
    is no champion or it beats the champion's tau by a margin (the policy: `primary_benchmark`,
    `min_tau_gain`, `min_lossless`, `min_speedup`)."""
    require_primary(candidate, policy)
    primary = policy.primary_benchmark
    lossy = {
        name: s.lossless for name, s in candidate.items() if s.lossless is None or s.lossless < policy.min_lossless
    }
    if lossy:
        detail = ", ".join(
            f"{name} {'not measured (evaluate at temperature 0)' if value is None else f'{value:.3f}'}"
            for name, value in sorted(lossy.items())
        )
        return Decision(False, f"not lossless (required {policy.min_lossless:.3f}): {detail}")
    speedup = candidate[primary].speedup
    if speedup is None or speedup < policy.min_speedup:
        shown = "not measured" if speedup is None else f"{speedup:.3f}x"
        return Decision(False, f"{primary} speedup {shown} is below promote.min_speedup {policy.min_speedup:.3f}x: "
                               "not faster than plain decoding")
    if champion is None:
        return Decision(True, "no champion yet")
    if primary not in champion:
        return Decision(
            False,
            f"the champion has no {primary!r} result to compare with; promote by hand or change the primary benchmark",
        )
    gain = candidate[primary].tau - champion[primary].tau
    comparison = f"{primary} tau {candidate[primary].tau:.3f} vs champion {champion[primary].tau:.3f}"
    if gain > policy.min_tau_gain:
        return Decision(True, f"{comparison}: gain {gain:+.3f} > margin {policy.min_tau_gain:.3f}")
    return Decision(False, f"{comparison}: gain {gain:+.3f} <= margin {policy.min_tau_gain:.3f}")


def scores_to_tags(scores: Mapping[str, Scores]) -> dict[str, str]:
    tags = {}
    for name, s in scores.items():
        tags[f"tau.{name}"] = f"{s.tau:.6g}"
        if s.lossless is not None:
            tags[f"lossless.{name}"] = f"{s.lossless:.6g}"
        if s.speedup is not None:
            tags[f"speedup.{name}"] = f"{s.speedup:.6g}"
    return tags


def scores_from_tags(tags: Mapping[str, str]) -> dict[str, Scores]:
    names = {key.split(".", 1)[1] for key in tags if key.startswith("tau.")}
    out = {}
    for name in names:
        lossless, speedup = tags.get(f"lossless.{name}"), tags.get(f"speedup.{name}")
        out[name] = Scores(
            tau=float(tags[f"tau.{name}"]),
            lossless=float(lossless) if lossless is not None else None,
            speedup=float(speedup) if speedup is not None else None,
        )
    return out


def draft_digest(folder: Path) -> str:
    """sha256 over the draft's relative file names and contents: the same draft gives the same digest."""
    digest = hashlib.sha256()
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    if not files:
        raise UserError(f"draft folder {folder} is empty or missing; give the folder `flashdraft train` exported")
    for path in files:
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def source_commit() -> str:
    """The flashdraft git commit: `FLASHDRAFT_GIT_COMMIT` (set in images), else the checkout's HEAD."""
    if os.environ.get("FLASHDRAFT_GIT_COMMIT"):
        return os.environ["FLASHDRAFT_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def client(tracking_uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def find_version(client, name: str, digest: str):
    """The existing version of `name` holding the draft with this digest, or None (`name` is checked by
    PromoteConfig: no quotes; the digest is hex)."""
    found = client.search_model_versions(f"name='{name}' and tags.`{DIGEST_TAG}`='{digest}'")
    return min(found, key=lambda v: int(v.version)) if found else None


LOCK_SUFFIX = ".promotion-lock"
LOCK_WAIT_S = 120.0
LOCK_STALE_S = 600.0  # a lock this old belongs to a promotion that died


@contextlib.contextmanager
def promotion_lock(client, name: str) -> Iterator[None]:
    """Hold the promotion lock of model `name` (waiting for another holder, breaking a stale lock)."""
    from mlflow.exceptions import MlflowException

    lock = name + LOCK_SUFFIX
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            client.create_registered_model(lock, tags={"flashdraft.locked_at": str(time.time())},
                                           description=f"held while a draft of {name} is promoted")
            break
        except MlflowException as err:
            # MLflow answers a create that collides with an existing name by reading that model back; when
            # its holder deletes it in between, the create fails with RESOURCE_DOES_NOT_EXIST: released.
            if "RESOURCE_DOES_NOT_EXIST" in str(err.error_code) and time.monotonic() < deadline:
                continue
            if "ALREADY_EXISTS" not in str(err.error_code) and "already exists" not in str(err).lower():
                raise
        try:
            held_since = float(client.get_registered_model(lock).tags.get("flashdraft.locked_at", "0"))
        except MlflowException:
            continue  # released in the meantime
        if time.time() - held_since > LOCK_STALE_S:
            log.warning("breaking the stale promotion lock of %s (held since %s)", name, time.ctime(held_since))
            with contextlib.suppress(MlflowException):
                client.delete_registered_model(lock)
        elif time.monotonic() > deadline:
            raise UserError(f"another promotion of {name} has held its lock for over {LOCK_WAIT_S:.0f} s; retry "
                            f"later (or delete the registered model {lock} if no promotion is running)")
        time.sleep(0.2 + random.random() * 0.3)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            client.delete_registered_model(lock)


def champion_version(client, name: str):
    """The version under the `champion` alias, or None (no model, no alias, or its version was deleted)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def register_draft(client, name: str, *, run_id: str, digest: str, tags: Mapping[str, Any]):
    """A new version of `name` from the draft logged under the run's `draft/` artifacts."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        with contextlib.suppress(MlflowException):  # another promotion created it first
            client.create_registered_model(name, description="DFlash speculative-decoding drafts (flashdraft)")
    source = f"{client.get_run(run_id).info.artifact_uri}/{DRAFT_ARTIFACT_PATH}"
    version = client.create_model_version(
        name,
        source=source,
        run_id=run_id,
        tags={DIGEST_TAG: digest, **{k: str(v) for k, v in tags.items()}},
    )
    log.info("registered %s version %s from %s", name, version.version, source)
    return version


def apply_decision(client, name: str, version: str, decision: Decision, tags: Mapping[str, str]) -> str:
    """Point the decision's alias at `version` and set `tags` (the scores it was decided on) and the
    decision on the version; returns its alias. A champion decided against on its new report loses the
    alias."""
    version = str(version)
    current = champion_version(client, name)
    if not decision.promote and current is not None and str(current.version) == version:
        client.delete_registered_model_alias(name, CHAMPION)
    client.set_registered_model_alias(name, decision.alias, version)
    if decision.promote and str(client.get_registered_model(name).aliases.get(CHALLENGER)) == version:
        client.delete_registered_model_alias(name, CHALLENGER)
    for key, value in {**tags, "flashdraft.decision": decision.reason}.items():
        client.set_model_version_tag(name, version, key, value)
    log.info("%s version %s -> @%s (%s)", name, version, decision.alias, decision.reason)
    return decision.alias
