"""`flashdraft evaluate` end to end on tiny targets, its report, and its errors on bad input."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import transformers
from transformers import AutoConfig
from packaging.version import Version

from decoding_helpers import compiled_attention
from flashdraft.cli import main
from flashdraft.config import EvaluateConfig, TargetConfig, load_config
from flashdraft.decoding.benchmarks import load_benchmark
from flashdraft.decoding.evaluate import evaluate
from flashdraft.errors import UserError
from flashdraft.target.flex_decode import flex_decodes
from flashdraft.target.frozen import FrozenTarget
from tiny_models import save_tiny_target

HYBRID_ASSISTED_DECODING = Version(transformers.__version__) >= Version("5.25")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def run_evaluate(draft, target, output, **fields) -> dict:
    """The library on a draft folder and a target; `fields` are EvaluateConfig fields."""
    return evaluate(TargetConfig(name_or_path=str(target)),
                    EvaluateConfig(draft=str(draft), output=str(output), **fields))


@pytest.fixture(scope="module")
def drafts(tiny_target, tmp_path_factory):
    made = {}

    def make(model_type: str):
        if model_type not in made:
            out = tmp_path_factory.mktemp(f"draft-{model_type}") / "draft"
            assert main(["draft-init", "--target", str(tiny_target(model_type)), "--output", str(out),
                         "--num-layers", "2", "--num-taps", "3", "--block-size", "4", "--seed", "1"]) == 0
            made[model_type] = out
        return made[model_type]

    return make


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": "Say something nice."},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                          {"role": "user", "content": "how are you?"}, {"role": "assistant", "content": "ok"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("model_type", ["qwen3", "nemotron_h"])
def test_cli_writes_a_lossless_report_with_plots(tiny_target, drafts, prompts_file, tmp_path, model_type):
    out = tmp_path / "eval" / "report.json"
    code = main(["evaluate", "--draft", str(drafts(model_type)), "--target", str(tiny_target(model_type)),
                 "--bench", "gsm8k", str(prompts_file), "--num-prompts", "2", "--max-new-tokens", "12",
                 "--output", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["settings"]["block_size"] == 4 and report["settings"]["temperature"] == 0.0
    assert report["settings"]["hybrid_target"] == (model_type == "nemotron_h")
    assert report["settings"]["compiled"] is False  # the default compiles on GPUs only
    assert report["settings"]["fused_projection_groups"] == 0  # part of the compiled fast path
    assert report["settings"]["flex_decode_attention"] is False  # so is flex attention
    assert report["settings"]["target_attention"] == "sdpa"  # eager only for float32 on a GPU
    for name in ("gsm8k", "mine"):
        result = report["benchmarks"][name]
        spec = result["speculative"]
        assert result["num_prompts"] == 2 and result["lossless"] == 1.0
        assert sum(spec["accept_length_histogram"].values()) == spec["verify_steps"] > 0
        assert spec["decode_tokens"] == result["autoregressive"]["decode_tokens"]
        assert 1.0 <= spec["tau_pooled"] <= 4.0 and len(spec["slot_acceptance"]) == 3
        assert result["speedup"] > 0
        # Each loop's step time beside its floor (the weights a step reads over the measured bandwidth).
        floors = report["settings"]["floor_ms_per_step"]
        for loop, steps, floor in ((result["autoregressive"], spec["decode_tokens"], floors["plain"]),
                                   (spec, spec["verify_steps"], floors["speculative"])):
            assert loop["ms_per_step"] == pytest.approx(1000 * loop["decode_seconds"] / steps)
            assert loop["floor_ms_per_step"] == floor and loop["vs_floor"] == pytest.approx(loop["ms_per_step"] / floor)
        assert 0 < floors["plain"] < floors["speculative"] and report["settings"]["copy_bandwidth_gb_s"] > 0
        lookup = result["prompt_lookup"]
        # Before 5.25 transformers' assisted decoding refused stateful (Mamba) models: recorded, not faked.
        # 5.25 runs it on them (greedy output equal to plain generate's on the tiny nemotron_h).
        assert lookup["supported"] == (model_type != "nemotron_h" or HYBRID_ASSISTED_DECODING)
        if lookup["supported"]:
            assert lookup["tokens_per_second"] > 0 and lookup["tau_pooled"] >= 1.0
    assert (out.parent / "report_acceptance_histogram.png").stat().st_size > 0
    assert (out.parent / "report_slot_acceptance.png").stat().st_size > 0
    assert report["plots"] == ["report_acceptance_histogram.png", "report_slot_acceptance.png"]
    # the resolved config it ran with: flags land in their config keys
    assert report["config"]["evaluate"]["num_prompts"] == 2 and report["config"]["evaluate"]["benchmarks"] == [
        "gsm8k", str(prompts_file)]
    assert report["config"]["target"]["name_or_path"] == str(tiny_target(model_type))


def test_compiled_evaluation_is_lossless_and_keeps_prompt_lookup_eager(tiny_target, drafts, prompts_file, tmp_path):
    """evaluate.compile (the GPU default), here on the CPU: our loops run compiled layers and stay
    lossless; prompt lookup, transformers' generate with a growing cache, runs the eager layers after."""
    target = tiny_target("qwen3")
    torch._dynamo.reset()  # else graphs of earlier tests' tiny qwen3 serve this one and nothing compiles
    report, ops = compiled_attention(lambda: run_evaluate(
        drafts("qwen3"), target, tmp_path / "r.json", benchmarks=[str(prompts_file)], max_new_tokens=8,
        num_prompts=1, compile=True))
    result = report["benchmarks"]["mine"]
    assert report["settings"]["compiled"] is True and result["lossless"] == 1.0
    # q/k/v and gate/up of each of the target's layers read with one matmul each, beside the compiled layers.
    assert report["settings"]["fused_projection_groups"] == 2 * 6
    # and the target's sdpa attention as flex attention in the compiled steps (tests/target/test_flex_decode.py).
    assert report["settings"]["flex_decode_attention"] is True and "flex_attention" in ops
    assert result["prompt_lookup"]["supported"] and result["prompt_lookup"]["tau_pooled"] >= 1.0


