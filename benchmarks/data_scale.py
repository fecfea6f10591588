"""Data at scale: `flashdraft prepare-data` as the number of rows grows (CPU), and regeneration throughput
of the warmup's generation backends (GPU).

    python benchmarks/data_scale.py cpu --rows 20000 200000 2000000 --out benchmarks/results/data_scale
    python benchmarks/data_scale.py prompts      # here: ShareGPT first turns -> SmolLM2 token ids (JSON)
    python benchmarks/data_scale.py gpu --model smollm2 --target SmolLM2.gguf   # on the GPU machine
    python benchmarks/data_scale.py gpu --model qwen3-8b-shape                  # on the GPU machine
    python benchmarks/data_scale.py report       # gpu_*.json -> gpu.md and the hours for 1M prompts

cpu: for each size it writes a synthetic chat parquet (a user turn and an assistant turn, about 1 KB of
text a row, seeded words), runs `flashdraft prepare-data` on it in a fresh process with the SmolLM2
tokenizer and chat template, and samples the resident memory of that process and its workers (the sum
over the process tree) every 0.1 s. The goal: peak memory flat in the number of rows (2M rows within 1.3x
of 20K rows) and time linear in it. Results: <out>/cpu.json and <out>/cpu.md.

gpu: the warmup's own generation backends (`flashdraft.data.generation`) on the same prompts and model,
timed side by side (`--backends`): static batches (prompts sorted by length, as the warmup batches them)
with transformers' `generate` and with the graphed backend (one static cache a batch, CUDA-graph decode
steps; `graphed` with compiled decoder layers, as long warmups run it, `graphed-eager` without, as
short ones do and as every graphed row in RESULTS.md before its fifteenth session was measured) at the
`--static-batch` sizes, and continuous batching with every prompt queued at once.
Completion tokens per second, mean answer length, truncated fraction. `smollm2`: SmolLM2-135M-Instruct (bf16) answering ShareGPT first turns
at T=0.8 up to 1024 new tokens, plus a greedy fp32 check that continuous batching answers token for token
like one-prompt static generation. `qwen3-8b-shape`: a random-weight bf16 model of Qwen3-8B's shape with
300 seeded stop ids (answers end at random, lengths spread like real ones) at T=1. The prompts file is
made here (`prompts`) because the GPU machine needs no datasets package then.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
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


def tree_rss(process) -> tuple[int, int]:
    """Resident bytes of a process and all its descendants: all of it, and the anonymous part alone.

    RSS also counts the pages of memory-mapped files (the Arrow tables the datasets library maps), which
    the kernel can drop at any time; the anonymous part (`RssAnon`) is the memory the process really holds.
    """
    import psutil

    total = anonymous = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
            status = Path(f"/proc/{member.pid}/status").read_text()
        except (psutil.Error, OSError):
            continue
        found = re.search(r"^RssAnon:\s+(\d+) kB", status, re.MULTILINE)
        anonymous += int(found.group(1)) * 1024 if found else 0
    return total, anonymous


def measure(command: list[str], env: dict, log: Path) -> dict:
    import psutil

    started = time.perf_counter()
    # Output to a file, not a pipe: a pipe nobody reads until the end fills up and stalls the child.
    with log.open("w") as sink:
        child = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
        watched = psutil.Process(child.pid)
        peak = peak_anonymous = 0
        while child.poll() is None:
            total, anonymous = tree_rss(watched)
            peak, peak_anonymous = max(peak, total), max(peak_anonymous, anonymous)
            time.sleep(0.1)
    output = log.read_text()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{output[-4000:]}")
    return {"seconds": round(time.perf_counter() - started, 1), "peak_rss_mb": round(peak / 2**20, 1),
            "peak_anonymous_rss_mb": round(peak_anonymous / 2**20, 1),
            "summary": output.strip().splitlines()[-1]}


def run_cpu(sizes: list[int], out: Path, work: Path, target: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_DATASETS_CACHE": str(work / "hf-datasets")}
    results = []
    for rows in sizes:
        data = synthetic_parquet(work / f"chats-{rows}.parquet", rows)
        prepared = work / f"prepared-{rows}"
        command = [sys.executable, "-m", "flashdraft.cli", "prepare-data", "data.max_length=512", "draft.block_size=16",
                   "--output", str(prepared), "--target", target, "--train", str(data)]
        print(f"prepare-data on {rows} rows ({data.stat().st_size / 2**20:.0f} MB parquet) ...", flush=True)
        measured = measure(command, env, work / f"prepare-{rows}.log")
        result = {"rows": rows, "parquet_mb": round(data.stat().st_size / 2**20, 1), **measured}
        stats = json.loads((prepared / "stats.json").read_text())
        result.update(kept_rows=stats["rows"], tokens=stats["tokens"],
                      rows_per_second=round(rows / result["seconds"], 1))
        print(json.dumps(result), flush=True)
        results.append(result)
    base = results[0]
    for result in results:
        result["rss_vs_smallest"] = round(result["peak_rss_mb"] / base["peak_rss_mb"], 3)
        result["anonymous_rss_vs_smallest"] = round(result["peak_anonymous_rss_mb"] / base["peak_anonymous_rss_mb"], 3)
        result["seconds_per_row_vs_smallest"] = round(
            (result["seconds"] / result["rows"]) / (base["seconds"] / base["rows"]), 3)
    report = {"command": " ".join(sys.argv), "machine": _machine(), "target_tokenizer": target, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| rows | parquet MB | wall s | rows/s | peak RSS MB | RSS vs smallest | peak anonymous RSS MB | "
             "anonymous vs smallest | s/row vs smallest |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['rows']:,} | {r['parquet_mb']} | {r['seconds']} | {r['rows_per_second']} | {r['peak_rss_mb']} | "
              f"{r['rss_vs_smallest']}x | {r['peak_anonymous_rss_mb']} | {r['anonymous_rss_vs_smallest']}x | "
              f"{r['seconds_per_row_vs_smallest']}x |" for r in results]
    (out / "cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


def _machine() -> dict:
    import psutil

    return {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform()}


# -- GPU: regeneration throughput ------------------------------------------------------------------------

PROMPTS = Path(__file__).resolve().parent / "results" / "data_scale" / "prompts_sharegpt_smollm2.json"
QWEN3_8B_SHAPE = dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, intermediate_size=12288, vocab_size=151936, max_position_embeddings=4096,
                      tie_word_embeddings=False)


def make_prompts(out: Path, count: int, max_prompt_tokens: int) -> dict:
    """The first human turn of ShareGPT train conversations, rendered with SmolLM2's chat template."""
    from transformers import GenerationConfig

    from flashdraft.data.regenerate import Renderer, turn_groups
    from flashdraft.data.sources import load_chat_dataset
    from flashdraft.data.warmup import stop_token_ids
    from flashdraft.target.cache import materialise
    from flashdraft.target.source import load_tokenizer

    folder = materialise("packaged:smollm2").path
    tokenizer = load_tokenizer(str(folder))
    render = Renderer(tokenizer)
    rows = load_chat_dataset("packaged:sharegpt", split="train", limit=4 * count, seed=0)
    prompts, too_long = [], 0
    for row in rows:
        ids = render(turn_groups(row["messages"])[0])
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        prompts.append({"id": row["id"], "ids": ids})
        if len(prompts) == count:
            break
    stops = stop_token_ids(tokenizer, GenerationConfig.from_pretrained(folder))
    data = {"source": "packaged:sharegpt (train split, first human turn)", "tokenizer": "SmolLM2-135M-Instruct",
            "max_prompt_tokens": max_prompt_tokens, "skipped_too_long": too_long, "stop_ids": stops,
            "pad_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0],
            "prompts": prompts}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data) + "\n")
    lengths = sorted(len(p["ids"]) for p in prompts)
    print(f"{len(prompts)} prompts ({too_long} longer than {max_prompt_tokens} skipped), prompt tokens: "
          f"median {lengths[len(lengths) // 2]}, max {lengths[-1]} -> {out}")
    return data


