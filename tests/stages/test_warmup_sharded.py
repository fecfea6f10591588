"""Regeneration at scale on the CPU: the continuous-batching and graphed backends answer like static batches,
the warmup sharded over 2 gloo ranks (torchrun) writes the one-process dataset byte for byte, and a
sharded run killed mid-shard resumes (on any number of ranks) to the same bytes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from flashdraft import cli
from flashdraft.data import regenerate as regen
from flashdraft.data.generation import (
    ContinuousGenerator,
    GraphedGenerator,
    StaticGenerator,
    completion,
    resolve_backend,
)
from flashdraft.data.sampling import Sampling, choose
from flashdraft.errors import UserError
from flashdraft.target.batch_decoder import kv_cache_bytes
from flashdraft.target.cache_kwarg import cache_kwarg
from train_helpers import as_in_a_cpu_subprocess, cpu_env


def _prompts(path, n: int) -> str:
    rows = ({"messages": [{"role": "user", "content": f"question number {i} " * (1 + i % 4)}]} for i in range(n))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def warmup_args(target, prompts, output) -> list[str]:
    return ["warmup", "--target", str(target), "--prompts", prompts, "--output", str(output), "--max-new-tokens", "20",
            "--batch-size", "2", "--backend", "static", "--seed", "5"]


def warmup_command(target, prompts, output, nproc: int) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*launcher, "-m", "flashdraft.cli", *warmup_args(target, prompts, output)]


def warmup_here(target, prompts, output) -> None:
    """The one-process warmup, in this process: no interpreter to start."""
    with as_in_a_cpu_subprocess():
        assert cli.main(warmup_args(target, prompts, output)) == 0


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun starts its workers in sessions of their own)."""
    import psutil

    root = psutil.Process(pid)
    for process in [*root.children(recursive=True), root]:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=cpu_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


# Prompts of four lengths (a left-padded batch), as token ids of the tiny target.
PADDED = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17], [40, 41]]


def _tiny_model(tiny_target):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_target("qwen3"), dtype=torch.float32).eval()


def test_continuous_batching_answers_like_static_batches(tiny_target):
    model, prompts, limits = _tiny_model(tiny_target), PADDED, [12, 3, 12, 7]
    static = StaticGenerator(model, stop_ids=[2], pad_id=0).generate(prompts, Sampling(), limits, [0])
    continuous = ContinuousGenerator(model, stop_ids=[2], pad_id=0)
    try:
        assert continuous.generate(prompts, Sampling(), limits, [0]) == static
        assert continuous.generate(prompts[:2], Sampling(), limits[:2], [0]) == static[:2]  # the manager is reused
    finally:
        continuous.close()
    assert [len(c.token_ids) <= limit for c, limit in zip(static, limits)] == [True] * 4


def test_graphed_backend_answers_like_static_batches(tiny_target):
    """Greedy, float32: one static cache for the whole left-padded batch, its decode steps replayed as
    graphs on a GPU (eager here, the same code): the same answers as transformers' `generate`, with
    each prompt's limit and stop tokens; stopping early once every row has stopped (past the first
    stop check) changes nothing. Sampled answers are fixed by the batch seed."""
    model, prompts, limits = _tiny_model(tiny_target), PADDED, [40, 3, 40, 17]
    static = StaticGenerator(model, stop_ids=[2], pad_id=0).generate(prompts, Sampling(), limits, [0])
    graphed = GraphedGenerator(model, stop_ids=[2], pad_id=0)
    assert graphed.generate(prompts, Sampling(), limits, [0]) == static
    assert [len(c.token_ids) for c in static] == limits  # no stop token met: every answer runs to its limit
    # Stop tokens that every row meets within its first 5 tokens: all rows stop long before the limit.
    stops = sorted({c.token_ids[4] for c in static if len(c.token_ids) > 4} | {static[1].token_ids[2]})
    stopping = StaticGenerator(model, stop_ids=stops, pad_id=0).generate(prompts, Sampling(), limits, [0])
    assert GraphedGenerator(model, stop_ids=stops, pad_id=0).generate(prompts, Sampling(), limits, [0]) == stopping
    assert all(c.finish_reason == "stop" and len(c.token_ids) <= 4 for c in stopping)
    hot = Sampling(temperature=1.0)
    sampled = graphed.generate(prompts, hot, limits, [7])
    assert graphed.generate(prompts, hot, limits, [7]) == sampled != static
    assert graphed.generate(prompts, hot, limits, [8]) != sampled


