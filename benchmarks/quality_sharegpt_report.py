"""Tables and the training-curve plot of the side-by-side quality run (`quality_sharegpt.sh collect`'s folder).

    python benchmarks/quality_sharegpt_report.py benchmarks/results/quality_sharegpt

writes `quality.md` (per benchmark, both drafts: decoding tau, share of verify steps accepting at least k
drafted tokens, speedup, plain ms a token, lossless fraction; the teacher-forced expected tau beside it)
and `training_curves.png` (drafted-slot accuracy, train and held out: the one curve both objectives log
on the same scale, as their losses are normalised differently) into the same folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flashdraft.decoding.plots import save_figure
from flashdraft.files import write_text

DRAFTS = ("flashdraft", "peer")
MIN_ACCEPTED = (1, 2, 3, 4)


def accepting_at_least(histogram: dict[str, int], k: int) -> float:
    """Share of verify steps that accepted at least k drafted tokens (a step emitting k+1 tokens)."""
    steps = sum(histogram.values())
    return sum(n for length, n in histogram.items() if int(length) >= k + 1) / steps


def benchmark_rows(folder: Path) -> list[dict]:
    reports = {name: json.loads((folder / f"{name}_report.json").read_text()) for name in DRAFTS}
    rows = []
    for bench in reports["flashdraft"]["benchmarks"]:
        row = {"benchmark": bench}
        for name, report in reports.items():
            r = report["benchmarks"][bench]
            spec = r["speculative"]
            row[name] = {
                "tau_pooled": spec["tau_pooled"], "tau_per_request": spec["tau_mean_of_requests"],
                "accepting": [accepting_at_least(spec["accept_length_histogram"], k) for k in MIN_ACCEPTED],
                "speedup": r["speedup"], "plain_ms": r["autoregressive"]["ms_per_step"],
                "spec_ms": spec["ms_per_step"], "lossless": r["lossless"], "prompts": r["num_prompts"],
            }
        rows.append(row)
    return rows


def heldout_tau(folder: Path) -> dict[str, dict]:
    out = {}
    for name in DRAFTS:
        (result,) = json.loads((folder / f"{name}_heldout_tau.json").read_text())["results"].values()
        out[name] = result
    return out


def markdown(rows: list[dict], teacher: dict[str, dict], settings: dict) -> str:
    lines = [
        f"Evaluation: {settings['device_name']}, {settings['dtype']}, greedy, {settings['max_new_tokens']} new "
        f"tokens, block {settings['block_size']}, compiled layers {settings['compiled']}, torch "
        f"{settings['versions']['torch']}, transformers {settings['versions']['transformers']}.",
        "",
        "| benchmark | prompts | tau pooled (flashdraft / peer) | tau per request | speedup | plain ms a token "
        "| draft+verify ms a step | lossless |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        f, p = row["flashdraft"], row["peer"]
        lines.append(
            f"| {row['benchmark']} | {f['prompts']} | {f['tau_pooled']:.2f} / {p['tau_pooled']:.2f} "
            f"| {f['tau_per_request']:.2f} / {p['tau_per_request']:.2f} | {f['speedup']:.2f}x / {p['speedup']:.2f}x "
            f"| {f['plain_ms']:.2f} / {p['plain_ms']:.2f} | {f['spec_ms']:.2f} / {p['spec_ms']:.2f} "
            f"| {f['lossless']:.2f} / {p['lossless']:.2f} |")
    lines += ["", "Share of verify steps accepting at least k drafted tokens (flashdraft / peer):", "",
              "| benchmark | " + " | ".join(f"k = {k}" for k in MIN_ACCEPTED) + " |",
              "| --- |" + " ---: |" * len(MIN_ACCEPTED)]
    for row in rows:
        cells = [f"{a:.2f} / {b:.2f}" for a, b in zip(row["flashdraft"]["accepting"], row["peer"]["accepting"])]
        lines.append(f"| {row['benchmark']} | " + " | ".join(cells) + " |")
    lines += ["", "Teacher-forced on the target's own answers to the held-out ShareGPT conversations "
              "(the training evaluation's expected tau, 64 random anchors a sample):", "",
              "| | expected tau | slot-1 accuracy | drafted-slot accuracy | samples |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for name in DRAFTS:
        t = teacher[name]
        lines.append(f"| {name} | {t['eval_tau']:.2f} | {t['eval_acc_slot_1']:.3f} | {t['eval_accuracy']:.3f} "
                     f"| {t['samples']} |")
    return "\n".join(lines) + "\n"


def plot_curves(folder: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in zip(DRAFTS, ("tab:blue", "tab:orange")):
        rows = [json.loads(line) for line in (folder / f"{name}_training_curve.jsonl").read_text().splitlines()]
        train = [r for r in rows if "accuracy" in r]
        held = [r for r in rows if "eval_accuracy" in r]
        ax.plot([r["step"] for r in train], [r["accuracy"] for r in train], color=color, label=f"{name} train")
        ax.plot([r["step"] for r in held], [r["eval_accuracy"] for r in held], "o--", color=color,
                label=f"{name} held out")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("drafted-slot accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle("SmolLM2-135M drafts, same data and steps: ours vs SpecForge's objective")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the evidence folder of quality_sharegpt.sh collect")
    args = parser.parse_args(argv)
    needed = [f"{name}_{part}" for name in DRAFTS
              for part in ("report.json", "heldout_tau.json", "training_curve.jsonl")]
    missing = [name for name in needed if not (args.folder / name).is_file()]
    if missing:
        raise SystemExit(f"error: {args.folder} lacks {', '.join(missing)}; give the folder that "
                         "`quality_sharegpt.sh collect WORK OUT` wrote")
    settings = json.loads((args.folder / "flashdraft_report.json").read_text())["settings"]
    text = markdown(benchmark_rows(args.folder), heldout_tau(args.folder), settings)
    write_text(args.folder / "quality.md", text)
    plot_curves(args.folder, args.folder / "training_curves.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
