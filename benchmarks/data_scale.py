"""Data at scale: wall time and peak memory of `flashdraft prepare-data` as the number of rows grows.

    python benchmarks/data_scale.py cpu --rows 20000 200000 2000000 --out benchmarks/results/data_scale

For each size it writes a synthetic chat parquet (a user turn and an assistant turn, about 1 KB of text a
row, seeded words), runs `flashdraft prepare-data` on it in a fresh process with the SmolLM2 tokenizer and
chat template, and samples the resident memory of that process and its workers (the sum over the process
tree) every 0.1 s. The goal: peak memory flat in the number of rows (2M rows within 1.3x of 20K rows)
and time linear in it. Results: <out>/cpu.json and <out>/cpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

WORDS = ("the of and to in is that for it as with was on be by at this are from or have an they which one you "
         "had not but all were when we there can more if no out so said what up its about into than them only "
         "time some could new these two may first then do any like my now over such our man me even most made "
         "after also did many before must through back years where much your way well down should because each "
         "just those people how too little state good very make world still own see men work long get here "
         "between both life being under never day same another know while last might us great old year off "
         "come since against go came right used take three model token draft target speculative decoding block "
         "diffusion attention layer hidden state training data prompt answer reason step compute memory").split()
CHUNK = 10_000


def synthetic_parquet(path: Path, rows: int, seed: int = 0) -> Path:
    """`rows` chats of about 1 KB of text each, written in chunks (memory does not grow with `rows`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_file():
        return path
    rng = random.Random(seed)
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema([("messages", pa.list_(message))])

    def text(chars: int) -> str:
        words, size = [], 0
        while size < chars:
            word = rng.choice(WORDS)
            words.append(word)
            size += len(word) + 1
        return " ".join(words)

    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(str(tmp), schema) as writer:
        for start in range(0, rows, CHUNK):
            batch = [{"messages": [{"role": "user", "content": text(rng.randint(150, 450))},
                                   {"role": "assistant", "content": text(rng.randint(450, 950))}]}
                     for _ in range(min(CHUNK, rows - start))]
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    os.replace(tmp, path)
    return path


def tree_rss(process) -> int:
    """Resident bytes of a process and all its descendants."""
    import psutil

    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(command: list[str], env: dict) -> dict:
    import psutil

    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watched = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss(watched))
        time.sleep(0.1)
    output = child.stdout.read()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{output[-4000:]}")
    return {"seconds": round(time.perf_counter() - started, 1), "peak_rss_mb": round(peak / 2**20, 1),
            "summary": output.strip().splitlines()[-1]}


def run_cpu(sizes: list[int], out: Path, work: Path, target: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_DATASETS_CACHE": str(work / "hf-datasets")}
    results = []
    for rows in sizes:
        data = synthetic_parquet(work / f"chats-{rows}.parquet", rows)
        prepared = work / f"prepared-{rows}"
        command = [sys.executable, "-m", "flashdraft.cli", "prepare-data", "--output", str(prepared),
                   "--target", target, "--train", str(data), "data.max_length=512", "draft.block_size=16"]
        print(f"prepare-data on {rows} rows ({data.stat().st_size / 2**20:.0f} MB parquet) ...", flush=True)
        result = {"rows": rows, "parquet_mb": round(data.stat().st_size / 2**20, 1), **measure(command, env)}
        stats = json.loads((prepared / "stats.json").read_text())
        result.update(kept_rows=stats["rows"], tokens=stats["tokens"],
                      rows_per_second=round(rows / result["seconds"], 1))
        print(json.dumps(result), flush=True)
        results.append(result)
    base = results[0]
    for result in results:
        result["rss_vs_smallest"] = round(result["peak_rss_mb"] / base["peak_rss_mb"], 3)
        result["seconds_per_row_vs_smallest"] = round(
            (result["seconds"] / result["rows"]) / (base["seconds"] / base["rows"]), 3)
    report = {"command": " ".join(sys.argv), "machine": _machine(), "target_tokenizer": target, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| rows | parquet MB | wall s | rows/s | peak RSS MB | RSS vs smallest | s/row vs smallest |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['rows']:,} | {r['parquet_mb']} | {r['seconds']} | {r['rows_per_second']} | {r['peak_rss_mb']} | "
              f"{r['rss_vs_smallest']}x | {r['seconds_per_row_vs_smallest']}x |" for r in results]
    (out / "cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


def _machine() -> dict:
    import psutil

    return {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    cpu = sub.add_parser("cpu", help="prepare-data time and peak memory by number of rows")
    cpu.add_argument("--rows", type=int, nargs="+", default=[20_000, 200_000, 2_000_000])
    cpu.add_argument("--out", type=Path, default=Path("benchmarks/results/data_scale"))
    cpu.add_argument("--work", type=Path, default=Path("/tmp/flashdraft-data-scale"),
                     help="where the synthetic parquet files and prepared sets go (several GB at 2M rows)")
    cpu.add_argument("--target", default="packaged:smollm2", help="whose tokenizer and chat template")
    args = parser.parse_args()
    if args.mode == "cpu":
        run_cpu(sorted(args.rows), args.out, args.work, args.target)


if __name__ == "__main__":
    main()