def test_graphed_rows_take_waiting_prompts_and_answer_like_static_batches(tiny_target):
    """Fewer rows than prompts (greedy, float32): a row whose prompt stopped or reached its limit takes the next
    waiting prompt into its slots of the ring cache, and every answer is still transformers' `generate`'s: with
    long and short limits, prompts of other lengths than the first rows', stop tokens, a ring that wraps
    (prompts taken late, with long limits), and one row for all. Sampled answers are fixed by the seed."""
    from flashdraft.target.batch_decoder import BatchDecoder

    model = _tiny_model(tiny_target)
    prompts = [*PADDED, [7, 8], [30, 31, 32, 33, 34, 35, 36, 37], [50], [60, 61, 62]]
    limits = [40, 3, 33, 17, 5, 30, 2, 36]
    static = StaticGenerator(model, stop_ids=[2], pad_id=0).generate(prompts, Sampling(), limits, [0])
    assert [len(c.token_ids) for c in static] == limits
    stops = sorted({c.token_ids[6] for c in static if len(c.token_ids) > 6})
    stopping = StaticGenerator(model, stop_ids=stops, pad_id=0).generate(prompts, Sampling(), limits, [0])
    assert any(c.finish_reason == "stop" for c in stopping) and any(c.finish_reason == "length" for c in stopping)
    decoder = BatchDecoder(model, pad_id=0)
    greedy = lambda logits: logits.argmax(-1)  # noqa: E731
    for rows in (3, 1):
        for stop_ids, expected in (([2], static), (stops, stopping)):
            answers = decoder.decode(prompts, limits, stop_ids, greedy, rows=rows)
            got = [completion(a, set(stop_ids), limit) for a, limit in zip(answers, limits)]
            assert got == expected, (rows, stop_ids)
    generator = torch.Generator().manual_seed(3)
    hot = lambda logits: choose(logits, Sampling(temperature=1.0), generator)[0]  # noqa: E731
    sampled = decoder.decode(prompts, limits, [2], hot, rows=3)
    generator.manual_seed(3)
    assert decoder.decode(prompts, limits, [2], hot, rows=3) == sampled


def test_graphed_prefills_in_chunks_answer_like_static_batches(tiny_target, monkeypatch):
    """Prompts prefilled a few at a time (PREFILL_ROWS, which bounds a prefill's memory when a thousand rows
    decode at once), the first rows' and the refills' alike, in chunks of uneven size: every greedy answer is
    still transformers' `generate`'s, all rows at once and 5 rows taking the waiting prompts."""
    from flashdraft.target import batch_decoder

    model = _tiny_model(tiny_target)
    prompts = [*PADDED, [7, 8], [30, 31, 32, 33, 34, 35, 36, 37], [50], [60, 61, 62], [70, 71, 72, 73, 74]]
    limits = [40, 3, 33, 17, 5, 30, 2, 36, 4]
    static = StaticGenerator(model, stop_ids=[2], pad_id=0).generate(prompts, Sampling(), limits, [0])
    decoder = batch_decoder.BatchDecoder(model, pad_id=0)
    for chunk in (1, 3):
        monkeypatch.setattr(batch_decoder, "PREFILL_ROWS", chunk)
        for rows in (None, 5):
            answers = decoder.decode(prompts, limits, [2], lambda logits: logits.argmax(-1), rows=rows)
            assert [completion(a, {2}, limit) for a, limit in zip(answers, limits)] == static, (chunk, rows)


def test_a_graphed_warmup_with_fewer_rows_writes_the_same_greedy_answers(tiny_target, tmp_path):
    """`warmup.rows` end to end (the graphed backend, here on the CPU): batches of 5 prompts decoded 2 rows at a
    time answer greedily what the whole batches answer, and the manifest records the setting."""
    prompts = _prompts(tmp_path / "p.jsonl", 9)
    args = ["warmup", "--target", str(tiny_target("qwen3")), "--prompts", prompts, "--max-new-tokens", "12",
            "--batch-size", "5", "--backend", "graphed", "--temperature", "0"]
    answers = {}
    for rows in (None, 2):
        out = tmp_path / f"rows_{rows}"
        with as_in_a_cpu_subprocess():
            assert cli.main([*args, "--output", str(out), *(["--rows", str(rows)] if rows else [])]) == 0
        answers[rows] = [json.loads(line)["messages"] for line in (out / "train.jsonl").read_text().splitlines()]
        assert json.loads((out / "manifest.json").read_text())["settings"].get("rows") == rows
    assert len(answers[2]) == 9 and answers[2] == answers[None]


