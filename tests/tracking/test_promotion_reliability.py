"""Promotion never crowns garbage: bad reports and broken drafts are refused before anything is
registered, a slow draft is never champion, re-promotion takes the new report, two promotions at once
crown the better draft, and a promotion killed at any point completes on a rerun with nothing half-done."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys

import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from flashdraft import cli  # noqa: E402
from flashdraft.config import PromoteConfig  # noqa: E402
from flashdraft.errors import UserError  # noqa: E402
from flashdraft.tracking import registry  # noqa: E402
from flashdraft.tracking.promotion import promote_draft  # noqa: E402
from flashdraft.tracking.runs import step_run  # noqa: E402
from tiny_models import save_tiny_draft  # noqa: E402

NAME = "guarded-draft"


def report(tau=3.0, speedup=2.0, lossless=1.0) -> dict:
    bench = {"speculative": {"tau_pooled": tau}, "speedup": speedup, "lossless": lossless}
    return {"benchmarks": {"gsm8k": bench}}


def promote(uri, draft, rep, name=NAME, **policy):
    with step_run("promote", tracking_uri=uri) as run:
        return promote_draft(run, PromoteConfig(draft=str(draft), model_name=name, **policy), rep, lineage={})


def registered(uri, name=NAME) -> list:
    return MlflowClient(uri).search_model_versions(f"name='{name}'")


@pytest.mark.parametrize("scores, needle", [
    ({"tau": math.nan}, "gsm8k tau is nan"),
    ({"tau": "Infinity"}, "gsm8k tau is 'Infinity'"),
    ({"tau": math.inf}, "gsm8k tau is inf"),
    ({"tau": -3.0}, "gsm8k tau is -3.0"),
    ({"tau": 0.5}, "expected a finite number >= 1"),
    ({"tau": 17.0}, "<= 16"),  # the draft's block size
    ({"tau": True}, "gsm8k tau is True"),
    ({"lossless": 1.5}, "lossless fraction is 1.5"),
    ({"lossless": -0.1}, "lossless fraction is -0.1"),
    ({"speedup": 0.0}, "speedup is 0.0: expected a finite number > 0"),
    ({"speedup": -1.0}, "speedup is -1.0"),
    ({"speedup": "2x"}, "speedup is '2x'"),
])
def test_bad_scores_are_refused_before_anything_is_registered(store, tmp_path, scores, needle):
    draft = save_tiny_draft(tmp_path / "d")
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        promote(store, draft, report(**scores))
    assert not MlflowClient(store).search_registered_models()


@pytest.mark.parametrize("damage, needle", [
    ("truncate", "truncated or padded"),
    ("garbage", "is not a safetensors file"),
    ("shape", "does not match its config"),
    ("config", "is not a DFlash draft"),
    ("missing", "has no model.safetensors"),
])
def test_a_broken_draft_is_refused_before_anything_is_registered(store, tmp_path, damage, needle):
    draft = save_tiny_draft(tmp_path / "d")
    weights = draft / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "garbage":
        weights.write_bytes(b"\x00" * 64)
    elif damage == "shape":
        config = json.loads((draft / "config.json").read_text())
        config["intermediate_size"] = 80
        (draft / "config.json").write_text(json.dumps(config))
    elif damage == "config":
        (draft / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    else:
        weights.unlink()
    with pytest.raises(UserError, match=needle):
        promote(store, draft, report())
    assert not MlflowClient(store).search_registered_models()


def test_a_draft_slower_than_plain_decoding_is_never_champion(store, tmp_path):
    slow = promote(store, save_tiny_draft(tmp_path / "slow", seed=1), report(tau=4.0, speedup=0.37))
    assert (slow.alias, slow.promoted) == ("challenger", False)
    assert "speedup 0.370x is below promote.min_speedup 1.000x" in slow.reason
    version = MlflowClient(store).get_model_version(NAME, slow.version)
    assert version.tags[registry.WEIGHTS_TAG] == registry.hashlib.sha256(
        (tmp_path / "slow" / "model.safetensors").read_bytes()).hexdigest()
    fast = promote(store, save_tiny_draft(tmp_path / "fast", seed=2), report(tau=2.0, speedup=1.3))
    assert (fast.alias, fast.reason) == ("champion", "no champion yet")
    relaxed = promote(store, save_tiny_draft(tmp_path / "other", seed=3), report(tau=2.5, speedup=0.9),
                      min_speedup=0.5)
    assert relaxed.alias == "champion"


def test_re_promotion_decides_on_the_new_report_and_updates_the_tags(store, tmp_path):
    draft = save_tiny_draft(tmp_path / "d")
    first = promote(store, draft, report(tau=3.0, speedup=2.0))
    assert first.alias == "champion"
    again = promote(store, draft, report(tau=2.5, speedup=0.8))  # re-evaluated: now slower than plain decoding
    assert (again.version, again.alias, again.new_version) == (first.version, "challenger", False)
    tags = MlflowClient(store).get_model_version(NAME, first.version).tags
    assert (tags["tau.gsm8k"], tags["speedup.gsm8k"]) == ("2.5", "0.8") and "min_speedup" in tags["flashdraft.decision"]
    assert "champion" not in MlflowClient(store).get_registered_model(NAME).aliases


@pytest.mark.parametrize("name", ["it's", "team/draft", "a b", "x" * 200, ""])
def test_model_names_that_break_filters_or_paths_are_refused_first(store, tmp_path, capsys, name):
    draft = save_tiny_draft(tmp_path / "d")
    (tmp_path / "report.json").write_text(json.dumps(report()))
    code = cli.main(["promote", "--draft", str(draft), "--report", str(tmp_path / "report.json"),
                     "--model-name", name])
    assert code == 2 and "promote.model_name must be letters, digits" in capsys.readouterr().err
    client = MlflowClient(store)
    assert not client.search_registered_models()
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])  # no run, not even FAILED


def test_the_lock_is_taken_when_its_holder_releases_it_during_a_colliding_create(store, monkeypatch):
    """MLflow answers a create that collides with an existing name by reading that model back; when the
    holder deletes it in between, the create fails with RESOURCE_DOES_NOT_EXIST (seen once in the
    concurrent test below, in trial 15 of a CI run). That is a released lock: try again, do not fail."""
    from mlflow.exceptions import RestException

    client = MlflowClient(store)
    create = client.create_registered_model
    calls = []

    def racing_create(name, *args, **kwargs):
        calls.append(name)
        if len(calls) == 1:
            raise RestException({"error_code": "RESOURCE_DOES_NOT_EXIST",
                                 "message": f"Registered Model with name={name} not found"})
        return create(name, *args, **kwargs)

    monkeypatch.setattr(client, "create_registered_model", racing_create)
    lock = NAME + registry.LOCK_SUFFIX
    with registry.promotion_lock(client, NAME):
        assert client.get_registered_model(lock).name == lock
    assert calls == [lock, lock] and not client.search_registered_models(f"name = '{lock}'")


def _promote_in_process(args):
    uri, draft, tau, name = args
    return promote(uri, draft, report(tau=tau), name=name).alias


@pytest.mark.slow
def test_two_promotions_at_once_crown_the_better_draft(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.delenv("FLASHDRAFT_PARENT_RUN_ID", raising=False)
    context = multiprocessing.get_context("fork")
    client = MlflowClient(mlflow_server)
    for trial in range(20):
        name = f"race-{trial}"
        better = save_tiny_draft(tmp_path / f"better-{trial}", seed=2 * trial)
        worse = save_tiny_draft(tmp_path / f"worse-{trial}", seed=2 * trial + 1)
        jobs = [(mlflow_server, better, 4.0, name), (mlflow_server, worse, 3.0, name)]
        with context.Pool(2) as pool:  # both start together; the order of the list alternates
            pool.map(_promote_in_process, jobs if trial % 2 else jobs[::-1], chunksize=1)
        champion = client.get_model_version_by_alias(name, "champion")
        assert champion.tags[registry.DIGEST_TAG] == registry.draft_digest(better), f"trial {trial}"
        assert not client.search_registered_models(f"name = '{name}{registry.LOCK_SUFFIX}'")  # lock released


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_artifacts", "after_register"])
def test_a_promotion_killed_midway_completes_on_a_rerun(mlflow_server, tmp_path, monkeypatch, point):
    draft = save_tiny_draft(tmp_path / "d", seed=1000 + len(point))  # a draft of its own for each kill point
    (tmp_path / "report.json").write_text(json.dumps(report()))
    name = f"killed-{point.replace('_', '-')}"
    args = ["promote", "--draft", str(draft), "--report", str(tmp_path / "report.json"), "--model-name", name,
            "--tracking-uri", mlflow_server]
    monkeypatch.delenv("FLASHDRAFT_PARENT_RUN_ID", raising=False)
    killed = subprocess.run([sys.executable, "-m", "flashdraft.cli", *args],
                            env={**os.environ, "FLASHDRAFT_CRASH_IN_PROMOTE": point}, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == 17, killed.stderr[-2000:]
    assert cli.main(args) == 0  # the rerun, with nothing to inject, in this process
    client = MlflowClient(mlflow_server)
    (version,) = client.search_model_versions(f"name='{name}'")
    assert client.get_model_version_by_alias(name, "champion").version == version.version
    files = {a.path for a in client.list_artifacts(version.run_id, registry.DRAFT_ARTIFACT_PATH)}
    assert {"draft/config.json", "draft/model.safetensors"} <= files  # no version without its weights
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string=f"tags.`{registry.DIGEST_TAG}` = '{registry.draft_digest(draft)}'")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]  # none left RUNNING
