"""Registry + promotion against a real MLflow store: versions with lineage, aliases, idempotent re-runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from flashdraft import cli  # noqa: E402
from flashdraft.config import PromoteConfig  # noqa: E402
from flashdraft.tracking import registry  # noqa: E402
from flashdraft.tracking.promotion import PromotionResult, promote_draft  # noqa: E402
from flashdraft.tracking.runs import step_run  # noqa: E402
from tiny_models import save_tiny_draft  # noqa: E402

NAME = "nano-draft"
POLICY = PromoteConfig(model_name=NAME, primary_benchmark="gsm8k", min_tau_gain=0.05)
LINEAGE = {"target": "org/target", "target.revision": "abc123", "recipe": "smollm2_135m_dflash", "data": "x.jsonl"}


def make_draft(tmp_path, name: str, content: bytes):
    """A real tiny draft; different `content` gives different weights."""
    return save_tiny_draft(tmp_path / name, seed=int.from_bytes(content, "little"))


def bench(tau: float, speedup: float, lossless: float | None) -> dict:
    """One benchmark as `flashdraft evaluate` reports it (the fields promotion reads)."""
    return {"speculative": {"tau_pooled": tau, "tau_mean_of_requests": tau}, "speedup": speedup, "lossless": lossless}


def make_report(gsm8k_tau: float, lossless: float | None = 1.0) -> dict:
    return {"benchmarks": {"gsm8k": bench(gsm8k_tau, gsm8k_tau / 1.5, lossless), "chat": bench(2.0, 1.4, 1.0)}}


def promote(uri: str, draft, report: dict) -> PromotionResult:
    """`draft` promoted by POLICY with LINEAGE inside a promote step run, as `flashdraft promote` does."""
    with step_run("promote", tracking_uri=uri) as run:
        return promote_draft(run, replace(POLICY, draft=str(draft)), report, lineage=LINEAGE)


def aliases(uri):
    return {k: str(v) for k, v in MlflowClient(uri).get_registered_model(NAME).aliases.items()}


def test_versions_lineage_and_aliases(store, tmp_path):
    first = promote(store, make_draft(tmp_path, "a", b"a"), make_report(3.0))
    assert (first.version, first.alias, first.promoted) == ("1", "champion", True)

    client = MlflowClient(store)
    version = client.get_model_version(NAME, "1")
    for key, value in LINEAGE.items():
        assert version.tags[key] == value
    assert version.tags["tau.gsm8k"] == "3" and version.tags["lossless.chat"] == "1"
    assert len(version.tags["flashdraft.commit"]) >= 7
    assert version.tags[registry.DIGEST_TAG] == registry.draft_digest(tmp_path / "a")
    # The version's source is the draft as logged by the promote run: it downloads back byte-identical.
    import mlflow.artifacts

    local = mlflow.artifacts.download_artifacts(version.source, dst_path=str(tmp_path / "dl"))
    assert registry.draft_digest(__import__("pathlib").Path(local)) == registry.draft_digest(tmp_path / "a")

    worse = promote(store, make_draft(tmp_path, "b", b"b"), make_report(2.5))
    assert (worse.version, worse.alias) == ("2", "challenger")
    assert aliases(store) == {"champion": "1", "challenger": "2"}

    lossy = promote(store, make_draft(tmp_path, "c", b"c"), make_report(9.0, lossless=0.5))
    assert (lossy.version, lossy.alias, lossy.promoted) == ("3", "challenger", False)

    better = promote(store, make_draft(tmp_path, "d", b"d"), make_report(3.5))
    assert (better.version, better.alias) == ("4", "champion")
    assert aliases(store) == {"champion": "4", "challenger": "3"}


def test_rerunning_on_the_same_draft_changes_nothing(store, tmp_path):
    draft = make_draft(tmp_path, "a", b"a")
    promote(store, draft, make_report(3.0))
    worse = make_draft(tmp_path, "b", b"b")
    promote(store, worse, make_report(2.0))
    client = MlflowClient(store)

    def snapshot():
        versions = client.search_model_versions(f"name='{NAME}'")
        return aliases(store), sorted((v.version, sorted(v.tags.items())) for v in versions)

    before = snapshot()
    again = promote(store, draft, make_report(3.0))
    assert (again.version, again.alias, again.new_version) == ("1", "champion", False)
    again = promote(store, worse, make_report(2.0))
    assert (again.version, again.alias, again.new_version) == ("2", "challenger", False)
    assert snapshot() == before


def test_a_sampled_evaluation_is_not_shown_lossless(store, tmp_path):
    result = promote(store, make_draft(tmp_path, "a", b"a"), make_report(3.0, lossless=None))
    assert (result.alias, result.promoted) == ("challenger", False)
    assert "gsm8k not measured" in result.reason


def test_champion_deleted_next_candidate_becomes_champion(store, tmp_path):
    promote(store, make_draft(tmp_path, "a", b"a"), make_report(5.0))
    MlflowClient(store).delete_model_version(NAME, "1")
    assert registry.champion_version(MlflowClient(store), NAME) is None
    result = promote(store, make_draft(tmp_path, "b", b"b"), make_report(2.0))
    assert (result.version, result.alias, result.reason) == ("2", "champion", "no champion yet")


def test_promote_command(store, tmp_path, capsys):
    draft = make_draft(tmp_path, "a", b"a")
    report = tmp_path / "report.json"
    report.write_text(json.dumps(make_report(3.0)))
    out = tmp_path / "decision.json"
    argv = ["promote", "--draft", str(draft), "--report", str(report), "--model-name", NAME,
            "--target", "org/target", "--output", str(out), "--target-revision", "abc123", "--recipe", "mine",
            "--data", "x.jsonl", "y.jsonl"]
    assert cli.main(argv) == 0
    assert "version 1 -> @champion" in capsys.readouterr().out
    assert json.loads(out.read_text())["alias"] == "champion"
    tags = MlflowClient(store).get_model_version(NAME, "1").tags
    assert {k: tags[k] for k in LINEAGE} == {"target": "org/target", "target.revision": "abc123", "recipe": "mine",
                                             "data": "x.jsonl,y.jsonl"}


def test_promote_lineage_and_policy_come_from_the_config(store, tmp_path, capsys):
    """A recipe's target and data are the lineage; the policy is promote.* (here from key=value)."""
    report = tmp_path / "report.json"
    report.write_text(json.dumps(make_report(3.0)))
    argv = ["promote", "--config", "smollm2_135m", f"promote.draft={make_draft(tmp_path, 'a', b'a')}",
            f"promote.report={report}", f"promote.model_name={NAME}", "promote.primary_benchmark=chat"]
    assert cli.main(argv) == 0
    tags = MlflowClient(store).get_model_version(NAME, "1").tags
    assert tags["recipe"] == "smollm2_135m" and tags["target"] and tags["data"]
    assert "@champion" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["promote", "--min-lossless", "most"])
    assert "invalid float value: 'most'" in capsys.readouterr().err
    assert cli.main(["promote", "--draft", "d", "--report", str(report), "--model-name", NAME,
                     "--min-lossless", "1.5"]) == 2
    assert "promote.min_lossless must be a fraction in [0, 1], got 1.5" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [("not json", "is not JSON"), ('{"benchmarks": {}}', "no `benchmarks`"),
     ('{"benchmarks": {"gsm8k": {"speedup": 1}}}', "lacks speculative.tau_pooled"),
     ('{"benchmarks": {"chat": {"speculative": {"tau_pooled": 2}, "lossless": 1}}}', "no 'gsm8k' benchmark")],
)
def test_bad_reports_are_clear_errors_and_register_nothing(store, tmp_path, capsys, content, message):
    draft = make_draft(tmp_path, "a", b"a")
    report = tmp_path / "report.json"
    report.write_text(content)
    assert cli.main(["promote", "--draft", str(draft), "--report", str(report), "--model-name", NAME]) == 2
    assert message in capsys.readouterr().err
    assert MlflowClient(store).search_registered_models() == []


def test_missing_draft_is_a_clear_error(store, tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(make_report(3.0)))
    argv = ["promote", "--draft", str(tmp_path / "nope"), "--report", str(report), "--model-name", NAME]
    assert cli.main(argv) == 2
    assert "is not a draft folder (no config.json)" in capsys.readouterr().err
