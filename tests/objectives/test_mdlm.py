"""The mdlm objective: loss against an explicit loop, bidirectional attention, masking statistics, split
invariance (in process and over 2 gloo ranks), export, and the errors for bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from diffusion_helpers import (EPS, MASK_ID, ROWS, global_step_grads, load_model, make_batch, make_objective, sample,
                               save_model)
from flashdraft import cli
from flashdraft.config import load_config
from flashdraft.errors import UserError
from flashdraft.objectives import get_objective
from flashdraft.target.source import load_target_config, load_tokenizer
from flashdraft.train.models import export_trained
from train_helpers import TESTS, alphabet_chats, tiny_train_args

def reference_draws(seed: int, step: int, sample_id: int, length: int) -> tuple[float, torch.Tensor]:
    """The documented corruption, drawn again: t first, then one uniform per position."""
    from flashdraft.objectives.dflash import sample_seed

    gen = torch.Generator().manual_seed(sample_seed(seed, step, sample_id))
    t = float(torch.rand(1, generator=gen, dtype=torch.float64))
    return (1 - EPS) * t + EPS, torch.rand(length, generator=gen)


def test_loss_matches_an_explicit_loop(bidirectional_model):
    objective = make_objective(bidirectional_model)
    model = load_model(objective)
    batch = make_batch(ROWS)
    prepared = objective.prepare(batch, step=5)
    loss_sum, sums = objective.loss(model, prepared)
    loss = float(loss_sum.detach()) / prepared.num_targets

    # Reference: one unpadded sequence at a time, the model's own (bidirectional) attention, no 4D mask.
    total, supervised = 0.0, 0
    with torch.no_grad():
        for sid, length in ROWS:
            ids, loss_mask = sample(sid, length)
            p, draws = reference_draws(0, 5, sid, length)
            noisy = ids.clone()
            masked = [i for i in range(length) if loss_mask[i] and draws[i] < p]
            for i in masked:
                noisy[i] = MASK_ID
            logits = model(input_ids=noisy[None]).logits[0]
            for i in masked:
                total += -float(torch.log_softmax(logits[i].double(), dim=-1)[ids[i]]) / p
            supervised += int(loss_mask.sum())
    assert prepared.num_targets == supervised
    assert int(sums["masked"]) > 0
    assert abs(loss - total / supervised) <= 1e-5 * max(1.0, abs(loss))


def test_model_sees_future_tokens(causal_model):
    objective = make_objective(causal_model, **{"objective.allow_causal_model": "true"})
    model = load_model(objective).eval()
    ids = torch.randint(4, 260, (2, 12), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 9] = MASK_ID
    attention = torch.ones_like(ids)
    attention[1, 10:] = 0  # padding: keys past a row's end stay invisible
    with torch.no_grad():
        before = objective.logits(model, ids, attention, causal=False)
        after = objective.logits(model, changed, attention, causal=False)
        causal_before = objective.logits(model, ids, attention, causal=True)
        causal_after = objective.logits(model, changed, attention, causal=True)
        pad_changed = ids.clone()
        pad_changed[1, 11] = 7
        padded = objective.logits(model, pad_changed, attention, causal=False)
    assert (before[:, :9] - after[:, :9]).abs().amax() > 1e-3  # earlier positions read position 9
    torch.testing.assert_close(causal_before[:, :9], causal_after[:, :9], rtol=0, atol=0)
    torch.testing.assert_close(padded[1, :10], before[1, :10], rtol=0, atol=0)


def test_masking_rates_match_p(bidirectional_model):
    objective = make_objective(bidirectional_model)
    n, length = 1500, 40
    batch = make_batch([(sid, length) for sid in range(n)])
    prepared = objective.prepare(batch, step=3)
    supervised = batch.loss_mask
    assert not (prepared.masked & ~supervised).any()
    assert torch.equal(prepared.noisy_ids == MASK_ID, prepared.masked)
    assert torch.equal(prepared.noisy_ids[~prepared.masked], batch.input_ids[~prepared.masked])

    p = prepared.mask_prob[:, 0].double()
    assert torch.equal(prepared.mask_prob, prepared.mask_prob[:, :1].expand(-1, length))
    # Per-token draws: masked count against sum of p over supervised tokens, binomial variance, 5 sigma.
    n_sup = supervised.sum(dim=1).double()
    expected, variance = float((n_sup * p).sum()), float((n_sup * p * (1 - p)).sum())
    z = (float(prepared.masked.sum()) - expected) / math.sqrt(variance)
    assert abs(z) < 5, z
    # t = (p - eps) / (1 - eps) ~ U(0, 1): Kolmogorov-Smirnov statistic under its 0.1% critical value.
    t = ((p - EPS) / (1 - EPS)).sort().values
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = float(torch.maximum(grid - t, t - (grid - 1 / n)).max())
    assert ks < 1.95 / math.sqrt(n), ks
    assert float(p.min()) >= EPS and float(p.max()) <= 1.0

    # Deterministic per (seed, step, sample id): the same sample in another batch, padded differently.
    alone = objective.prepare(make_batch([(7, length), (n + 1, length + 9)]), step=3)
    assert torch.equal(alone.masked[0, :length], prepared.masked[7])
    assert not torch.equal(objective.prepare(batch, step=4).masked, prepared.masked)


def test_gradients_do_not_depend_on_the_split(bidirectional_model):
    objective = make_objective(bidirectional_model)
    model = load_model(objective)
    one, loss_one = global_step_grads(objective, model, [make_batch(ROWS)])
    two, loss_two = global_step_grads(objective, model, [make_batch(ROWS[:2]), make_batch(ROWS[2:])])
    four, _ = global_step_grads(objective, model, [make_batch([row]) for row in ROWS])
    assert abs(loss_one - loss_two) < 1e-5
    for name, grad in one.items():
        torch.testing.assert_close(two[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(four[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for g in one.values())


def probe(jobs: list[tuple[str, list[str]]]) -> None:
    """Run as a script (alone or under torchrun): the gradients of step 0 of each trainer, gathered, to OUT."""
    from torch.distributed.tensor import DTensor

    from flashdraft.train.distributed import teardown
    from flashdraft.train.trainer import Trainer

    for out, overrides in jobs:
        trainer = Trainer(load_config(None, overrides))
        sums = trainer.accumulate_gradients(0)
        grads = {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                 for name, p in trainer.model.named_parameters()}
        if trainer.dist.is_main:
            torch.save({"grads": grads, "sums": sums}, out)
    teardown()


def run_probe(jobs: dict[str, list[str]], tmp_path: Path, nproc: int = 0) -> dict[str, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    outs = {name: str(tmp_path / f"{name}.pt") for name in jobs}
    launcher = [sys.executable]
    if nproc:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    spec = json.dumps([[outs[name], overrides] for name, overrides in jobs.items()])
    done = subprocess.run([*launcher, __file__, spec], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": TESTS}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: torch.load(out) for name, out in outs.items()}


@pytest.mark.slow
@pytest.mark.distributed
def test_same_gradients_on_two_ranks(tmp_path):
    """The trainer itself: 1 process x 4 samples vs 2 gloo ranks x (1 sample x 2 accumulation), mdlm and hybrid."""
    model = save_model(tmp_path / "model", bidirectional=True)
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=8, length=24)
    lines = data.read_text().splitlines()  # different lengths, so micro-batches pad differently
    data.write_text("".join(line.replace('"go"', '"' + "go " * i + '"') + "\n" for i, line in enumerate(lines)))

    def args(name, objective, micro, accum):
        return tiny_train_args(model, data, tmp_path / name, **{
            "objective.name": objective, "objective.mask_token_id": MASK_ID, "objective.masking": "block",
            "objective.mask_block_size": 8, "train.micro_batch_size": micro, "train.grad_accum_steps": accum})

    objectives = ("mdlm", "hybrid")
    (tmp_path / "one").mkdir()
    probe([(str(tmp_path / "one" / f"{s}.pt"), args(f"one-{s}", s, 4, 1)) for s in objectives])  # in process
    one = {s: torch.load(tmp_path / "one" / f"{s}.pt") for s in objectives}
    ranks = run_probe({s: args(f"ranks-{s}", s, 1, 2) for s in objectives}, tmp_path / "ranks", nproc=2)
    for s in objectives:
        assert float(one[s]["sums"]["masked"]) > 0
        for key in ("targets", "masked"):
            assert torch.equal(ranks[s]["sums"][key], one[s]["sums"][key]), (s, key)
        torch.testing.assert_close(ranks[s]["sums"]["loss_sum"], one[s]["sums"]["loss_sum"], rtol=1e-6, atol=1e-5)
        for name, grad in one[s]["grads"].items():
            torch.testing.assert_close(ranks[s]["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=f"{s} {name}")


@pytest.mark.parametrize("name", ["mdlm", "hybrid"])
def test_flop_count_matches_measured_matmuls(bidirectional_model, name):
    """The MFU numerator: our matmul FLOPs == what torch's FlopCounterMode counts (attention aside: the CPU
    SDPA path is not counted there), forward and backward, LM head over every position."""
    from torch.utils.flop_counter import FlopCounterMode

    objective = make_objective(bidirectional_model, name)
    model = load_model(objective)
    prepared = objective.prepare(make_batch([(0, 16), (1, 16)]), step=0)  # no padding: every token is useful
    with FlopCounterMode(display=False) as counter:
        loss_sum, _ = objective.loss(model, prepared)
        loss_sum.backward()
    measured = sum(n for op, n in counter.get_flop_counts()["Global"].items() if "mm" in str(op))
    objective.layer_flops.attention_layers = 0
    expected = objective.flops(prepared)
    assert abs(measured - expected) / measured < 0.01, (measured, expected)


def export(objective, model, path: Path) -> Path:
    """What the trainer exports after training `model`."""
    target_config = load_target_config(objective.config.target.name_or_path)
    return export_trained(objective.config, objective, target_config, model.state_dict(), path)


def test_export_round_trips(bidirectional_model, tmp_path):
    objective = make_objective(bidirectional_model)
    model = load_model(objective)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)
    export(objective, model, tmp_path / "export")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32)
    trained = model.state_dict()
    for name, value in loaded.state_dict().items():
        torch.testing.assert_close(value, trained[name], rtol=0, atol=0, msg=name)
    assert loaded.config.is_causal is False
    assert load_tokenizer(str(tmp_path / "export")).convert_ids_to_tokens(MASK_ID) == "<|reserved_0|>"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export")]


def test_export_of_a_causal_model_trained_bidirectionally(causal_model, tmp_path):
    """Plain transformers then runs it the way mdlm trained it; hybrid keeps the model's own attention."""
    for name, expected in (("mdlm", False), ("hybrid", True)):
        objective = make_objective(causal_model, name, **{"objective.allow_causal_model": "true"})
        model = load_model(objective)
        export(objective, model, tmp_path / name)
        config = AutoModelForCausalLM.from_pretrained(tmp_path / name).config
        assert getattr(config, "is_causal", True) is expected, name


