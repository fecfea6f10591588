"""Held-out teacher-forced tau over training, per slot-weight decay gamma, from the drafts' training curves.

    python benchmarks/gamma_curves.py FOLDER [FOLDER ...] --out OUT

Each FOLDER holds the drafts of one training seed as the variants phase of `quality_sharegpt.sh` collects
them: NAME_training_curve.jsonl and NAME_config.yaml for every draft (NAME_report.json where its decoding
evaluation ran). The trainer's held-out evaluation (`train.eval_every`) logs the expected acceptance length
under teacher forcing (`eval_tau`) on the samples prepare-data kept back; this script tables it by step and
gamma, mean over the folders, so a run whose decoding evaluation did not happen still says which gamma trains
the better draft, and how that changes with the steps. Over the pairs of drafts of one folder that both have
a decoding report, it also counts how often the final `eval_tau` orders the two as their pooled decoding tau
does, per benchmark: the evidence that the teacher-forced order stands for the decoding one. Writes gamma_curves.md,
gamma_curves.json and gamma_curves.png into OUT. As in gamma_sweep.py, the drafts must differ in gamma and
the seed alone and, where their evidence records them, have trained on the same answers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from flashdraft.decoding.plots import save_figure
from flashdraft.files import write_text
from gamma_sweep import SWEPT, comparable, draft_gamma
from quality_sharegpt_report import answers_checked, answers_record, run_settings


def held_out_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    held = [{"step": r["step"], "eval_tau": r["eval_tau"], "eval_acc_slot_1": r["eval_acc_slot_1"]}
            for r in rows if "eval_tau" in r]
    if not held:
        raise SystemExit(f"error: {path} has no held-out evaluation (no eval_tau row); train with "
                         "train.eval_every > 0 and data.eval_samples > 0")
    return held


def drafts(folders: list[Path]) -> list[dict]:
    """Every draft of the folders: its folder, name, gamma, held-out rows and decoding taus (None if unrun)."""
    found = []
    for folder in folders:
        for curve in sorted(folder.glob("*_training_curve.jsonl")):
            name = curve.name.removesuffix("_training_curve.jsonl")
            config_path = folder / f"{name}_config.yaml"
            if not config_path.is_file():
                raise SystemExit(f"error: {folder} has {curve.name} but lacks {config_path.name}; give the folders "
                                 "of the variants phase, which collects both for every draft")
            config = yaml.safe_load(config_path.read_text())
            report = folder / f"{name}_report.json"
            taus = ({bench: r["speculative"]["tau_pooled"]
                     for bench, r in json.loads(report.read_text())["benchmarks"].items()}
                    if report.is_file() else None)
            found.append({"folder": folder.name, "name": name, "gamma": draft_gamma(config),
                          "answers": answers_record(folder, name), "rows": held_out_rows(curve), "taus": taus,
                          "settings": {k: v for k, v in run_settings(config).items() if k not in SWEPT}})
    if not found:
        raise SystemExit(f"error: no NAME_training_curve.jsonl in {', '.join(map(str, folders))}; give the "
                         "folders of the variants phase (each with the drafts of one training seed)")
    comparable(found)
    first = found[0]
    for draft in found[1:]:
        steps, first_steps = [r["step"] for r in draft["rows"]], [r["step"] for r in first["rows"]]
        if steps != first_steps:
            raise SystemExit(f"error: {draft['folder']}/{draft['name']} evaluated at steps {steps}, "
                             f"{first['folder']}/{first['name']} at {first_steps}; compare drafts evaluated "
                             "at the same steps (the same train.eval_every and train.max_steps)")
    return found


def by_step(found: list[dict], key: str) -> list[dict]:
    """Per evaluation step, per gamma (ascending): each folder's value of `key` and their mean."""
    steps = [r["step"] for r in found[0]["rows"]]
    table = []
    for i, step in enumerate(steps):
        values: dict[float, dict[str, float]] = defaultdict(dict)
        for draft in found:
            values[draft["gamma"]][draft["folder"]] = draft["rows"][i][key]
        table.append({"step": step, "gammas": [{"gamma": g, "seeds": seeds, "mean": statistics.fmean(seeds.values())}
                                               for g, seeds in sorted(values.items())]})
    return table


