"""Warmup on tiny random targets: resume after a kill, settings, formats, and clear errors on bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tiny_models import save_tiny_target, tiny_tokenizer

from flashdraft.cli import main
from flashdraft.config import TargetConfig, WarmupConfig
from flashdraft.data import regenerate as regen
from flashdraft.data.generation import Completion, StaticGenerator
from flashdraft.data.repetition import LOOP_WINDOW, looped_tokens
from flashdraft.data.sampling import Sampling
from flashdraft.data.sources import load_chat_dataset
from flashdraft.data.warmup import run_warmup
from flashdraft.errors import UserError

FAST = {"backend": "static", "max_new_tokens": 8}


def warmup(target, prompts: str, output: Path, **fields):
    """`run_warmup` on one prompt spec; `fields` are WarmupConfig fields."""
    return run_warmup(TargetConfig(name_or_path=str(target)),
                      WarmupConfig(prompts=[prompts], output_dir=str(output), **fields))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # the subprocess runs with OMP_NUM_THREADS=1 too: same numerics


def _prompts(path: Path, n: int) -> str:
    rows = []
    for i in range(n):
        if i % 3 == 2:  # multi-turn, with an original answer that must be replaced
            rows.append({"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "old"},
                                      {"role": "user", "content": f"and {i}?"}]})
        else:
            rows.append({"messages": [{"role": "user", "content": f"question {i}"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.slow
def test_kill_and_rerun_gives_the_uninterrupted_dataset(tiny_target, tmp_path):
    target = str(tiny_target("qwen3"))
    prompts = _prompts(tmp_path / "prompts.jsonl", 48)
    args = ["--target", target, "--prompts", prompts, "--max-new-tokens", "24", "--batch-size", "2",
            "--backend", "static", "--turns", "all", "--seed", "3"]
    out = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-m", "flashdraft.cli", "warmup", *args, "--output", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log_file = regen.completed_path(out / ".partial", 0)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if log_file.exists() and log_file.read_bytes().count(b"\n") >= 3:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (out / "train.jsonl").exists() and not (out / "manifest.json").exists()
    # a kill in the middle of a write leaves a torn last record: it must be dropped, not parsed
    with open(log_file, "ab") as handle:
        handle.write(b'{"batch": 23, "rows": [{"id": "prompts.jsonl:46"')
    killed_lines = log_file.read_bytes().count(b"\n")

    assert main(["warmup", *args, "--output", str(out)]) == 0
    assert main(["warmup", *args, "--output", str(tmp_path / "straight")]) == 0
    resumed = (out / "train.jsonl").read_text()
    assert resumed == (tmp_path / "straight" / "train.jsonl").read_text()
    ids = [json.loads(line)["id"] for line in resumed.splitlines()]
    assert len(ids) == len(set(ids)) == 48
    stats = json.loads((out / "stats.json").read_text())
    assert 0 < stats["run"]["resumed_samples"] == 2 * killed_lines < 48
    assert not (out / ".partial").exists()
    # the answers really are regenerated and the old assistant turn is gone
    rows = [json.loads(line) for line in resumed.splitlines()]
    assert all(m["content"] != "old" for r in rows for m in r["messages"] if m["role"] == "assistant")
    assert sum(len(r["turns"]) for r in rows) == 48 + 16


def test_finished_output_is_reused_and_other_settings_refused(tiny_target, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", 3)
    first = warmup(tiny_target("llama"), prompts, tmp_path / "out", **FAST)
    before = first.dataset.stat().st_mtime_ns
    again = warmup(tiny_target("llama"), prompts, tmp_path / "out", **FAST)
    assert again.dataset.stat().st_mtime_ns == before and again.stats == first.stats
    with pytest.raises(UserError, match="finished warmup with other settings"):
        warmup(tiny_target("llama"), prompts, tmp_path / "out", backend="static", max_new_tokens=9)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["dataset"] == "train.jsonl" and Path(manifest["target_path"]) == tiny_target("llama").resolve()
    assert set(os.listdir(tmp_path / "out")) == {"manifest.json", "summary.json", "stats.json", "train.jsonl",
                                                  "chat_template.jinja"}
    assert first.revision is None and first.target_path == tiny_target("llama").resolve()  # a folder target


def test_a_moved_warmup_is_the_same_warmup_and_an_edited_prompt_file_is_not(tiny_target, tmp_path):
    """Prompt files and a local target compare by content: the answers, the prompts and the target moved
    elsewhere are found finished (nothing answered again; the manifest then names the target where it is now),
    and a prompt file edited in place is other settings."""
    prompts = Path(_prompts(tmp_path / "p.jsonl", 3))
    first = warmup(tiny_target("llama"), str(prompts), tmp_path / "out", **FAST)
    moved = tmp_path / "elsewhere"
    target = shutil.copytree(tiny_target("llama"), moved / "target")
    shutil.copytree(tmp_path / "out", moved / "out")
    shutil.copy(prompts, moved / "p.jsonl")
    before = (moved / "out" / "train.jsonl").stat().st_mtime_ns

    again = warmup(target, str(moved / "p.jsonl"), moved / "out", **FAST)
    assert (moved / "out" / "train.jsonl").stat().st_mtime_ns == before and again.stats == first.stats
    assert again.target_path == target.resolve()
    assert json.loads((moved / "out" / "manifest.json").read_text())["target_path"] == str(target.resolve())

    (moved / "p.jsonl").write_text(prompts.read_text().replace("question 0", "question zero"))
    with pytest.raises(UserError, match="finished warmup with other settings; give a new output folder"):
        warmup(target, str(moved / "p.jsonl"), moved / "out", **FAST)


def test_a_manifest_without_prompt_digests_compares_prompt_files_by_path(tiny_target, tmp_path):
    """Manifests written before the prompt files' sha256 were recorded: the same paths are the same warmup,
    a copy of the file elsewhere is not, and the error says why."""
    prompts = _prompts(tmp_path / "p.jsonl", 3)
    warmup(tiny_target("llama"), prompts, tmp_path / "out", **FAST)
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["settings"]["prompt_sha256"]
    path.write_text(json.dumps(manifest))
    before = (tmp_path / "out" / "train.jsonl").read_bytes()

    assert warmup(tiny_target("llama"), prompts, tmp_path / "out", **FAST).dataset.read_bytes() == before
    shutil.copy(prompts, tmp_path / "copy.jsonl")
    with pytest.raises(UserError, match="predates the prompt files' sha256, so prompt files at other paths"):
        warmup(tiny_target("llama"), str(tmp_path / "copy.jsonl"), tmp_path / "out", **FAST)
    assert (tmp_path / "out" / "train.jsonl").read_bytes() == before


def test_parquet_output_and_recurrent_target(tiny_target, tmp_path):
    result = warmup(tiny_target("nemotron_h"), _prompts(tmp_path / "p.jsonl", 2), tmp_path / "out",
                    format="parquet", **FAST)
    assert result.dataset.name == "train.parquet"
    rows = load_chat_dataset(str(result.dataset))
    assert len(rows) == 2 and rows[0]["messages"][-1]["role"] == "assistant"
    assert result.summary["model_type"] == "nemotron_h"
    assert result.summary["recurrent"]["recurrent_layers"] == 2  # the tiny pattern's two mamba layers


def test_turn_groups_follow_the_original_turns():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
                {"role": "user", "content": "u2b"}, {"role": "assistant", "content": "a2"},
                {"role": "user", "content": "u3"}]
    assert [[m["content"] for m in g] for g in regen.turn_groups(messages)] == [["s", "u1"], ["u2", "u2b"], ["u3"]]


def test_sampled_generation_is_seeded(tiny_target, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", 4)
    runs = [warmup(tiny_target("llama"), prompts, tmp_path / name, temperature=1.0, seed=seed, **FAST)
            for name, seed in [("a", 1), ("b", 1), ("c", 2)]]
    texts = [r.dataset.read_text() for r in runs]
    assert texts[0] == texts[1] != texts[2]


def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_target_without_chat_template(tmp_path, capsys):
    target = save_tiny_target(tmp_path / "base", "llama")
    tiny_tokenizer(chat_template=None).save_pretrained(target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    prompts = _prompts(tmp_path / "p.jsonl", 2)
    argv = ["warmup", "warmup.backend=static", "--target", str(target), "--prompts", prompts,
            "--output", str(tmp_path / "out"), "--max-new-tokens", "4"]
    err = _cli_error(capsys, argv)
    assert "has no chat template" in err and "--chat-template FILE" in err
    assert not (tmp_path / "out").exists()
    template = tmp_path / "chatml.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert main([*argv, "--chat-template", str(template)]) == 0
    assert (tmp_path / "out" / "chat_template.jinja").read_text() == template.read_text()
    resolved = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())  # the config it ran with
    assert resolved["target"]["chat_template"] == str(template) and resolved["warmup"]["max_new_tokens"] == 4
    assert resolved["warmup"]["backend"] == "static"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["chat_template"]["origin"] == str(template)


@pytest.mark.parametrize("content, needle", [
    ("", "is empty"),
    ('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [oops\n', "line 2 is not valid JSON"),
    ('{"text": "no chat"}\n', "no conversation format fits the columns text"),
])
def test_bad_prompt_files(tiny_target, tmp_path, capsys, content, needle):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(content)
    err = _cli_error(capsys, ["warmup", "--target", str(tiny_target("llama")), "--prompts", str(prompts),
                              "--output", str(tmp_path / "out")])
    assert needle in err
    assert not (tmp_path / "out").exists()


def test_bad_options_leave_nothing(tiny_target, tmp_path, capsys):
    target, prompts, out = str(tiny_target("llama")), _prompts(tmp_path / "p.jsonl", 2), tmp_path / "out"
    with pytest.raises(UserError, match="warmup.backend must be one of auto, static, graphed, continuous, vllm, got 'tensorrt'"):
        warmup(target, prompts, out, backend="tensorrt")
    with pytest.raises(SystemExit):
        main(["warmup", "--target", target, "--prompts", prompts, "--output", str(out), "--backend", "tensorrt"])
    assert "invalid choice: 'tensorrt'" in capsys.readouterr().err
    with pytest.raises(UserError, match="no `enable_thinking` switch"):
        warmup(target, prompts, out, thinking=True, **FAST)
    with pytest.raises(UserError, match="needs vLLM"):
        warmup(target, prompts, out, backend="vllm")
    assert not out.exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("precious")
    with pytest.raises(UserError, match="is not empty and is not an earlier output of `flashdraft warmup`"):
        warmup(target, prompts, tmp_path / "busy", **FAST)
    assert os.listdir(tmp_path / "busy") == ["thesis.tex"]
    mismatched = save_tiny_target(tmp_path / "mismatched", "llama", vocab_size=200)  # tokenizer: 260
    with pytest.raises(UserError, match="260 tokens but the model only 200 embedding rows"):
        warmup(mismatched, prompts, out, **FAST)
    assert not out.exists()


def test_unreachable_hub_target_offline(tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", 2)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = subprocess.run(
        [sys.executable, "-m", "flashdraft.cli", "warmup", "--target", "no-such-org/no-such-model", "--prompts",
         prompts, "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")],
        env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "cannot fetch target 'no-such-org/no-such-model' from the hub" in out.stderr and "Offline?" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", ["qwen3", "nemotron_h"])
def test_left_padded_batches_equal_one_prompt_at_a_time(tiny_target, model_type):
    """Batching must not change the answers, also for recurrent (Mamba) layers, which see the padding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_target(model_type)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    render = regen.Renderer(AutoTokenizer.from_pretrained(path))
    prompts = [render([{"role": "user", "content": "x" * n}]) for n in (3, 40, 17)]
    generator = StaticGenerator(model, stop_ids=[2], pad_id=0)
    batched = generator.generate(prompts, Sampling(), [20, 20, 20], [0])
    assert batched == [generator.generate([p], Sampling(), [20], [0])[0] for p in prompts]
    # a shorter limit on one prompt cuts its answer there and leaves the others as they were
    limited = generator.generate(prompts, Sampling(), [20, 5, 20], [0])
    assert limited[1] == generator.generate([prompts[1]], Sampling(), [5], [0])[0]
    assert len(limited[1].token_ids) <= 5 and [limited[0], limited[2]] == [batched[0], batched[2]]
    assert len({len(p) for p in prompts}) == 3 and any(c.token_ids for c in batched)