def test_generation_unmasks_every_position(bidirectional_model):
    from flashdraft.decoding.diffusion import generate

    objective = make_objective(bidirectional_model)
    model = load_model(objective).eval()
    prompt = sample(0, 10)[0].tolist()
    answer = generate(objective, model, prompt, gen_length=6, steps=3)
    assert len(answer) == 6 and MASK_ID not in answer
    assert generate(objective, model, prompt, gen_length=6, steps=3) == answer  # greedy: deterministic
    # One position, one step: the argmax over the vocabulary without the mask token.
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + [MASK_ID]])).logits[0, -1]
    logits[MASK_ID] = -math.inf
    assert generate(objective, model, prompt, gen_length=1, steps=1) == [int(logits.argmax())]


def test_dllm_evaluate_scores_the_held_out_split_and_answers_prompts(bidirectional_model, tmp_path, capsys):
    from flashdraft.stages import dllm_evaluate

    data = alphabet_chats(tmp_path / "chats.jsonl", rows=6, length=16)
    settings = [f"data.train={data}", "data.eval_samples=2", f"objective.mask_token_id={MASK_ID}"]
    report_path = tmp_path / "report.json"
    assert cli.main(["dllm-evaluate", "--model", str(bidirectional_model), "--output", str(report_path),
                     "--num-samples", "1", "--gen-length", "4", "--steps", "2", *settings]) == 0
    report = json.loads(report_path.read_text())
    assert report["metrics"]["supervised_tokens"] > 0 and 0 <= report["metrics"]["masked_accuracy"] <= 1
    assert report["generation"] == {"gen_length": 4, "steps": 2, "mask_token_id": MASK_ID}
    (answer,) = report["samples"]
    assert answer["prompt"].startswith("<|im_start|>user") and answer["completion_tokens"] <= 4
    # The typed entry point (components call it): --prompt replaces the held-out prompts, same metrics.
    typed = dllm_evaluate.run(load_config(None, settings, values={
        "target.name_or_path": str(bidirectional_model), "evaluate.output": str(tmp_path / "typed.json"),
        "evaluate.prompts": ["hi", "ho"], "evaluate.dllm_gen_length": 4, "evaluate.dllm_steps": 2}))
    assert typed["metrics"] == report["metrics"] and len(typed["samples"]) == 2
    assert "hi" in typed["samples"][0]["prompt"] and json.loads((tmp_path / "typed.json").read_text()) == typed

    assert cli.main(["dllm-evaluate", "--model", str(tmp_path), "--output", str(tmp_path / "x.json")]) == 2
    assert "is not a model folder" in capsys.readouterr().err
    assert cli.main(["dllm-evaluate", "--model", str(bidirectional_model), "--output", str(tmp_path / "x.json"),
                     f"data.train={data}", f"objective.mask_token_id={MASK_ID}"]) == 2
    assert "needs a held-out split" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


