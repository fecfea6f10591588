"""The side-by-side quality comparison over training seeds: several `quality_sharegpt.sh collect` folders
whose trainings differ in `train.seed` alone.

    python benchmarks/quality_seeds_report.py RUN_A RUN_B [RUN_C ...] --out FOLDER [--ours NAME] [--against NAME]

writes `seeds.md` and `seeds.json` into FOLDER: per benchmark, each run's pooled tau of both drafts and their
paired difference (ours minus the other's, over the same prompts), the mean difference over the runs, its
standard deviation across them, and in how many runs ours is ahead. One run's bootstrap interval covers
the prompts only; the spread across runs is the training seed's, which a lead has to exceed. `--ours NAME`
sets another draft of the folders (default flashdraft; e.g. distill, or a recipe variant of the variants
phase) against `--against NAME`'s (default peer; flashdraft for a variant of our own recipe).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from flashdraft.files import write_text
from quality_sharegpt_report import OURS, PEER, benchmark_rows, differing_keys, run_settings


def differing_settings(runs: list[Path], ours: str = OURS, against: str = PEER) -> list[str]:
    """The settings, other than `train.seed`, that shape a run (`run_settings`) and on which the runs'
    trainings of one draft differ: such runs compare more than seeds."""
    keys = set()
    for name in (ours, against):
        keys.update(differing_keys([run_settings(yaml.safe_load((run / f"{name}_config.yaml").read_text()))
                                    for run in runs]))
    return sorted(keys - {"train.seed"})


def _report(run: Path, name: str) -> dict:
    return json.loads((run / f"{name}_report.json").read_text())


def seed_rows(runs: list[Path], ours: str = OURS, against: str = PEER) -> list[dict]:
    """Per benchmark (those every run has): each run's taus and paired difference; their mean, spread."""
    per_run = [{row["benchmark"]: row for row in benchmark_rows(run, ours, against)} for run in runs]
    common = [bench for bench in per_run[0] if all(bench in rows for rows in per_run)]
    reports = [_report(run, ours)["benchmarks"] for run in runs]
    table = []
    for bench in common:
        # Greedy and lossless, every run decodes a prompt to the same tokens: other lengths, other prompts.
        if len({tuple(p["new_tokens"] for p in report[bench]["per_prompt"]) for report in reports}) > 1:
            raise SystemExit(f"error: the runs decoded other prompts (or lengths) on {bench}; compare runs "
                             "evaluated on the same benchmark files with the same settings")
        runs_of_bench = [rows[bench] for rows in per_run]
        differences = [row["paired"]["difference"] for row in runs_of_bench]
        table.append({
            "benchmark": bench,
            "runs": [{ours: row[ours]["tau_pooled"], against: row[against]["tau_pooled"],
                      "difference": row["paired"]["difference"],
                      "interval": [row["paired"]["low"], row["paired"]["high"]]} for row in runs_of_bench],
            "mean_difference": statistics.fmean(differences),
            "sd_across_runs": statistics.stdev(differences),
            "runs_ahead": sum(d > 0 for d in differences),
        })
    return table


def markdown(runs: list[Path], table: list[dict], ours: str = OURS, against: str = PEER) -> str:
    names = [run.name for run in runs]
    lines = [f"Runs (training seed the only difference): {', '.join(names)}.", "",
             "| benchmark | " + " | ".join(f"{n}: {ours} / {against}, difference" for n in names)
             + f" | mean difference | sd across runs | runs {ours} ahead |",
             "| --- |" + " ---: |" * (len(names) + 3)]
    for row in table:
        cells = [f"{r[ours]:.2f} / {r[against]:.2f}, {r['difference']:+.3f}" for r in row["runs"]]
        lines.append(f"| {row['benchmark']} | " + " | ".join(cells)
                     + f" | {row['mean_difference']:+.3f} | {row['sd_across_runs']:.3f} "
                     f"| {row['runs_ahead']} of {len(runs)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="collect folders, one training seed each")
    parser.add_argument("--out", type=Path, required=True, help="folder for seeds.md and seeds.json")
    parser.add_argument("--ours", default=OURS, help="the draft set against the other (default flashdraft)")
    parser.add_argument("--against", default=PEER, help="the draft it is compared with (default peer)")
    args = parser.parse_args(argv)
    if args.ours == args.against:
        raise SystemExit(f"error: --ours and --against both name {args.ours}; a draft is compared with another draft")
    if len(args.runs) < 2:
        raise SystemExit("error: give at least two run folders; one run has no spread across seeds")
    needed = [f"{name}_{part}" for name in (args.ours, args.against) for part in ("report.json", "config.yaml")]
    for run in args.runs:
        missing = [name for name in needed if not (run / name).is_file()]
        if missing:
            raise SystemExit(f"error: {run} lacks {', '.join(missing)}; give folders that "
                             "`quality_sharegpt.sh collect WORK OUT` wrote")
    differing = differing_settings(args.runs, args.ours, args.against)
    if differing:
        raise SystemExit(f"error: the runs' trainings differ in {', '.join(differing)}, not in the seed alone; "
                         "compare runs of one recipe and data")
    table = seed_rows(args.runs, args.ours, args.against)
    text = markdown(args.runs, table, args.ours, args.against)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "seeds.md", text)
    summary = {"runs": [r.name for r in args.runs], "ours": args.ours, "against": args.against, "benchmarks": table}
    write_text(args.out / "seeds.json", json.dumps(summary, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