def test_rows_with_auto_resolving_to_another_backend_is_refused_before_decoding(tiny_target, tmp_path, capsys):
    """warmup.rows with backend auto: on a CPU auto takes static batches, so the rows cannot apply; the error
    names the resolved backend and the fix, and no output folder is left (a named backend is refused earlier,
    by the config: docs/bad-inputs.md)."""
    out = tmp_path / "out"
    args = ["warmup", "--target", str(tiny_target("qwen3")), "--prompts", _prompts(tmp_path / "p.jsonl", 3),
            "--output", str(out), "--rows", "2"]
    with as_in_a_cpu_subprocess():
        assert cli.main(args) == 2
    assert "warmup.rows is the graphed backend's, and this warmup runs the static backend" in capsys.readouterr().err
    assert not out.exists()


@torch._dynamo.config.patch(recompile_limit=1)  # restored after the test
def test_graphed_backend_compiled_layers_answer_like_eager_ones_with_one_graph_a_layer(tiny_target):
    """The GPU default, here with inductor on the CPU (float32, greedy): compiled decode-step layers give
    the eager layers' answers, and batches of other rows and cache sizes reuse the layers' graphs (a fixed-shape
    graph would compile every layer again for each batch, and past dynamo's recompile limit, whose start
    here is 1, run them eagerly without a word)."""
    from torch._dynamo.utils import counters

    from flashdraft.target.batch_decoder import BatchDecoder

    torch._dynamo.reset()  # no graphs of earlier tests' layers: the limit of 1 is then this test's alone
    model = _tiny_model(tiny_target)
    greedy = lambda logits: logits.argmax(-1)  # noqa: E731
    batches = [(PADDED, [12, 3, 12, 7]), (PADDED[:3] + [[7] * 9, [3, 4]], [5, 9, 2, 6, 8]), ([[21, 22]], [6])]
    eager = BatchDecoder(model, pad_id=0, compile_layers=False)
    compiled = BatchDecoder(model, pad_id=0, compile_layers=True)
    assert eager.layers is None and compiled.layers is not None
    hits = sum(n for reason, n in counters["unimplemented"].items() if "recompile limit" in reason)
    graphs = []
    for prompts, limits in batches:
        assert compiled.decode(prompts, limits, [2], greedy) == eager.decode(prompts, limits, [2], greedy)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[0] > 0  # 5 rows and a wider cache: no new graph
    assert sum(n for reason, n in counters["unimplemented"].items() if "recompile limit" in reason) == hits
    assert not any("forward" in vars(layer) for layer in model.model.layers)  # eager again outside a decode


def test_graphed_backend_out_of_memory_names_the_batch_and_the_fix(tiny_target, monkeypatch):
    """A batch whose cache and prefill do not fit is a UserError naming its rows and size, the KV cache it needs
    (counted as transformers allocates it) and the settings to change, not a CUDA traceback."""
    from transformers import StaticCache

    model, prompts, limits = _tiny_model(tiny_target), PADDED, [40, 3, 40, 17]
    graphed = GraphedGenerator(model, stop_ids=[2], pad_id=0)
    cache = StaticCache(config=model.config, max_cache_len=6 + 40)
    model(input_ids=torch.ones((4, 1), dtype=torch.long), use_cache=True, **{cache_kwarg(model): cache})
    allocated = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(graphed.decoder, "decode", full)
    with pytest.raises(UserError) as raised:
        graphed.generate(prompts, Sampling(), limits, [0])
    assert str(raised.value) == (
        "warmup.backend graphed ran out of GPU memory on 4 rows of a batch of 4 prompts, each row holding up to 46 "
        f"tokens of prompt and answer (a {allocated / 2**30:.1f} GiB KV cache, besides the prefill's activations); "
        "lower warmup.rows, warmup.batch_size or warmup.max_length (in a new output folder: each changes the "
        "batches), or use warmup.backend continuous")
    assert kv_cache_bytes(model.config, 4 * 46, torch.float32) == allocated
    fewer = GraphedGenerator(model, stop_ids=[2], pad_id=0, rows=2)
    monkeypatch.setattr(fewer.decoder, "decode", full)
    with pytest.raises(UserError, match="on 2 rows of a batch of 4 prompts, each row holding up to 46 tokens"):
        fewer.generate(prompts, Sampling(), limits, [0])


