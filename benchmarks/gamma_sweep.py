"""Decoding tau against the slot weights' decay gamma, over the drafts of several seed folders.

    python benchmarks/gamma_sweep.py SEED_FOLDER [SEED_FOLDER ...] --out FOLDER

Each SEED_FOLDER holds the drafts of one training seed as the variants phase of `quality_sharegpt.sh`
leaves them (NAME_report.json, NAME_config.yaml, NAME_heldout_tau.json for every draft, whatever its
name). A draft's gamma is its config's `objective.gamma`, or the paper's rule for its block size where
that is null. Writes `gamma_sweep.md` and `gamma_sweep.json` (per benchmark and gamma: the pooled tau of
every seed, their mean; the teacher-forced held-out slot-1 accuracy alike) and `gamma_sweep.png` into
FOLDER. The drafts compared must differ in gamma and the seed alone, and where their evidence records
the answers they trained on, those must be the same; other differences are refused.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from flashdraft.decoding.plots import save_figure
from flashdraft.files import write_text
from flashdraft.objectives.dflash import decay_gamma
from quality_sharegpt_report import answers_checked, answers_record, differing_keys, run_settings

SWEPT = ("objective.gamma", "train.seed")
TEACHER = "held-out slot-1 accuracy (teacher-forced)"


def draft_gamma(config: dict) -> float:
    gamma = config["objective"].get("gamma")
    return float(gamma) if gamma is not None else decay_gamma(config["draft"]["block_size"])


def drafts(folders: list[Path]) -> list[dict]:
    """Every draft of the folders: its seed folder, gamma, pooled tau per benchmark, teacher-forced slot 1."""
    found = []
    for folder in folders:
        for report in sorted(folder.glob("*_report.json")):
            name = report.name.removesuffix("_report.json")
            missing = [f"{name}_{part}" for part in ("config.yaml", "heldout_tau.json")
                       if not (folder / f"{name}_{part}").is_file()]
            if missing:
                raise SystemExit(f"error: {folder} has {report.name} but lacks {', '.join(missing)}; give the "
                                 "folders of the variants phase, which writes all three for every draft")
            config = yaml.safe_load((folder / f"{name}_config.yaml").read_text())
            (teacher,) = json.loads((folder / f"{name}_heldout_tau.json").read_text())["results"].values()
            benchmarks = json.loads(report.read_text())["benchmarks"]
            found.append({"folder": folder.name, "name": name, "gamma": draft_gamma(config),
                          "answers": answers_record(folder, name),
                          "settings": {k: v for k, v in run_settings(config).items() if k not in SWEPT},
                          "tau": {bench: r["speculative"]["tau_pooled"] for bench, r in benchmarks.items()}
                          | {TEACHER: teacher["eval_acc_slot_1"]}})
    if not found:
        raise SystemExit(f"error: no NAME_report.json in {', '.join(map(str, folders))}; give the folders of "
                         "the variants phase (each with the drafts of one training seed)")
    comparable(found)
    return found


def comparable(found: list[dict]) -> None:
    """Refuse drafts (each with folder, name, gamma and the settings apart from SWEPT) that differ in more than
    gamma and the seed, or two of one gamma in a seed folder."""
    first = found[0]
    for draft in found[1:]:
        differing = differing_keys([first["settings"], draft["settings"]])
        if differing:
            raise SystemExit(f"error: {draft['folder']}/{draft['name']} differs from {first['folder']}/"
                             f"{first['name']} in {', '.join(differing)}, not in gamma and the seed alone")
    seen = set()
    for draft in found:
        if (draft["folder"], draft["gamma"]) in seen:
            raise SystemExit(f"error: {draft['folder']} holds two drafts of gamma {draft['gamma']:g}; "
                             "keep one a seed folder")
        seen.add((draft["folder"], draft["gamma"]))


def sweep(found: list[dict]) -> dict[str, list[dict]]:
    """Per benchmark, per gamma (ascending): each seed folder's value and their mean."""
    values: dict[str, dict[float, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for draft in found:
        for bench, value in draft["tau"].items():
            values[bench][draft["gamma"]][draft["folder"]] = value
    return {bench: [{"gamma": gamma, "seeds": seeds, "mean": statistics.fmean(seeds.values())}
                    for gamma, seeds in sorted(by_gamma.items())]
            for bench, by_gamma in values.items()}


def markdown(table: dict[str, list[dict]], answers: str) -> str:
    gammas = sorted({row["gamma"] for rows in table.values() for row in rows})
    lines = ["Mean over the seed folders that trained that gamma (their number in brackets); pooled decoding tau, "
             "and the teacher-forced slot-1 accuracy on the held-out ShareGPT answers.", answers, "",
             "| benchmark | " + " | ".join(f"gamma {g:g}" for g in gammas) + " |",
             "| --- |" + " ---: |" * len(gammas)]
    for bench, rows in table.items():
        by_gamma = {row["gamma"]: row for row in rows}
        cells = [f"{by_gamma[g]['mean']:.3f} ({len(by_gamma[g]['seeds'])})" if g in by_gamma else "" for g in gammas]
        lines.append(f"| {bench} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(table: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (taus, teacher) = plt.subplots(1, 2, figsize=(11, 4.2))
    for bench, rows in table.items():
        axis = teacher if bench == TEACHER else taus
        gammas = [row["gamma"] for row in rows]
        line, = axis.plot(gammas, [row["mean"] for row in rows], marker="o", label=bench)
        for row in rows:
            axis.scatter([row["gamma"]] * len(row["seeds"]), list(row["seeds"].values()), s=10,
                         color=line.get_color(), alpha=0.5)
    for axis, label in ((taus, "pooled decoding tau"), (teacher, TEACHER)):
        axis.set_xscale("log")
        axis.set_xlabel("gamma (slot k weighs exp(-(k-1)/gamma))")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    taus.legend(fontsize=8)
    taus.set_title("lines: mean over seeds; dots: one seed each", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", help="seed folders of the variants phase")
    parser.add_argument("--out", type=Path, required=True, help="folder for gamma_sweep.md, .json and .png")
    args = parser.parse_args(argv)
    found = drafts(args.folders)
    answers = answers_checked({f"{d['folder']}/{d['name']}": d["answers"] for d in found})
    table = sweep(found)
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(table, answers)
    write_text(args.out / "gamma_sweep.md", text)
    write_text(args.out / "gamma_sweep.json", json.dumps(table, indent=1) + "\n")
    plot(table, args.out / "gamma_sweep.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