def timed_generation(generator, prompts: list[list[int]], sampling, limit: int, batch: int | None) -> dict:
    """Every prompt answered once; `batch`: static batches of that many prompts (sorted by length), None: all
    handed over at once (continuous batching queues them)."""
    import torch

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    groups = [order[i:i + batch] for i in range(0, len(order), batch)] if batch else [order]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    started = time.perf_counter()
    completions = {}
    for number, group in enumerate(groups):
        answers = generator.generate([prompts[i] for i in group], sampling, [limit] * len(group), [number])
        completions.update(zip(group, answers))
        print(f"  batch {number + 1}/{len(groups)} done at {time.perf_counter() - started:.1f} s", flush=True)
    sync()
    seconds = time.perf_counter() - started
    lengths = [len(completions[i].token_ids) for i in range(len(prompts))]
    return {"seconds": round(seconds, 2), "completion_tokens": sum(lengths),
            "tokens_per_second": round(sum(lengths) / seconds, 1),
            "mean_completion_tokens": round(sum(lengths) / len(lengths), 1),
            "truncated_fraction": round(sum(completions[i].finish_reason == "length"
                                            for i in range(len(prompts))) / len(prompts), 4)}


def throughput(model, prompts, stops, pad, sampling, limit, static_batches, backends, out: dict, save) -> dict:
    """Fills `out` run by run, calling `save()` after each (a run cut short keeps what was measured)."""
    from flashdraft.data.generation import ContinuousGenerator, GraphedGenerator, StaticGenerator

    def graphed(model, stops, pad):
        """Compiled layers, as the warmup runs them where its decode steps repay the compilation."""
        return GraphedGenerator(model, stops, pad, compile_layers=True)

    warm = [p[:64] for p in prompts[:8]]
    batched = {"static": StaticGenerator, "graphed": graphed, "graphed-eager": GraphedGenerator}
    for backend in [b for b in backends if b in batched]:
        for batch in static_batches:
            generator = batched[backend](model, stops, pad)
            generator.generate(warm, sampling, [8] * len(warm), [0])  # CUDA and kernel warm-up, untimed
            name = f"{backend}_batch_{batch}"
            out[name] = timed_generation(generator, prompts, sampling, limit, batch)
            print(f"{name}: {json.dumps(out[name])}", flush=True)
            save()
    if "continuous" not in backends:
        return out
    generator = ContinuousGenerator(model, stops, pad)
    try:
        generator.generate(warm, sampling, [8] * len(warm), [0])  # builds the paged cache (and graphs), untimed
        out["continuous"] = timed_generation(generator, prompts, sampling, limit, None)
    finally:
        generator.close()
    print(f"continuous: {json.dumps(out['continuous'])}", flush=True)
    save()
    return out