def test_turns_past_the_context_are_not_generated(tiny_target, tmp_path):
    long = "y" * 600  # the byte tokenizer makes this > 512 tokens, the tiny target's context
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"messages": m}) + "\n" for m in [
        [{"role": "user", "content": "short"}],
        [{"role": "user", "content": long}],
        [{"role": "user", "content": "short"}, {"role": "assistant", "content": "a"},
         {"role": "user", "content": long}],
    ]))
    result = warmup(tiny_target("qwen3"), str(prompts), tmp_path / "out", **FAST)
    rows = [json.loads(line) for line in result.dataset.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p.jsonl:0", "p.jsonl:2"]
    assert [m["role"] for m in rows[1]["messages"]] == ["user", "assistant"]  # ended before the long turn
    assert result.stats["skipped_too_long"] == 1 and result.stats["samples"] == 2
    # --max-length lowers the limit below the target's context (e.g. to the training max length)
    two_turns = tmp_path / "two.jsonl"
    two_turns.write_text(json.dumps({"messages": [{"role": "user", "content": "short"},
                                                  {"role": "assistant", "content": "a"},
                                                  {"role": "user", "content": "more"}]}) + "\n")
    turns = [len(json.loads(warmup(tiny_target("qwen3"), str(two_turns), tmp_path / f"cap{cap}", turns="all",
                                       max_length=cap, **FAST).dataset.read_text())["turns"]) for cap in (None, 40)]
    assert turns == [2, 1]
    # A limit past the context does not skip a prompt: its answer stops at the context.
    capped = warmup(tiny_target("qwen3"), str(two_turns), tmp_path / "capped", backend="static", max_new_tokens=600,
                    max_length=60)
    (row,) = [json.loads(line) for line in capped.dataset.read_text().splitlines()]
    assert row["prompt_tokens"] + row["completion_tokens"] <= 60
    with pytest.raises(UserError, match="no prompt leaves room for an answer"):
        warmup(tiny_target("qwen3"), str(prompts), tmp_path / "out2", backend="static", max_length=8)
    assert not (tmp_path / "out2").exists()


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_thinking_switch_reaches_the_chat_template(tmp_path):
    target = save_tiny_target(tmp_path / "thinker", "llama")
    tokenizer = tiny_tokenizer(chat_template=THINKING_TEMPLATE)
    tokenizer.save_pretrained(target)
    chat = [{"role": "user", "content": "hi"}]
    rendered = {mode: tokenizer.decode(regen.Renderer(tokenizer, mode)(chat)) for mode in (None, True, False)}
    assert "<think>" in rendered[False] and "<think>" not in rendered[True] and rendered[None] == rendered[True]
    prompts = _prompts(tmp_path / "p.jsonl", 2)
    result = warmup(target, prompts, tmp_path / "out", thinking=False, **FAST)
    assert result.summary["chat_template"]["supports_thinking"] and result.manifest["settings"]["thinking"] is False
    assert len(load_chat_dataset(str(result.dataset))) == 2


def test_batches_hold_prompts_of_similar_length_and_the_dataset_keeps_prompt_order(tmp_path, monkeypatch):
    """Within a window, prompts are sorted by number of turns, then by length, before batching (a batch
    runs one round per turn of its longest chat and pads to its longest prompt); the dataset still
    comes out in prompt order, each answer with its own prompt, and a resumed run writes the same file."""
    monkeypatch.setattr(regen, "WINDOW_BATCHES", 2)
    tokenizer = tiny_tokenizer()
    lengths = [5, 300, 7, 6, 280, 290, 9, 8, 310, 3, 10, 2]  # batch 3, window 6 prompts
    rows = [{"id": f"p{i}", "source": "test", "messages": [{"role": "user", "content": "x" * (n - 1) + str(i)}]}
            for i, n in enumerate(lengths)]
    # a three-turn chat (short prompts) joins the long one-turn prompts, which come after all one-turn ones
    rows[7]["messages"] += [{"role": "assistant", "content": "old"}, {"role": "user", "content": "more"},
                            {"role": "assistant", "content": "old"}, {"role": "user", "content": "again"}]

    class LastTokens:  # the answer depends on the prompt alone: any mix-up of rows shows
        def generate(self, prompts, sampling, limits, seeds):
            return [Completion(list(p[-4:]), "stop") for p in prompts]

    def run(work: Path) -> str:
        regen.regenerate(rows, tokenizer=tokenizer, generator=LastTokens(), sampling=Sampling(), max_new_tokens=8,
                         work_dir=work, batch_size=3)
        regen.assemble(work, work / "train.jsonl", [r["id"] for r in rows])
        return (work / "train.jsonl").read_text()

    straight = run(tmp_path / "straight")
    log = [json.loads(line) for line in regen.completed_path(tmp_path / "straight", 0).read_text().splitlines()]
    assert [set(r["indices"]) for r in log] == [{0, 2, 3}, {1, 4, 5}, {6, 9, 11}, {7, 8, 10}]
    out = [json.loads(line) for line in straight.splitlines()]
    assert [r["id"] for r in out] == [r["id"] for r in rows]
    for row, original in zip(out, rows, strict=True):
        history = [m for m in row["messages"] if m["role"] != "assistant"]
        assert history == [m for m in original["messages"] if m["role"] != "assistant"]
        prompt = regen.Renderer(tokenizer)(row["messages"][:-1])
        assert row["messages"][-1]["content"] == tokenizer.decode(prompt[-4:], skip_special_tokens=False)

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    kept = regen.completed_path(tmp_path / "straight", 0).read_text().splitlines(keepends=True)[:3]
    regen.completed_path(resumed, 0).write_text("".join(kept))
    assert run(resumed) == straight


def test_looped_tokens_counts_verbatim_repeats_of_a_window():
    assert looped_tokens(list(range(100)), window=4) == 0
    # a 5-token phrase said 4 times: every token after the first window-long stretch repeats one
    assert looped_tokens([1, 2, 3, 4, 5] * 4, window=4) == 20 - 4 - 4
    assert looped_tokens([7] * 10, window=4) == 6
    assert looped_tokens([7] * 3, window=4) == 0  # shorter than the window


def test_stats_report_the_looped_share_and_warn_on_loops(tmp_path, caplog):
    """An answer that loops is counted token by token (the regenerated batches keep the counts, so a
    resumed run reports the same share) and above the threshold the warmup says so; distinct tokens
    report zero and no warning."""
    tokenizer = tiny_tokenizer()
    rows = [{"id": f"p{i}", "source": "test", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(4)]
    phrase = list(range(10, 50))  # 40 distinct tokens, longer than the window

    class Answers:
        def __init__(self, looping: bool):
            self.looping = looping

        def generate(self, prompts, sampling, limits, seeds):
            ids = phrase * 3 if self.looping else list(range(10, 130))
            return [Completion(ids[:limit], "length") for limit in limits]

    def stats(looping: bool, work: Path) -> dict:
        regen.regenerate(rows, tokenizer=tokenizer, generator=Answers(looping), sampling=Sampling(),
                         max_new_tokens=120, work_dir=work, batch_size=2)
        return regen.assemble(work, work / "train.jsonl", [r["id"] for r in rows])

    with caplog.at_level("WARNING", logger="flashdraft.data.regenerate"):
        looped = stats(True, tmp_path / "loops")
    assert looped["looped_fraction"] == round((120 - 40 - (LOOP_WINDOW - 1)) / 120, 4)
    assert "loops at these sampling settings" in caplog.text and "warmup.temperature" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="flashdraft.data.regenerate"):
        assert stats(False, tmp_path / "plain")["looped_fraction"] == 0.0
    assert "loops" not in caplog.text


def test_a_finished_output_of_an_older_version_without_loop_counts_is_reused(tiny_target, tmp_path, capsys):
    """Outputs written before warmup counted looped tokens have no looped_fraction: rerunning the same
    warmup reuses them and reports without it, instead of failing on the missing number."""
    args = ["warmup", "--target", str(tiny_target("llama")), "--prompts", _prompts(tmp_path / "p.jsonl", 3),
            "--output", str(tmp_path / "out"), "--backend", "static", "--max-new-tokens", "8"]
    assert main(args) == 0
    assert "looped ->" in capsys.readouterr().out
    stats_file = tmp_path / "out" / "stats.json"
    stats = json.loads(stats_file.read_text())
    assert 0.0 <= stats.pop("looped_fraction") <= 1.0
    stats_file.write_text(json.dumps(stats))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "truncated ->" in out and "looped" not in out


@pytest.mark.parametrize("device, steps, compiled", [("cuda", 40_000, True), ("cuda", 39_999, False),
                                                     ("cpu", 10**7, False)])
def test_graphed_layers_compile_on_gpus_when_the_run_repays_the_compilation(device, steps, compiled):
    from flashdraft.target.batch_decoder import compiles_layers

    assert compiles_layers(torch.device(device), steps) is compiled


def test_warmup_counts_its_decode_steps_for_the_compile_rule(tiny_target, tmp_path, monkeypatch):
    """10 prompts in batches of 4, up to 8 new tokens: 3 batches of up to 8 decode steps on the one rank."""
    import flashdraft.data.warmup as warmup_module

    seen, real = {}, warmup_module.load_generator

    def spy(*args, **kwargs):
        seen["steps"] = kwargs["decode_steps"]
        return real(*args, **kwargs)

    monkeypatch.setattr(warmup_module, "load_generator", spy)
    warmup(tiny_target("llama"), _prompts(tmp_path / "p.jsonl", 10), tmp_path / "out", batch_size=4, **FAST)
    assert seen["steps"] == 3 * 8