REMOTE_CONFIG = """from transformers import LlamaConfig


class TinyDiffusionConfig(LlamaConfig):
    model_type = "llada2_moe"

    def __init__(self, **kwargs):
        kwargs.setdefault("is_causal", False)
        super().__init__(**kwargs)
"""
REMOTE_MODEL = """from transformers import LlamaForCausalLM

from .configuration_tiny_diffusion import TinyDiffusionConfig


class TinyDiffusionLM(LlamaForCausalLM):
    config_class = TinyDiffusionConfig
"""


def save_remote_code_model(path: Path) -> Path:
    """A model folder shaped like LLaDA2's: remote code, model type llada2_moe, an architecture name that
    does not end in ForCausalLM, AutoModelForCausalLM in auto_map."""
    save_model(path, bidirectional=False)
    (path / "configuration_tiny_diffusion.py").write_text(REMOTE_CONFIG)
    (path / "modeling_tiny_diffusion.py").write_text(REMOTE_MODEL)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="llada2_moe", architectures=["TinyDiffusionLM"], auto_map={
        "AutoConfig": "configuration_tiny_diffusion.TinyDiffusionConfig",
        "AutoModelForCausalLM": "modeling_tiny_diffusion.TinyDiffusionLM"})
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_remote_code_diffusion_model_trains_and_exports(tmp_path):
    model = save_remote_code_model(tmp_path / "model")
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=6, length=16)
    out = tmp_path / "out"
    code = cli.main(["train", *tiny_train_args(model, data, out, **{
        "objective.name": "mdlm", "objective.mask_token_id": MASK_ID, "target.trust_remote_code": "true",
        "train.micro_batch_size": 2, "train.max_steps": 2})])
    assert code == 0  # a bidirectional model type: no allow_causal_model needed
    exported = AutoModelForCausalLM.from_pretrained(out / "export", trust_remote_code=True)
    assert type(exported).__name__ == "TinyDiffusionLM" and exported.config.is_causal is False
    assert (out / "export" / "modeling_tiny_diffusion.py").is_file()
    assert json.loads((out / "summary.json").read_text())["supervised_tokens"] > 0


