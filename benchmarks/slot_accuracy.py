"""Teacher-forced accuracy at each drafted slot, side by side for several `heldout_tau.py` results.

    python benchmarks/slot_accuracy.py LABEL=FILE [LABEL=FILE ...] --out OUT

Each FILE is the JSON `heldout_tau.py` writes (one draft, one anchor rule: `train`, `tail`, `looped`, `unlooped`,
`looped_far` or `looped_near`); each of its evaluation sets becomes one curve, named LABEL (LABEL/SET where a file holds several).
Slot k's accuracy is the share of blocks whose k-th drafted token is the answer's token, counted alone (not
given the earlier slots), so the curve shows how far into a block the draft still predicts: inside a loop,
where every slot repeats earlier text, a draft that copies would stay near its slot-1 accuracy. Writes
OUT.md (a table) and OUT.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flashdraft.decoding.plots import save_figure
from flashdraft.files import write_text


def slot_curves(specs: list[str]) -> dict[str, dict]:
    """LABEL=FILE specs -> {curve name: {"tau", "slots": [accuracy of slot 1..B-1], "tokens", "anchors"}}."""
    curves = {}
    for spec in specs:
        label, sep, file = spec.partition("=")
        if not sep or not label or not file:
            raise SystemExit(f"error: '{spec}' is not LABEL=FILE; name each heldout_tau.py result, e.g. looped=a.json")
        path = Path(file)
        if not path.is_file():
            raise SystemExit(f"error: {path} does not exist; give a JSON that heldout_tau.py wrote")
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise SystemExit(f"error: {path} is not JSON ({err}); give a JSON that heldout_tau.py wrote") from None
        results = record.get("results") if isinstance(record, dict) else None
        if not results:
            raise SystemExit(f"error: {path} holds no 'results'; give a JSON that heldout_tau.py wrote")
        for name, result in results.items():
            if "eval_tau" not in result or "eval_acc_slot_1" not in result:
                raise SystemExit(f"error: {path}: set {name!r} has no eval_tau and per-slot accuracy; give a JSON "
                                 "that heldout_tau.py wrote")
            keys = sorted((k for k in result if k.startswith("eval_acc_slot_")), key=lambda k: int(k.rsplit("_", 1)[1]))
            curve = label if len(results) == 1 else f"{label}/{name}"
            if curve in curves:
                raise SystemExit(f"error: the curve name {curve} is given twice; label each file differently")
            curves[curve] = {"tau": result["eval_tau"], "slots": [result[k] for k in keys],
                             "tokens": result["eval_supervised_tokens"], "anchors": record.get("anchors", "")}
    return curves


def markdown(curves: dict[str, dict]) -> str:
    width = max(len(c["slots"]) for c in curves.values())
    lines = ["| curve | anchors | expected tau | supervised tokens | "
             + " | ".join(f"slot {k}" for k in range(1, width + 1)) + " |",
             "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in range(width)) + " |"]
    for name, c in curves.items():
        cells = [f"{a:.2f}" for a in c["slots"]] + [""] * (width - len(c["slots"]))
        lines.append(f"| {name} | {c['anchors']} | {c['tau']:.2f} | {c['tokens']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(curves: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    for name, c in curves.items():
        axis.plot(range(1, len(c["slots"]) + 1), c["slots"], marker="o", label=f"{name} (tau {c['tau']:.2f})")
    axis.set_xlabel("drafted slot")
    axis.set_ylabel("teacher-forced accuracy")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("specs", nargs="+", metavar="LABEL=FILE", help="a heldout_tau.py result and its label")
    parser.add_argument("--out", type=Path, required=True, help="OUT.md and OUT.png are written")
    args = parser.parse_args(argv)
    curves = slot_curves(args.specs)
    text = markdown(curves)
    write_text(args.out.parent / f"{args.out.name}.md", text)
    plot(curves, args.out.parent / f"{args.out.name}.png")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