def greedy_agreement(model, prompts, stops, pad, limit: int, backends) -> dict:
    """Each batching backend (all prompts in one call) vs static generation of one prompt at a time, greedy."""
    from flashdraft.data.generation import ContinuousGenerator, GraphedGenerator, StaticGenerator
    from flashdraft.data.sampling import Sampling

    alone = [StaticGenerator(model, stops, pad).generate([p], Sampling(), [limit], [0])[0] for p in prompts]
    kinds = {"continuous": ContinuousGenerator, "graphed": GraphedGenerator}
    report = {"prompts": len(prompts), "max_new_tokens": limit, "dtype": str(model.dtype)}
    for backend in [b for b in backends if b in kinds]:
        generator = kinds[backend](model, stops, pad)
        try:
            batched = generator.generate(prompts, Sampling(), [limit] * len(prompts), [0])
        finally:
            generator.close()
        divergences = []
        for a, b in zip(alone, batched):
            if a.token_ids != b.token_ids:
                first = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                             min(len(a.token_ids), len(b.token_ids)))
                divergences.append(first)
        report[backend] = {"equal": len(prompts) - len(divergences), "first_divergence_positions": divergences}
    return report


def run_gpu(model_name: str, target: str | None, out: Path, count: int, limit: int, static_batches: list[int],
            backends: list[str]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from flashdraft.data.sampling import Sampling

    data = json.loads(PROMPTS.read_text())
    prompts = [p["ids"] for p in data["prompts"][:count]]
    report = {"command": " ".join(sys.argv), "machine": {**_machine(), "gpu": torch.cuda.get_device_name()},
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "model": model_name, "prompts": len(prompts), "prompt_source": data["source"],
              "max_new_tokens": limit, "sampling": "T=0.8" if model_name == "smollm2" else "T=1.0",
              "throughput": {}}
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (out / f"gpu_{model_name}.json").write_text(json.dumps(report, indent=2) + "\n")

    if model_name == "smollm2":
        from flashdraft.target.cache import materialise

        folder = materialise(target or "packaged:smollm2").path
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
        stops, pad, sampling = data["stop_ids"], data["pad_id"], Sampling(temperature=0.8)
        throughput(model, prompts, stops, pad, sampling, limit, static_batches, backends, report["throughput"], save)
        del model
        torch.cuda.empty_cache()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()
        report["greedy_fp32"] = greedy_agreement(model, prompts[:12], stops, pad, 64, backends)
        print(f"greedy: {json.dumps(report['greedy_fp32'])}", flush=True)
        save()
    else:
        config = Qwen3Config(**QWEN3_8B_SHAPE)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        generator = torch.Generator().manual_seed(0)
        stops = torch.randperm(config.vocab_size, generator=generator)[:300].tolist()
        report["parameters_b"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
        print(f"model built: {report['parameters_b']}B parameters", flush=True)
        throughput(model, prompts, stops, 0, Sampling(temperature=1.0), limit, static_batches, backends,
                   report["throughput"], save)
    return report


def write_gpu_report(out: Path, prompts_per_run: int = 1_000_000, gpus: int = 8) -> str:
    """gpu_*.json -> gpu.md: throughput side by side and the hours `prompts_per_run` prompts take on `gpus`
    GPUs at each measured rate (answers as long as measured)."""
    lines = ["| run | model | backend | completion tok/s (1 GPU) | mean answer tokens | truncated | vs best static | "
             f"hours for {prompts_per_run:,} prompts on {gpus} GPUs |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    notes = []
    for path in sorted(out.glob("gpu_*.json")):
        report = json.loads(path.read_text())
        runs = report["throughput"]
        best = max(v["tokens_per_second"] for k, v in runs.items() if k.startswith("static"))
        for name, run in runs.items():
            hours = prompts_per_run * run["mean_completion_tokens"] / (run["tokens_per_second"] * gpus) / 3600
            lines.append(f"| {path.stem} | {report['model']} ({report['sampling']}) | {name.replace('_', ' ')} | "
                         f"{run['tokens_per_second']:,.0f} | {run['mean_completion_tokens']:.0f} | "
                         f"{run['truncated_fraction']:.1%} | {run['tokens_per_second'] / best:.2f}x | {hours:.1f} |")
        if "greedy_fp32" in report:
            g = report["greedy_fp32"]
            # Reports written before the graphed backend hold continuous batching's counts at the top level.
            checks = {name: g[name] for name in ("continuous", "graphed") if name in g} or {"continuous": g}
            for name, check in checks.items():
                notes.append(f"Greedy check ({report['model']}, {g['dtype']}, {g['prompts']} prompts, "
                             f"{g['max_new_tokens']} new tokens): {name} batching equal to one-prompt static "
                             f"generation on {check['equal']} of {g['prompts']}; first divergences at "
                             f"{check['first_divergence_positions'] or 'none'}.")
        notes.append(f"{path.name}: {report['prompts']} prompts, up to {report['max_new_tokens']} new tokens, "
                     f"{report['machine']['gpu']}, torch {report['torch']}, transformers {report['transformers']}.")
    text = "\n".join(lines + [""] + notes) + "\n"
    (out / "gpu.md").write_text(text)
    print(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    cpu = sub.add_parser("cpu", help="prepare-data time and peak memory by number of rows")
    cpu.add_argument("--rows", type=int, nargs="+", default=[20_000, 200_000, 2_000_000])
    cpu.add_argument("--out", type=Path, default=Path("benchmarks/results/data_scale"))
    cpu.add_argument("--work", type=Path, default=Path("/tmp/flashdraft-data-scale"),
                     help="where the synthetic parquet files and prepared sets go (several GB at 2M rows)")
    cpu.add_argument("--target", default="packaged:smollm2", help="whose tokenizer and chat template")
    prompts = sub.add_parser("prompts", help="ShareGPT first turns as SmolLM2 token ids (for the gpu mode)")
    prompts.add_argument("--count", type=int, default=256)
    prompts.add_argument("--max-prompt-tokens", type=int, default=1024)
    gpu = sub.add_parser("gpu", help="the generation backends' throughput on one GPU")
    gpu.add_argument("--model", choices=("smollm2", "qwen3-8b-shape"), required=True)
    gpu.add_argument("--target", help="smollm2: the GGUF file or HF folder (default packaged:smollm2)")
    gpu.add_argument("--count", type=int, default=256, help="prompts")
    gpu.add_argument("--max-new-tokens", type=int, default=1024)
    gpu.add_argument("--static-batch", type=int, nargs="+", default=[32])
    gpu.add_argument("--backends", nargs="+", choices=("static", "graphed", "graphed-eager", "continuous"),
                     default=["static", "graphed", "continuous"])
    report = sub.add_parser("report", help="gpu_*.json -> gpu.md with the hours for 1M prompts on 8 GPUs")
    for sub_parser in (gpu, report):
        sub_parser.add_argument("--out", type=Path, default=Path("benchmarks/results/data_scale"))
    args = parser.parse_args()
    if args.mode == "cpu":
        run_cpu(sorted(args.rows), args.out, args.work, args.target)
    elif args.mode == "prompts":
        make_prompts(PROMPTS, args.count, args.max_prompt_tokens)
    elif args.mode == "gpu":
        run_gpu(args.model, args.target, args.out, args.count, args.max_new_tokens, args.static_batch, args.backends)
    else:
        write_gpu_report(args.out)


if __name__ == "__main__":
    main()
