#!/usr/bin/env bash
# Issue 22's regeneration laid out two ways on one GPU, side by side on the same prompts: a warmup process a
# prompt file (128 rows each, side by side: quality_sharegpt.sh before the thirty-ninth session) against one
# process for all the files (1,024 rows: its warmup phase since). The first N prompts of each of DATA's files,
# the script's settings (T=0.2, top-p 0.9, answers up to 1,024 tokens); each arm's wall time (the target's
# loading included) and its warmups' statistics go to OUT/warmup_processes_ab.json.
#
#   benchmarks/warmup_processes_ab.sh SmolLM2-135M-Instruct.Q4_1.gguf DATA OUT [N, default 512]   # one GPU
#   MAX_NEW_TOKENS=8 benchmarks/warmup_processes_ab.sh ... DATA OUT 2      # a CPU smoke run of the script
set -euo pipefail
gguf=$1 data=$2 out=$3 n=${4:-512}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "error: N=$n; give the prompts taken from each file, a positive number" >&2; exit 2; }
# A warmup finds its earlier output and does nothing: a second A/B into the same OUT would time nothing.
[ ! -e "$out/per_file" ] && [ ! -e "$out/one_process" ] ||
  { echo "error: $out holds an earlier A/B's warmups; give a new OUT" >&2; exit 2; }
[ -e "$gguf" ] || { echo "error: $gguf does not exist; give the target (its GGUF file or HF folder)" >&2; exit 2; }
files=("$data"/prompts_*.jsonl)
[ -e "${files[0]}" ] || { echo "error: $data holds no prompts_*.jsonl; make it with quality_sharegpt_prepare.py" >&2
  exit 2; }
mkdir -p "$out/prompts"
for file in "${files[@]}"; do head -n "$n" "$file" > "$out/prompts/$(basename "$file")"; done
cut=("$out"/prompts/prompts_*.jsonl)
warmup() { python3 -m flashdraft.cli warmup --target "$gguf" --max-new-tokens "${MAX_NEW_TOKENS:-1024}" --max-length 1024 \
  --temperature 0.2 --top-p 0.9 --backend graphed --turns first "$@"; }

began=$(date +%s%N)
pids=()
for file in "${cut[@]}"; do
  name=$(basename "$file" .jsonl)
  warmup --prompts "$file" --output "$out/per_file/$name" --cache-dir "$out/per_file/cache_$name" \
    --batch-size "$n" --rows 128 > "$out/per_file_$name.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
per_file=$(( ($(date +%s%N) - began) / 1000000 ))

began=$(date +%s%N)
warmup --prompts "${cut[@]}" --output "$out/one_process/answers" --cache-dir "$out/one_process/cache" \
  --batch-size $(( n * ${#cut[@]} )) --rows 1024 > "$out/one_process.log" 2>&1
one=$(( ($(date +%s%N) - began) / 1000000 ))

python3 - "$out" "$per_file" "$one" "$n" <<'EOF'
import json, sys
from pathlib import Path

out, n = Path(sys.argv[1]), int(sys.argv[4])
per_file, one = int(sys.argv[2]) / 1000, int(sys.argv[3]) / 1000  # milliseconds
def stats(folder): return json.loads((folder / "stats.json").read_text())
shards = [stats(f) for f in sorted((out / "per_file").glob("prompts_*"))]
single = stats(out / "one_process" / "answers")
arms = {
    "per_file": {"layout": f"{len(shards)} processes side by side, each one file, 128 rows",
                 "wall_s": round(per_file, 1), "answers": sum(s["samples"] for s in shards),
                 "answer_tokens": sum(s["completion_tokens"]["total"] for s in shards),
                 "slowest_decoding_s": max(s["run"]["seconds"] for s in shards)},
    "one_process": {"layout": f"one process, {len(shards)} files, 1,024 rows", "wall_s": round(one, 1),
                    "answers": single["samples"], "answer_tokens": single["completion_tokens"]["total"],
                    "slowest_decoding_s": single["run"]["seconds"]},
}
for arm in arms.values():
    arm["answer_tokens_per_s"] = round(arm["answer_tokens"] / arm["wall_s"])
report = {"prompts_a_file": n, "arms": arms,
          "one_process_over_per_file": round(arms["one_process"]["answer_tokens_per_s"]
                                             / arms["per_file"]["answer_tokens_per_s"], 2)}
(out / "warmup_processes_ab.json").write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report, indent=1))
EOF