def test_compiled_evaluation_folds_a_grouping_inductor_has_no_decoding_kernel_for(prompts_file, tmp_path):
    """Three query heads a key/value head (SmolLM2's grouping): inductor's flex decoding kernel takes only
    power-of-two groups, so each group's heads go in as query rows; both compiled steps run flex attention,
    the report says so, and decoding stays lossless."""
    target = save_tiny_target(tmp_path / "target", "qwen3", heads=6, kv_heads=2)
    assert flex_decodes(AutoConfig.from_pretrained(target), 4)
    draft = tmp_path / "draft"
    assert main(["draft-init", "--target", str(target), "--output", str(draft), "--num-layers", "1",
                 "--num-taps", "2", "--block-size", "4", "--seed", "1"]) == 0
    torch._dynamo.reset()
    report, ops = compiled_attention(lambda: run_evaluate(
        draft, target, tmp_path / "r.json", benchmarks=[str(prompts_file)], max_new_tokens=8, num_prompts=1,
        compile=True, prompt_lookup=False))
    assert report["settings"]["compiled"] is True and report["settings"]["flex_decode_attention"] is True
    assert "flex_attention" in ops
    assert report["benchmarks"]["mine"]["lossless"] == 1.0


def test_sampled_evaluation_reports_no_lossless_check(tiny_target, drafts, prompts_file, tmp_path):
    report = run_evaluate(drafts("qwen3"), tiny_target("qwen3"), tmp_path / "r.json",
                          benchmarks=[str(prompts_file)], max_new_tokens=8, temperature=0.8, top_k=20,
                          prompt_lookup=False)
    result = report["benchmarks"]["mine"]
    assert result["lossless"] is None and "prompt_lookup" not in result
    assert result["speculative"]["new_tokens"] > 0


