"""Tables and a plot from a `benchmarks/smollm2_quality.sh` work folder.

    python benchmarks/smollm2_report.py WORK --out DIR

writes DIR/quality.md (the tables below, with the issue's targets checked), DIR/quality.json (the same
numbers) and DIR/training_curve.png:
- per benchmark: DFlash tau and speedup vs prompt-lookup decoding vs plain decoding, lossless fraction
  (from WORK/results/*/report.json, written by `flashdraft evaluate`);
- the main run's training curve: loss and expected tau, train and held-out (WORK/main/metrics.jsonl);
- 1 GPU vs 2 GPUs with the same global batch: the loss at every logged step and the throughput of the
  steady part of each run (WORK/check_1gpu, WORK/check_2gpu).
Targets (from the quality issue): lossless 100% at temperature 0; DFlash tau >= 2x prompt-lookup tau on
GSM8K prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from flashdraft.decoding.plots import save_figure
from flashdraft.files import write_text

GSM8K_TAU_RATIO = 2.0


def read_metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing; run the matching smollm2_quality.sh phase first")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def decoding_rows(work: Path) -> list[dict]:
    """One row per benchmark over every evaluate report under WORK/results."""
    reports = sorted((work / "results").glob("*/report.json"))
    if not reports:
        raise SystemExit(f"error: no evaluate reports under {work / 'results'}; run the `evaluate` phase first")
    rows = []
    for path in reports:
        report = json.loads(path.read_text())
        for name, bench in report["benchmarks"].items():
            spec, lookup = bench["speculative"], bench.get("prompt_lookup") or {}
            rows.append({
                "benchmark": name,
                "prompts": bench["num_prompts"],
                "dflash_tau": spec["tau_pooled"],
                "dflash_tau_per_request": spec["tau_mean_of_requests"],
                "dflash_tokens_per_s": spec["tokens_per_second"],
                "dflash_speedup": bench["speedup"],
                "prompt_lookup_tau": lookup.get("tau_pooled"),
                "prompt_lookup_tokens_per_s": lookup.get("tokens_per_second"),
                "prompt_lookup_speedup": lookup.get("speedup"),
                "plain_tokens_per_s": bench["autoregressive"]["tokens_per_second"],
                "lossless": bench["lossless"],
                "slot_acceptance": spec["slot_acceptance"],
                "dtype": report["settings"]["dtype"],
                "device": report["settings"]["device_name"],
            })
    return rows


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, each as met / missed with the margin."""
    lines = []
    lossless = [r["lossless"] for r in rows if r["lossless"] is not None]
    worst = min(lossless) if lossless else None
    lines.append(f"lossless at T=0: {'met' if worst == 1.0 else 'MISSED'} (lowest fraction "
                 f"{worst if worst is not None else 'not measured'})")
    for r in rows:
        if "gsm8k" not in r["benchmark"]:
            continue
        if not (r["dflash_tau"] and r["prompt_lookup_tau"]):
            lines.append(f"{r['benchmark']}: DFlash vs prompt-lookup tau not measured")
            continue
        ratio = r["dflash_tau"] / r["prompt_lookup_tau"]
        verdict = "met" if ratio >= GSM8K_TAU_RATIO else f"MISSED by {GSM8K_TAU_RATIO - ratio:.2f}"
        lines.append(f"{r['benchmark']}: DFlash tau / prompt-lookup tau = {r['dflash_tau']:.2f} / "
                     f"{r['prompt_lookup_tau']:.2f} = {ratio:.2f}x (target >= {GSM8K_TAU_RATIO:.0f}x: {verdict})")
    return lines