def order_agreement(found: list[dict]) -> dict[str, dict[str, int]]:
    """Per benchmark, over the pairs of drafts of one folder where both were decoded: pairs whose final
    eval_tau and pooled decoding tau differ in the same direction (concordant), and all pairs."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"concordant": 0, "pairs": 0})
    decoded = [d for d in found if d["taus"] is not None]
    for a, b in itertools.combinations(decoded, 2):
        if a["folder"] != b["folder"]:
            continue
        teacher = a["rows"][-1]["eval_tau"] - b["rows"][-1]["eval_tau"]
        for bench in a["taus"].keys() & b["taus"].keys():
            decoding = a["taus"][bench] - b["taus"][bench]
            counts[bench]["pairs"] += 1
            counts[bench]["concordant"] += int(teacher * decoding > 0)
    return dict(sorted(counts.items()))


def markdown(tau: list[dict], slot_1: list[dict], agreement: dict[str, dict[str, int]], answers: str) -> str:
    gammas = [row["gamma"] for row in tau[0]["gammas"]]
    header = ["| step | " + " | ".join(f"gamma {g:g}" for g in gammas) + " |", "| ---: |" + " ---: |" * len(gammas)]
    lines = ["Held-out teacher-forced tau (the trainer's eval_tau), mean over the seed folders that trained that "
             "gamma (their number in brackets).", answers, "", *header]
    for row in tau:
        lines.append(f"| {row['step']} | " + " | ".join(f"{g['mean']:.3f} ({len(g['seeds'])})" for g in row["gammas"])
                     + " |")
    last = slot_1[-1]
    lines += ["", f"Held-out slot-1 accuracy at step {last['step']}: "
              + ", ".join(f"gamma {g['gamma']:g} {g['mean']:.3f}" for g in last["gammas"]) + "."]
    if agreement:
        lines += ["", "Pairs of drafts of one seed folder that the final eval_tau orders as pooled decoding tau does:",
                  "", "| benchmark | concordant / pairs |", "| --- | ---: |"]
        lines += [f"| {bench} | {c['concordant']} / {c['pairs']} |" for bench, c in agreement.items()]
    return "\n".join(lines) + "\n"


def plot(tau: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    steps = [row["step"] for row in tau]
    for i, gamma in enumerate(g["gamma"] for g in tau[0]["gammas"]):
        line, = axis.plot(steps, [row["gammas"][i]["mean"] for row in tau], marker="o", label=f"gamma {gamma:g}")
        for row in tau:
            seeds = list(row["gammas"][i]["seeds"].values())
            axis.scatter([row["step"]] * len(seeds), seeds, s=10, color=line.get_color(), alpha=0.5)
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("held-out teacher-forced tau")
    axis.set_title("lines: mean over seeds; dots: one seed each", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", help="seed folders of the variants phase")
    parser.add_argument("--out", type=Path, required=True, help="folder for gamma_curves.md, .json and .png")
    args = parser.parse_args(argv)
    found = drafts(args.folders)
    answers = answers_checked({f"{d['folder']}/{d['name']}": d["answers"] for d in found})
    tau, slot_1, agreement = by_step(found, "eval_tau"), by_step(found, "eval_acc_slot_1"), order_agreement(found)
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(tau, slot_1, agreement, answers)
    write_text(args.out / "gamma_curves.md", text)
    write_text(args.out / "gamma_curves.json", json.dumps(
        {"eval_tau": tau, "eval_acc_slot_1": slot_1, "order_agreement": agreement}, indent=1) + "\n")
    plot(tau, args.out / "gamma_curves.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