def test_an_interrupted_evaluation_resumes_to_the_uninterrupted_report(tiny_target, drafts, prompts_file, tmp_path,
                                                                       monkeypatch):
    """Sampled (T=0.8), two benchmarks. Each finished benchmark is saved beside the report; a run that dies in
    the second leaves no report, and the rerun takes the saved benchmark, runs only the other, and reports the
    same tokens as an uninterrupted run (each benchmark samples from the seed afresh). A partial file left by
    another evaluation is not used."""
    import flashdraft.decoding.evaluate as evaluation

    target, draft = tiny_target("qwen3"), drafts("qwen3")
    fields = dict(benchmarks=["gsm8k", str(prompts_file)], num_prompts=2, max_new_tokens=10, temperature=0.8,
                  prompt_lookup=False)
    straight = run_evaluate(draft, target, tmp_path / "straight" / "report.json", **fields)
    out = tmp_path / "resumed" / "report.json"
    partial = out.with_name("report.partial.json")
    partial.parent.mkdir()
    partial.write_text(json.dumps({"fingerprint": "another evaluation", "benchmarks": {"gsm8k": {"tau": 9}}}))
    measured, bench_report = [], evaluation._bench_report

    def dies_in_the_second(bench, *args):
        measured.append(bench.name)
        if len(measured) == 2:
            raise RuntimeError("machine preempted")
        return bench_report(bench, *args)

    monkeypatch.setattr(evaluation, "_bench_report", dies_in_the_second)
    with pytest.raises(RuntimeError, match="preempted"):
        run_evaluate(draft, target, out, **fields)
    assert measured == ["gsm8k", "mine"] and not out.exists()
    assert list(json.loads(partial.read_text())["benchmarks"]) == ["gsm8k"]

    measured.clear()
    monkeypatch.setattr(evaluation, "_bench_report", lambda bench, *args: measured.append(bench.name)
                        or bench_report(bench, *args))
    resumed = run_evaluate(draft, target, out, **fields)
    assert measured == ["mine"] and out.exists() and not partial.exists()

    def tokens(report: dict) -> dict:
        return {name: (r["per_prompt"], r["speculative"]["accept_length_histogram"])
                for name, r in report["benchmarks"].items()}

    assert tokens(resumed) == tokens(straight) and set(resumed["benchmarks"]) == {"gsm8k", "mine"}


def test_logs_to_mlflow_when_tracking_is_on(tiny_target, drafts, prompts_file, tmp_path):
    import mlflow

    from flashdraft.stages import evaluate as stage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    stage.run(load_config(values={
        "evaluate.draft": str(drafts("qwen3")), "target.name_or_path": str(tiny_target("qwen3")),
        "evaluate.benchmarks": [str(prompts_file)], "evaluate.output": str(tmp_path / "r.json"),
        "evaluate.max_new_tokens": 6, "evaluate.prompt_lookup": False, "tracking.uri": uri,
    }))
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["flashdraft"], output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["flashdraft.step"] == "evaluate"
    assert run.data.metrics["mine.lossless"] == 1.0 and "mine.tau_pooled" in run.data.metrics
    assert run.data.params["evaluate.max_new_tokens"] == "6" and run.data.params["block_size"] == "4"
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"r.json", "r_acceptance_histogram.png", "r_slot_acceptance.png"} <= artifacts


def _edit_config(draft_dir, tmp_path, **changes):
    import shutil

    copy = tmp_path / "edited"
    shutil.copytree(draft_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    for key, value in changes.items():
        if key == "mask_token_id":
            config["dflash_config"]["mask_token_id"] = value
        else:
            config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    "change,match",
    [({"hidden_size": 32}, "hidden size"), ({"vocab_size": 999}, "vocab"), ({"mask_token_id": 5000}, "mask_token_id")],
)
def test_draft_that_does_not_fit_the_target_is_refused(tiny_target, drafts, tmp_path, change, match):
    draft = _edit_config(drafts("qwen3"), tmp_path, **change)
    with pytest.raises(UserError, match=match):
        run_evaluate(draft, tiny_target("qwen3"), tmp_path / "r.json", benchmarks=["gsm8k"])
    assert not (tmp_path / "r.json").exists()