def steady(rows: list[dict], key: str) -> float:
    """Median of `key` over the second half of the logged intervals (the first ones include compilation)."""
    values = [r[key] for r in rows if key in r]
    return statistics.median(values[len(values) // 2 :])


def gpu_check(work: Path) -> dict | None:
    """The 1- vs 2-GPU comparison, or None where the 2-GPU check was not run (one GPU visible)."""
    if not (work / "check_2gpu").is_dir():
        return None
    one, two = read_metrics(work / "check_1gpu"), read_metrics(work / "check_2gpu")
    steps = [(a, b) for a, b in zip(one, two, strict=False) if "loss" in a and "loss" in b]
    if not steps or any(a["step"] != b["step"] for a, b in steps):
        raise SystemExit("error: the 1- and 2-GPU checks logged different steps; run both with the same CHECK_STEPS")
    return {
        "steps": [{"step": a["step"], "loss_1gpu": a["loss"], "loss_2gpu": b["loss"],
                   "grad_norm_1gpu": a["grad_norm"], "grad_norm_2gpu": b["grad_norm"]} for a, b in steps],
        "max_abs_loss_difference": max(abs(a["loss"] - b["loss"]) for a, b in steps),
        "max_rel_loss_difference": max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in steps),
        "tokens_per_s_1gpu": steady(one, "tokens_per_s"),
        "tokens_per_s_2gpu": steady(two, "tokens_per_s"),
        "throughput_ratio": steady(two, "tokens_per_s") / steady(one, "tokens_per_s"),
    }


def plot_training(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "loss" in r]
    held = [r for r in rows if "eval_loss" in r]
    fig, (loss_ax, tau_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((loss_ax, "loss", "loss"), (tau_ax, "tau", "expected tau")):
        ax.plot([r["step"] for r in train], [r[key] for r in train], label="train")
        if held:
            ax.plot([r["step"] for r in held], [r[f"eval_{key}"] for r in held], "o-", label="held out")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("DFlash draft for SmolLM2-135M-Instruct")
    fig.tight_layout()
    save_figure(fig, path)


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(rows: list[dict], check: dict | None, main_summary: dict) -> str:
    out = ["| benchmark | prompts | DFlash tau (pooled / per request) | DFlash speedup | prompt-lookup tau "
           "| prompt-lookup speedup | plain tok/s | lossless |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['benchmark']} | {r['prompts']} | {fmt(r['dflash_tau'])} / {fmt(r['dflash_tau_per_request'])} "
                   f"| {fmt(r['dflash_speedup'], suffix='x')} "
                   f"| {fmt(r['prompt_lookup_tau'])} | {fmt(r['prompt_lookup_speedup'], suffix='x')} "
                   f"| {fmt(r['plain_tokens_per_s'], '.1f')} | {fmt(r['lossless'], '.0%')} |")
    devices = sorted({f"{r['device']} ({r['dtype']})" for r in rows})
    out += ["", f"Decoding ran on {', '.join(devices)}; speedups hold for that device only."]
    out += ["", "Plain decoding is tau 1 and speedup 1x by definition. DFlash acceptance of draft slots 1-8 "
            "(share of verify steps that accept at least that many drafted tokens):", ""]
    out += [f"- {r['benchmark']}: " + ", ".join(fmt(a) for a in r["slot_acceptance"][:8]) for r in rows]
    out += ["", "Targets:", ""]
    out += [f"- {line}" for line in targets(rows)]
    out += ["", f"Main run: {main_summary.get('steps')} steps, final held-out loss "
            f"{fmt(main_summary.get('eval_loss'), '.3f')}, expected tau {fmt(main_summary.get('eval_tau'))}; "
            "curve in training_curve.png.", ""]
    if check is None:
        return "\n".join(out + ["The 2-GPU check was not run (one GPU visible)."]) + "\n"
    out += ["1 GPU x 2 accumulation vs 2 GPUs x 1, same global batch and data order:", "",
            "| step | loss 1 GPU | loss 2 GPUs | grad norm 1 GPU | grad norm 2 GPUs |", "| ---: | ---: | ---: | ---: | ---: |"]
    for s in check["steps"]:
        out.append(f"| {s['step']} | {s['loss_1gpu']:.5f} | {s['loss_2gpu']:.5f} | {s['grad_norm_1gpu']:.4f} "
                   f"| {s['grad_norm_2gpu']:.4f} |")
    out += ["", f"Largest loss difference {check['max_abs_loss_difference']:.2e} "
            f"({check['max_rel_loss_difference']:.2e} relative). Steady throughput (median of the second half "
            f"of the logged intervals): {check['tokens_per_s_1gpu']:.0f} tokens/s on 1 GPU, "
            f"{check['tokens_per_s_2gpu']:.0f} on 2 ({check['throughput_ratio']:.2f}x)."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="the smollm2_quality.sh work folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for quality.md, quality.json and the plot")
    args = parser.parse_args(argv)
    if not args.work.is_dir():
        raise SystemExit(f"error: {args.work} is not a folder; give the WORK folder of smollm2_quality.sh")
    rows = decoding_rows(args.work)
    check = gpu_check(args.work)
    main_metrics = read_metrics(args.work / "main")
    summary_path = args.work / "main" / "summary.json"
    main_summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    args.out.mkdir(parents=True, exist_ok=True)
    plot_training(main_metrics, args.out / "training_curve.png")
    numbers = {"decoding": rows, "targets": targets(rows), "gpu_check": check,
               "main": {k: main_summary.get(k) for k in ("steps", "eval_loss", "eval_tau", "tokens_per_s")}}
    text = markdown(rows, check, main_summary)
    for name, content in (("quality.json", json.dumps(numbers, indent=1)), ("quality.md", text)):
        write_text(args.out / name, content)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
