"""A seeded mixture is the same dataset in one process and on each of 2 gloo ranks, and the prepared
(tokenised) set that rank 0 builds and both ranks read equals the one-process build.

Run as a script (`python tests/data/test_prepare_ranks.py SPECS CACHE OUT`, alone or under torchrun) it is
the probe: each rank loads the mixture itself, then prepares it through the shared cache, and writes
what it saw to OUT.<rank>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from train_helpers import cpu_env


def probe(specs: list[str], cache: str, out: str) -> None:
    import torch.distributed as dist

    from flashdraft.config import DataConfig
    from flashdraft.data.prepare import prepare_datasets
    from flashdraft.data.sources import load_chat_dataset
    from tiny_models import tiny_tokenizer

    ranked = "RANK" in os.environ
    if ranked:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if ranked else 0
    mixture = load_chat_dataset(specs, limit=40, seed=11)
    data = DataConfig(train=specs, limit=40, seed=11, max_length=64)
    prepared = prepare_datasets(data, tiny_tokenizer(), min_supervised=2, cache_dir=cache, is_main=rank == 0,
                                barrier=dist.barrier if ranked else lambda: None)
    digest = hashlib.sha256(json.dumps([row["input_ids"].tolist() for row in prepared.train]).encode()).hexdigest()
    with open(f"{out}.{rank}.json", "w") as handle:
        json.dump({"ids": list(mixture["id"]), "prepared": digest, "rows": len(prepared.train)}, handle)
    if ranked:
        dist.destroy_process_group()


def run_probe(specs: list[str], cache, out, nproc: int = 0) -> None:
    launcher = [sys.executable]
    if nproc:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    done = subprocess.run([*launcher, __file__, json.dumps(specs), str(cache), str(out)], capture_output=True,
                          text=True, env=cpu_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.distributed
def test_a_mixture_is_the_same_in_one_process_and_on_two_ranks(tmp_path):
    for name, offset in (("a", 0), ("b", 500)):
        rows = [{"messages": [{"role": "user", "content": f"q{offset + i}"}, {"role": "assistant", "content": f"a{i}"}]}
                for i in range(60)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = [str(tmp_path / "a.jsonl") + "@3", str(tmp_path / "b.jsonl") + "@1", "packaged:word_problems@1"]
    run_probe(specs, tmp_path / "cache1", tmp_path / "one")
    run_probe(specs, tmp_path / "cache2", tmp_path / "two", nproc=2)
    one = json.loads((tmp_path / "one.0.json").read_text())
    ranks = [json.loads((tmp_path / f"two.{r}.json").read_text()) for r in (0, 1)]
    assert len(one["ids"]) == 40 and len(set(one["ids"])) == 40
    assert {i.split(":")[0].split("/")[0] for i in one["ids"]} == {"a.jsonl", "b.jsonl", "word_problems"}
    assert ranks[0] == ranks[1] == one


if __name__ == "__main__":
    probe(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3])