def test_graphed_backend_refuses_hybrid_and_sliding_window_targets(tiny_target):
    """Before any weights load: a Mamba state is not a static KV cache, and the backend's masks would
    ignore a sliding window."""
    from transformers import AutoConfig, Qwen3Config

    config = AutoConfig.from_pretrained(tiny_target("nemotron_h"))
    with pytest.raises(UserError, match="warmup.backend graphed decodes attention-only targets"):
        resolve_backend("graphed", config, torch.device("cpu"))
    sliding = Qwen3Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=0,
                          layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(UserError, match="qwen3 has sliding-window attention layers.*use warmup.backend static"):
        resolve_backend("graphed", sliding, torch.device("cpu"))
    full = AutoConfig.from_pretrained(tiny_target("qwen3"))
    assert resolve_backend("graphed", full, torch.device("cpu")) == "graphed"


def test_auto_backend_takes_the_fastest_that_serves_the_target(tiny_target):
    """On a GPU, auto means graphed where it can decode the target (10x static batches on SmolLM2 in
    benchmarks/RESULTS.md), continuous batching for sliding windows, static for hybrids; static on a CPU.
    (No vLLM here: where it is installed, auto takes it on a GPU.)"""
    from transformers import AutoConfig, Qwen3Config

    full = AutoConfig.from_pretrained(tiny_target("qwen3"))
    hybrid = AutoConfig.from_pretrained(tiny_target("nemotron_h"))
    sliding = Qwen3Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=0,
                          layer_types=["sliding_attention", "full_attention"])
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert [resolve_backend("auto", c, gpu) for c in (full, sliding, hybrid)] == ["graphed", "continuous", "static"]
    assert {resolve_backend("auto", c, cpu) for c in (full, sliding, hybrid)} == {"static"}


PROMPTS = 24


@pytest.fixture(scope="module")
def straight(tiny_target, tmp_path_factory):
    """The prompts warmed up straight through by one process and by 2 ranks: the reference datasets of
    both tests below (read only)."""
    root = tmp_path_factory.mktemp("warmup-sharded")
    target, prompts = tiny_target("qwen3"), _prompts(root / "p.jsonl", PROMPTS)
    warmup_here(target, prompts, root / "one")
    run(warmup_command(target, prompts, root / "two", nproc=2))
    return target, prompts, root / "one", root / "two"


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_write_the_one_process_dataset(straight):
    _, _, one_dir, two_dir = straight
    one, two = (one_dir / "train.jsonl").read_bytes(), (two_dir / "train.jsonl").read_bytes()
    assert one == two and len(one.splitlines()) == PROMPTS
    stats = json.loads((two_dir / "stats.json").read_text())
    assert stats["run"]["ranks"] == 2 and stats["samples"] == PROMPTS


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sharded_run_killed_mid_shard_resumes_to_the_same_bytes(straight, tmp_path):
    target, prompts, _, two_dir = straight
    out = tmp_path / "killed"
    proc = subprocess.Popen(warmup_command(target, prompts, out, nproc=2), env=cpu_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    work = out / ".partial"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        counts = [regen.completed_path(work, r).read_bytes().count(b"\n") if regen.completed_path(work, r).exists()
                  else 0 for r in (0, 1)]
        if min(counts) >= 1 and sum(counts) >= 3:
            kill_tree(proc.pid)  # every rank at once, as a lost node would
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (out / "train.jsonl").exists()
    warmup_here(target, prompts, out)  # resumed by one process, which takes over both shards
    assert (out / "train.jsonl").read_bytes() == (two_dir / "train.jsonl").read_bytes()
    resumed = json.loads((out / "stats.json").read_text())["run"]["resumed_samples"]
    assert 0 < resumed < PROMPTS
