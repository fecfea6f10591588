"""One global batch of 4 gives the same gradients as 1 x 4, 2 x 2 accumulation and 2 ranks x 2 (gloo;
also with the target sharded, with compiled draft layers and with a sharded target's compiled layers), and
the held-out evaluation gives the same numbers on 1 and 2 ranks.

Run as a script (`python tests/train/test_train_distributed.py JSON`, alone or under torchrun) it is the probe:
for each [OUT, overrides] pair in JSON it builds a trainer, accumulates the gradients of step 0 and saves
them, gathered, with the evaluation's metrics to OUT (several trainers per process: the interpreter
starts once).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train_helpers import alphabet_chats, as_in_a_cpu_subprocess, cpu_env, tiny_train_args


def probe(jobs: list[tuple[str, list[str]]]) -> None:
    from torch.distributed.tensor import DTensor

    from flashdraft.config import load_config
    from flashdraft.train.distributed import teardown
    from flashdraft.train.trainer import Trainer

    for out, overrides in jobs:
        trainer = Trainer(load_config(None, overrides))
        evaluation = trainer.evaluate()
        sums = trainer.accumulate_gradients(0)
        grads = {}
        for name, param in trainer.model.named_parameters():
            grad = param.grad
            grads[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().clone()
        if trainer.dist.is_main:
            torch.save({"grads": grads, "sums": sums, "eval": evaluation}, out)
    teardown()


def run_probes(tmp_path: Path, jobs: dict[str, list[str]], nproc: int = 0) -> list[dict]:
    """The probe under torchrun with `nproc` ranks; without, in this process (no interpreter to start)."""
    outs = {name: str(tmp_path / f"{name}.pt") for name in jobs}
    spec = [[outs[name], overrides] for name, overrides in jobs.items()]
    if nproc:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        done = subprocess.run([*launcher, __file__, json.dumps(spec)], capture_output=True, text=True, env=cpu_env(),
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        with as_in_a_cpu_subprocess():
            probe(spec)
    return [torch.load(outs[name]) for name in jobs]


@pytest.mark.slow
@pytest.mark.distributed
def test_same_gradients_for_any_split(tiny_target, tmp_path):
    data = alphabet_chats(tmp_path / "chats.jsonl", rows=12, length=30)
    # Conversations of different lengths, so micro-batches pad differently.
    lines = data.read_text().splitlines()
    data.write_text("".join(line.replace('"go"', '"' + "go " * i + '"') + "\n" for i, line in enumerate(lines)))
    target = tiny_target("qwen3")

    def args(name, micro, accum, **extra):
        return tiny_train_args(target, data, tmp_path / name, **{
            "train.micro_batch_size": micro, "train.grad_accum_steps": accum, "draft.num_layers": 2,
            # An odd eval set: on 2 ranks one of them evens out with a blank row.
            "data.eval_samples": 3, **extra})

    one, accum = run_probes(tmp_path, {"one": args("one", 4, 1), "accum": args("accum", 2, 2)})
    # Compiled draft layers (objective.compile_layers) under FSDP2 on 2 ranks, and compiled layers of a
    # sharded target (objective.compile_target): the same numbers too.
    ranks, sharded, compiled, compiled_target = run_probes(tmp_path, {
        "ranks": args("ranks", 1, 2), "sharded": args("sharded", 1, 2, **{"train.shard_target": "true"}),
        "compiled": args("compiled", 1, 2, **{"objective.compile_layers": "true"}),
        "compiled_target": args("compiled_target", 1, 2, **{"train.shard_target": "true",
                                                            "objective.compile_target": "true"})}, nproc=2)
    assert float(one["sums"]["targets"]) > 0
    for other in (accum, ranks, sharded, compiled, compiled_target):
        assert torch.equal(other["sums"]["targets"], one["sums"]["targets"])
        torch.testing.assert_close(other["sums"]["loss_sum"], one["sums"]["loss_sum"], rtol=1e-6, atol=1e-5)
        assert one["grads"].keys() == other["grads"].keys()
        for name, grad in one["grads"].items():
            torch.testing.assert_close(other["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for g in one["grads"].values())
    assert one["eval"]["eval_supervised_tokens"] > 0
    for other in (accum, ranks, sharded, compiled, compiled_target):
        assert other["eval"].keys() == one["eval"].keys()
        for key, value in one["eval"].items():
            assert other["eval"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


if __name__ == "__main__":
    probe(json.loads(sys.argv[1]))