# -- bad input ---------------------------------------------------------------------------------
def test_missing_mask_token_is_a_clear_error(bidirectional_model):
    config = load_config(None, [f"target.name_or_path={bidirectional_model}", "objective.name=mdlm"])
    with pytest.raises(UserError, match=r"objective.mask_token_id.*156895"):
        get_objective("mdlm").plan(config, load_target_config(str(bidirectional_model)),
                                  load_tokenizer(str(bidirectional_model)))
    with pytest.raises(UserError, match="outside the model's vocabulary"):
        make_objective(bidirectional_model, **{"objective.mask_token_id": 10_000})


def test_causal_model_needs_the_override(causal_model, tmp_path, capsys):
    with pytest.raises(UserError, match="bidirectional.*allow_causal_model=true"):
        make_objective(causal_model, **{"objective.mask_token_id": MASK_ID})
    # Through the command line: exit 2, one line naming the fix, nothing written.
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=4)
    out = tmp_path / "out"
    code = cli.main(["train", *tiny_train_args(causal_model, data, out, **{
        "objective.name": "mdlm", "objective.mask_token_id": MASK_ID})])
    assert code == 2
    assert "objective.allow_causal_model=true" in capsys.readouterr().err
    assert not out.exists()


if __name__ == "__main__":
    probe(json.loads(sys.argv[1]))
