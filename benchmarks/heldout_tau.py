"""Teacher-forced expected tau of a trained draft on held-out chat data, next to what decoding reaches.

    python benchmarks/heldout_tau.py --config RECIPE --draft EXPORT --eval NAME=SPEC [NAME=SPEC ...] \
        --out FILE.json [-- key=value ...]

For each NAME=SPEC (a dataset spec as `data.eval` takes: a .jsonl of `messages` rows, a packaged source,
a hub dataset) this computes the numbers the trainer logs as `eval_*` (loss, per-slot accuracy, expected
tau = 1 + sum_k prod_{j<=k} a_j over the slots' conditional acceptance), with the draft of EXPORT and the
recipe's settings (max length, anchors, block size; key=value overrides as for `flashdraft train`, e.g.
target.name_or_path=... target.dtype=float32 objective.attention=sdpa on a CPU), one sample a batch. The
trainer's own evaluation code runs, so the numbers are those a training run would log for that data.

Why: a training run's held-out expected tau can sit far above the tau that speculative decoding reaches
(benchmarks/RESULTS.md section 4). Scoring the target's own answers to the decoding prompts separates a
difference in the data from a difference between the two measures.

--anchors picks which blocks are scored. train: the training rule's. tail: only anchors within the block
size of a sample's end, whose blocks run past it (slots there unsupervised): decoding starts a block at
every accepted position, the answer's last ones too, and before run 4 training never started one there
(the reference's rule stops B tokens before the end). looped / unlooped: the training rule's anchors whose drafted
slots all repeat the sample's earlier text verbatim (`flashdraft.data.repetition`), or none of whose
block does: can the draft copy a loop, which a perfect copier would accept whole? looped_far / looped_near split
the looped blocks by where each slot's last earlier copy lies: far, every slot's copy is in the context (at or
before the anchor: a loop at least as long as the block, copied a loop's length back); near, some slot's copy is
a token of the block itself (a loop shorter than the block, whose text also stands a few tokens back).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def parse_evals(items: list[str]) -> dict[str, str]:
    evals = {}
    for item in items:
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec:
            raise SystemExit(f"error: --eval {item!r} is not NAME=SPEC (e.g. heldout_word=answers.jsonl)")
        if name in evals:
            raise SystemExit(f"error: --eval names {name!r} twice; give each set its own name")
        evals[name] = spec
    return evals


def tail_anchors(train_positions, ids, loss_mask, length: int, block: int):
    """The training rule's anchors a > length - B: blocks that run past the sample's end."""
    return train_positions[train_positions > length - block]


def looped_anchors(train_positions, ids, loss_mask, length: int, block: int, *, looped: bool = True):
    """The training rule's anchors whose slots 1..B-1 are all looped tokens (looped=False: no token of the
    block, anchor included, is)."""
    import torch

    from flashdraft.data.repetition import looped_flags

    flags = torch.tensor(looped_flags(ids[:length].tolist()) + [False] * block)
    a = train_positions
    if not len(a):
        return a
    window = torch.stack([flags[a + k] for k in range(block)], dim=1)
    return a[window[:, 1:].all(dim=1)] if looped else a[~window.any(dim=1)]


def looped_by_copy_anchors(train_positions, ids, loss_mask, length: int, block: int, *, far: bool):
    """The looped anchors whose every drafted slot's earlier copy lies at or before the anchor (far), or those
    with a slot whose copy lies inside the block (near)."""
    import torch

    from flashdraft.data.repetition import repeat_distances

    a = train_positions
    if not len(a):
        return a
    distances = torch.tensor(repeat_distances(ids[:length].tolist()) + [0] * block)
    slots = torch.arange(1, block)
    window = torch.stack([distances[a + k] for k in slots.tolist()], dim=1)
    looped = (window > 0).all(dim=1)  # the looped rule: slots 1..B-1 all repeat earlier text
    # slot k of anchor a repeats the token at a + k - distance: in the context when distance >= k
    in_context = (window >= slots).all(dim=1)
    return a[in_context] if far else a[looped & ~in_context]


ANCHOR_RULES = {
    "tail": tail_anchors,
    "looped": looped_anchors,
    "unlooped": lambda *args: looped_anchors(*args, looped=False),
    "looped_far": lambda *args: looped_by_copy_anchors(*args, far=True),
    "looped_near": lambda *args: looped_by_copy_anchors(*args, far=False),
}


def restrict_anchors(objective, rule) -> None:
    """Make `objective` draw its anchors among rule(train_positions, input_ids, loss_mask, length, B), per row."""
    prepare, train_rule = objective.prepare, objective.anchor_positions

    def prepare_restricted(batch, step):
        rows = iter(range(batch.input_ids.shape[0]))  # prepare asks for each row's positions in order

        def positions(loss_mask, length):
            row = next(rows)
            return rule(train_rule(loss_mask, length), batch.input_ids[row], loss_mask, length, objective.block_size)

        objective.anchor_positions = positions
        try:
            return prepare(batch, step)
        finally:
            objective.anchor_positions = train_rule

    objective.prepare = prepare_restricted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="the recipe or YAML the draft was trained with (e.g. smollm2_135m)")
    parser.add_argument("--draft", type=Path, required=True, help="an exported draft folder (train.output_dir/export)")
    parser.add_argument("--eval", nargs="+", required=True, metavar="NAME=SPEC", help="held-out sets to score")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the numbers")
    parser.add_argument("--anchors", choices=["train", *ANCHOR_RULES], default="train",
                        help="which blocks to score (module docstring)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_args(argv)
    evals = parse_evals(args.eval)
    if not (args.draft / "config.json").is_file():
        raise SystemExit(f"error: {args.draft} has no config.json; give the export folder of a training run")

    from flashdraft.config import load_config
    from flashdraft.files import write_json
    from flashdraft.train.distributed import teardown
    from flashdraft.train.trainer import Trainer

    results = {}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for name, spec in evals.items():
                # The trainer needs a train set to build; the eval set doubles as it and nothing trains.
                # One sample a batch, so that a set smaller than the recipe's batch still builds (anchors
                # are drawn per sample, so the batch size does not change the numbers).
                config = load_config(args.config, [*args.overrides, f"draft.init_from={args.draft}",
                                                   f"data.train={spec}", f"data.eval={spec}", "data.limit=null",
                                                   "data.eval_samples=0", "train.micro_batch_size=1",
                                                   "train.grad_accum_steps=1", f"train.output_dir={scratch}/{name}"])
                trainer = Trainer(config)
                if args.anchors != "train":
                    restrict_anchors(trainer.objective, ANCHOR_RULES[args.anchors])
                if not trainer.eval_set:
                    raise SystemExit(f"error: {name}: no sample of {spec} has enough supervised tokens to score")
                scores = trainer.evaluate()
                scores["samples"] = sum(int(b.input_ids.shape[0]) for b in trainer.eval_set)
                results[name] = {"spec": spec, **scores}
                print(f"{name}: expected tau {scores['eval_tau']:.2f}, loss {scores['eval_loss']:.3f}, "
                      f"{scores['samples']} samples", flush=True)
    finally:
        teardown()
    write_json(args.out, {"draft": str(args.draft), "config": args.config, "anchors": args.anchors,
                          "overrides": args.overrides, "results": results}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