def test_bad_benchmarks_and_budgets_are_clear_errors(tiny_target, drafts, tmp_path, capsys):
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b'{"prompt": "ok"}\n{not json\n')
    with pytest.raises(UserError, match="not JSON"):
        load_benchmark(str(broken))
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UserError, match="cannot read benchmark file"):
        load_benchmark(str(binary))
    with pytest.raises(UserError, match="does not exist"):
        load_benchmark(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="unknown benchmark"):
        load_benchmark("gsm9k")
    no_user = tmp_path / "no_user.jsonl"
    no_user.write_text(json.dumps({"messages": [{"role": "assistant", "content": "x"}]}) + "\n")
    with pytest.raises(UserError, match="user turn"):
        load_benchmark(str(no_user))

    args = ["evaluate", "--draft", str(drafts("qwen3")), "--target", str(tiny_target("qwen3")),
            "--output", str(tmp_path / "r.json")]
    assert main([*args, "--bench", "gsm8k", "--max-new-tokens", "0"]) == 2
    assert "evaluate.max_new_tokens must be >= 1" in capsys.readouterr().err
    assert main([*args, "--bench", str(broken)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_a_benchmark_file_with_line_separators_inside_its_text_loads(tmp_path):
    # JSON writers (ours with ensure_ascii=False among them) leave U+2028 and U+0085 unescaped; they are
    # text inside a row, not the end of one.
    prompts = ["first\u2028line", "next\x85line\u2029"]
    path = tmp_path / "separators.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}, ensure_ascii=False) + "\n"
                            for p in prompts), encoding="utf-8")
    assert [p[0]["content"] for p in load_benchmark(str(path)).prompts] == prompts


def test_packaged_benchmarks_load_offline():
    gsm8k, humaneval, chat = (load_benchmark(name) for name in ("gsm8k", "humaneval", "chat"))
    assert len(gsm8k.prompts) == 1319 and "Janet" in gsm8k.prompts[0][0]["content"]
    assert len(humaneval.prompts) == 164 and "def has_close_elements" in humaneval.prompts[0][0]["content"]
    assert len(chat.prompts) > 100 and all(p[-1]["role"] == "user" for p in chat.prompts)
    assert len(load_benchmark("gsm8k", 5).prompts) == 5


def test_hybrid_on_transformers_that_hides_the_mixer_cache_is_refused_before_loading(
    tiny_target, drafts, tmp_path, monkeypatch
):
    """transformers 5.15 hides the Mamba mixers' signature; simulated here by the same kind of wrapper."""
    from transformers.models.nemotron_h import modeling_nemotron_h

    mixer = modeling_nemotron_h.NemotronHMamba2Mixer
    original = mixer.forward
    monkeypatch.setattr(mixer, "forward", lambda self, *args, **kwargs: original(self, *args, **kwargs))

    def no_loading(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr(FrozenTarget, "load", no_loading)
    with pytest.raises(UserError, match=r'NemotronHMamba2Mixer.*pip install -U "transformers>=5.24"'):
        run_evaluate(drafts("nemotron_h"), tiny_target("nemotron_h"), tmp_path / "r.json", benchmarks=["gsm8k"])
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_measurement_without_vllm_is_refused_before_loading(tiny_target, drafts, prompts_file, tmp_path,
                                                                 capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("weights were loaded before the --vllm check")

    monkeypatch.setattr(FrozenTarget, "load", no_loading)
    report = tmp_path / "r.json"
    assert main(["evaluate", "--draft", str(drafts("qwen3")), "--target", str(tiny_target("qwen3")),
                 "--bench", str(prompts_file), "--output", str(report), "--vllm"]) == 2
    assert "--vllm needs the vllm package" in capsys.readouterr().err
    assert not report.exists()
