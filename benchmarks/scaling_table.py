"""Scaling table from `train_step.py` results of the same model on 1, 2, ... GPUs.

    python benchmarks/scaling_table.py nano_1gpu.json nano_2gpu.json nano_8gpu.json [--variant fast]

Scaling efficiency = tokens/s per GPU on N GPUs / tokens/s per GPU on the smallest run with the same
target placement (replicated or sharded), so 100% is linear scaling.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rows(paths: list[Path], variant: str) -> list[dict]:
    out = []
    for path in paths:
        for result in json.loads(path.read_text())["results"]:
            for v in result["variants"]:
                if v["variant"] == variant and "error" not in v:
                    out.append({"file": path.name, "model": result["model"], "gpus": result["gpus"],
                                "sharded": result["target_sharded"], "global_batch": result["global_batch"], **v})
    return sorted(out, key=lambda r: (r["model"], r["sharded"], r["gpus"]))


def table(entries: list[dict]) -> str:
    head = (f"{'model':<14}{'target':<11}{'GPUs':>5}{'batch':>6}{'step s':>9}{'tok/s/GPU':>11}{'MFU':>7}"
            f"{'peak GB':>9}{'scaling':>9}")
    lines = [head, "-" * len(head)]
    base: dict[tuple, float] = {}
    for r in entries:
        key = (r["model"], r["sharded"])
        base.setdefault(key, r["tokens_per_s_per_gpu"])
        peak = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "-"
        lines.append(
            f"{r['model']:<14}{'sharded' if r['sharded'] else 'replicated':<11}{r['gpus']:>5}{r['global_batch']:>6}"
            f"{r['step_time_s']:>9.3f}{r['tokens_per_s_per_gpu']:>11.0f}{r['mfu']:>7.1%}{peak:>9}"
            f"{r['tokens_per_s_per_gpu'] / base[key]:>9.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--variant", default="fast")
    args = parser.parse_args(argv)
    entries = rows(args.results, args.variant)
    if not entries:
        parser.error(f"no {args.variant!r} results without errors in {', '.join(map(str, args.results))}")
    print(table(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
