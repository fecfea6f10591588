"""Which difference between our objective and SpecForge's moves draft quality: a seeded CPU ablation.

    python benchmarks/objective_ablation.py --out DIR [--seeds 3] [--steps 80] [--jobs 2] [--variants ours,peer]

With one micro-batch a step, the two objectives differ (RESULTS.md section 8) in the padding blocks; until
ours took the peer's anchor rule (blocks may start up to the answer's last token), also in the anchors,
and until the normaliser became the decay weights' sum, in the gradient's scale (our count of slots made
it ~2.3x smaller, which AdamW ignores but gradient clipping at 1.0 does not: it clipped the peer's every
step and ours seldom). Variants,
trained alike through `flashdraft train` (benchmarks/peer_train.py) on a tiny random Qwen3 target and the
alphabet task of the tests, one process and one thread each:
  ours               objective.name=dflash, train.grad_clip=1.0 (the recipe)
  ours_loose_clip    ours with train.grad_clip=2.3: clipping as loose as under the old count normaliser
  peer               objective.name=specforge
  gamma1 ... gamma8  ours with the slot weights' decay gamma 1, 2, 4 (the paper's rule at B = 8) or 8
Each export is scored by one measure, our trainer's evaluation on held-out alphabet replies
(benchmarks/heldout_tau.py): expected tau and drafted-slot accuracy. Writes DIR/ablation.json and
prints a table (mean and spread over seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
VARIANTS = {
    "ours": {"objective.name": "dflash"},
    "ours_loose_clip": {"objective.name": "dflash", "train.grad_clip": 2.3},
    "peer": {"objective.name": "specforge"},
    **{f"gamma{g}": {"objective.name": "dflash", "objective.gamma": g} for g in (1, 2, 4, 8)},
}
DEFAULT_VARIANTS = ("ours", "ours_loose_clip", "peer")


def environment() -> dict:
    path = os.pathsep.join(p for p in (str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}


def train_and_score(out: Path, target: Path, data: Path, heldout: Path, variant: str, seed: int, steps: int) -> dict:
    run = out / f"{variant}_seed{seed}"
    settings = {"target.name_or_path": target, "data.train": data, "train.output_dir": run, "draft.num_layers": 1,
                "draft.block_size": 8, "objective.num_anchors": 8, "objective.attention": "sdpa",
                "train.micro_batch_size": 4, "train.lr": 3e-3, "train.max_steps": steps, "train.epochs": 100,
                "train.seed": seed, "train.log_every": 10, "train.checkpoint_every": 100000,
                "data.eval_samples": 0, **VARIANTS[variant]}
    args = [f"{k}={v}" for k, v in settings.items()]
    subprocess.run([sys.executable, str(HERE / "peer_train.py"), *args], check=True, env=environment(),
                   stdout=subprocess.DEVNULL, stderr=(out / f"{run.name}.log").open("w"))
    score = out / f"{run.name}_heldout.json"
    subprocess.run([sys.executable, str(HERE / "heldout_tau.py"), "--draft", str(run / "export"),
                    "--eval", f"alphabet={heldout}", "--out", str(score), "--", f"target.name_or_path={target}",
                    "draft.block_size=8", "objective.num_anchors=8", "objective.attention=sdpa"],
                   check=True, env=environment(), stdout=subprocess.DEVNULL,
                   stderr=(out / f"{run.name}_heldout.log").open("w"))
    (result,) = json.loads(score.read_text())["results"].values()
    return {"variant": variant, "seed": seed, "eval_tau": result["eval_tau"], "eval_accuracy": result["eval_accuracy"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one CPU thread each")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default {','.join(DEFAULT_VARIANTS)})")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise SystemExit(f"error: --variants {args.variants!r}: unknown {', '.join(unknown) or 'none given'}; "
                         f"known: {', '.join(VARIANTS)}")
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"error: {args.out} is not empty; give a new or empty folder for the runs")
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(TESTS))
    from tiny_models import save_tiny_target
    from train_helpers import alphabet_chats

    target = save_tiny_target(args.out / "target", "qwen3")
    data = alphabet_chats(args.out / "train.jsonl", 64)
    heldout = alphabet_chats(args.out / "heldout.jsonl", 32, seed=1)
    jobs = [(v, s) for s in range(args.seeds) for v in variants]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda job: train_and_score(args.out, target, data, heldout, *job, args.steps), jobs))
    summary = {}
    for variant in variants:
        taus = [r["eval_tau"] for r in rows if r["variant"] == variant]
        accs = [r["eval_accuracy"] for r in rows if r["variant"] == variant]
        summary[variant] = {"eval_tau_mean": statistics.mean(taus), "eval_tau_min": min(taus),
                            "eval_tau_max": max(taus), "eval_accuracy_mean": statistics.mean(accs)}
        print(f"{variant:18s} expected tau {summary[variant]['eval_tau_mean']:.3f} "
              f"[{min(taus):.3f}, {max(taus):.3f}]  drafted-slot accuracy {summary[variant]['eval_accuracy_mean']:.3f}")
    result = {"command": " ".join(["python", "benchmarks/objective_ablation.py", *(argv or sys.argv[1:])]),
              "steps": args.steps, "seeds": args.seeds, "runs": rows, "summary": summary}
    (args.out / "ablation.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
