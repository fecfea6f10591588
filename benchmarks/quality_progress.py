"""The quality runs' drafts against issue 22's tau goals, run by run: one table and one plot.

    python benchmarks/quality_progress.py --out FOLDER LABEL=REPORT [LABEL=REPORT ...]

reads each float32 evaluate report (`flashdraft evaluate --output`, as `quality_sharegpt.sh collect` keeps them) and
writes `progress.md` (pooled tau per benchmark and run, the goal beside each benchmark, the lossless fraction) and
`progress.png` (one line per benchmark over the runs, in the order given, the goals dashed) into FOLDER. Every report
must hold the same benchmarks; RESULTS.md section 8 names the runs of its plot.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flashdraft.decoding.plots import save_figure
from flashdraft.files import write_text

# The goals (float32, T=0): GSM8K tau >= 3.8; held-out ShareGPT or chat tau >= 3.4.
GOALS = {"gsm8k": 3.8, "chat": 3.4, "sharegpt_first_turn": 3.4, "sharegpt_second_turn": 3.4}


def load_runs(pairs: list[str]) -> dict[str, dict]:
    """{label: {benchmark: {"tau", "lossless"}}} from LABEL=REPORT pairs; a bad pair or report exits with why."""
    runs = {}
    for pair in pairs:
        label, sep, report = pair.partition("=")
        if not (sep and label and report):
            sys.exit(f"error: {pair!r} is not LABEL=REPORT (e.g. 36k_3600=results/.../mix36k_report.json)")
        if label in runs:
            sys.exit(f"error: the label {label!r} is given twice; give each run its own")
        try:
            benchmarks = json.loads(Path(report).read_text())["benchmarks"]
            runs[label] = {name: {"tau": float(result["speculative"]["tau_pooled"]),
                                  "lossless": float(result["lossless"])} for name, result in benchmarks.items()}
        except (OSError, ValueError, KeyError, TypeError) as err:
            sys.exit(f"error: {report} is not an evaluate report with per-benchmark speculative taus "
                     f"({type(err).__name__}: {err}); give the report.json that `flashdraft evaluate` wrote")
    names = [list(run) for run in runs.values()]
    if any(set(n) != set(names[0]) for n in names):
        sys.exit("error: the reports hold other benchmarks (" + "; ".join(
            f"{label}: {', '.join(run)}" for label, run in runs.items()) + "); compare runs of the same evaluation")
    return runs


def table(runs: dict[str, dict]) -> str:
    labels = list(runs)
    benchmarks = list(runs[labels[0]])
    lines = ["| benchmark | goal | " + " | ".join(labels) + " |", "| --- | ---: |" + " ---: |" * len(labels)]
    for name in benchmarks:
        goal = GOALS.get(name)
        taus = [runs[label][name]["tau"] for label in labels]
        cells = [f"**{tau:.2f}**" if goal is not None and tau >= goal else f"{tau:.2f}" for tau in taus]
        lines.append(f"| {name} | {'' if goal is None else f'{goal:.1f}'} | " + " | ".join(cells) + " |")
    lines.append("| lossless, lowest | 1.00 | " + " | ".join(
        f"{min(runs[label][name]['lossless'] for name in benchmarks):.2f}" for label in labels) + " |")
    return ("Pooled decoding tau (float32, greedy) of each run's draft; bold: at or above the goal. Lossless: the\n"
            "lowest fraction of sequences equal to plain decoding over the benchmarks.\n\n"
            + "\n".join(lines) + "\n")


def plot(runs: dict[str, dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(runs)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name in runs[labels[0]]:
        ax.plot(range(len(labels)), [runs[label][name]["tau"] for label in labels], marker="o", label=name)
    for goal in sorted(set(GOALS.values())):
        ax.axhline(goal, color="gray", linestyle="--", linewidth=0.8)
        ax.annotate("goal: " + " / ".join(name for name, value in GOALS.items() if value == goal), (0, goal),
                    xytext=(0, 3), textcoords="offset points", fontsize=7, color="gray")
    ax.set_xticks(range(len(labels)), labels, rotation=15)
    ax.set_ylabel("pooled decoding tau (float32)")
    ax.set_title("SmolLM2-135M drafts against the tau goals (dashed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for progress.md and progress.png")
    parser.add_argument("runs", nargs="+", metavar="LABEL=REPORT", help="each run's float32 evaluate report, in order")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        sys.exit(f"error: --out {args.out} is a file; give a folder for progress.md and progress.png")
    runs = load_runs(args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(runs)
    write_text(args.out / "progress.md", text)
    plot(runs, args.out / "progress.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
