#!/usr/bin/env bash
# Draft quality on a real chat target (SmolLM2-135M-Instruct) on GPUs, end to end with flashdraft's own
# commands: regenerate answers with the target -> train a DFlash draft -> evaluate (DFlash vs prompt
# lookup vs plain decoding), plus a 1-GPU vs 2-GPU training check with the same global batch.
#
#   python benchmarks/smollm2_prepare.py --out DATA              # on any machine with the packaged sources
#   benchmarks/smollm2_quality.sh warmup GGUF DATA WORK          # regenerate the answers (all shards at once)
#   benchmarks/smollm2_quality.sh check 1 DATA WORK              # 1 GPU x 2 accumulation ...
#   benchmarks/smollm2_quality.sh check 2 DATA WORK              # ... vs 2 GPUs x 1, same data order
#   benchmarks/smollm2_quality.sh main DATA WORK                 # one GPU, MAIN_BUDGET_S of training
#   benchmarks/smollm2_quality.sh evaluate DATA WORK             # results under WORK/results
#   python benchmarks/smollm2_report.py WORK --out DIR           # tables + training-curve plot
#   benchmarks/smollm2_quality.sh all GGUF DATA WORK             # all of the above in one go (report in WORK/report)
#
# Phases are separate so that each fits a short machine window; WORK keeps the state between them. The
# GPUs are the caller's CUDA_VISIBLE_DEVICES. `main` sizes its steps from the 1-GPU check's step time.
# Environment: MAIN_BUDGET_S (seconds of main training, default 900), CHECK_STEPS (default 60),
# ATTENTION (flex; sdpa for a CPU smoke run), DEVICE (cuda; cpu for a smoke run).
set -euo pipefail
phase=${1:-}
run() { echo "+ $*" >&2; "$@"; }
flashdraft() { python3 -m flashdraft.cli "$@"; }
wait_all() { local rc=0 pid; for pid in "$@"; do wait "$pid" || rc=$?; done; return $rc; }
set_common() {  # COMMON: the training settings shared by the checks and the main run
  local work=$1 answers
  answers=$(printf '%s,' "$work"/warmup_*/train.jsonl)
  COMMON=(--config smollm2_135m "target.name_or_path=$(cat "$work/target_path")" target.dtype=bfloat16
          "data.train=[${answers%,}]" data.limit=null
          data.max_length=512 data.eval_samples=64 objective.num_anchors=64 "objective.attention=${ATTENTION:-flex}"
          train.micro_batch_size=32 train.epochs=100 train.checkpoint_every=100000)
}

case $phase in
warmup)
  gguf=$2 data=$3 work=$4
  mkdir -p "$work"
  # Greedy answers from the target itself, one process per prompt file, spread over the GPUs given.
  # A 135M model's decode step is mostly per-step overhead, so processes side by side add throughput:
  # two shards on one H200 made about 1,600 answer tokens/s at 128 rows a batch, 4,140 at 384.
  # prompts_NAME.jsonl answers go to warmup_NAME; a shard whose warmup finished before is not redone
  # (flashdraft warmup finds its manifest and returns).
  IFS=, read -ra gpus <<< "${CUDA_VISIBLE_DEVICES:-0}"
  pids=() n=0
  for prompts in "$data"/prompts_*.jsonl; do
    shard=$(basename "$prompts" .jsonl); shard=${shard#prompts_}
    CUDA_VISIBLE_DEVICES=${gpus[n % ${#gpus[@]}]} \
      run flashdraft warmup --target "$gguf" --prompts "$prompts" \
      --output "$work/warmup_$shard" --cache-dir "$work/cache_$shard" --max-new-tokens 256 \
      --temperature 0 --batch-size 384 --backend static > "$work/warmup_$shard.log" 2>&1 &
    pids+=($!)
    n=$((n + 1))
  done
  wait_all "${pids[@]}"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['target_path'])" \
    "$work/warmup_0/manifest.json" > "$work/target_path"
  ;;
check)
  nproc=$2 work=$4
  steps=${CHECK_STEPS:-60}
  set_common "$work"
  # Same global batch (64 samples) and data order either way: 1 GPU x 2 accumulation or 2 GPUs x 1.
  # 32 samples a micro-batch: at 8 the step was launch-bound (a probe on one H200: 104 samples/s at
  # 8 x 2, 294 at 32 x 1, 332 at 64 x 1; benchmarks/RESULTS.md section 4).
  run python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" -m flashdraft.cli train \
    "${COMMON[@]}" "train.grad_accum_steps=$((2 / nproc))" "train.max_steps=$steps" \
    train.eval_every=0 train.log_every=5 "train.output_dir=$work/check_${nproc}gpu" > "$work/check_${nproc}gpu.log" 2>&1
  ;;
main)
  work=$3
  set_common "$work"
  # As many steps as fit the budget at the 1-GPU check's mean step time, leaving out its first logged
  # interval (compilation). Run 3 sized from the last interval alone (0.199 s; mean 0.223 s), and its main
  # run, at a median 0.278 s a step, overran the budget by 44% (benchmarks/RESULTS.md section 4).
  steps=$(python3 -c "
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if 'step_time_s' in line]
print(max(20, int(float(sys.argv[2]) / statistics.mean(r['step_time_s'] for r in rows[1:]))))" \
    "$work/check_1gpu/metrics.jsonl" "${MAIN_BUDGET_S:-900}")
  run flashdraft train "${COMMON[@]}" train.grad_accum_steps=2 "train.max_steps=$steps" \
    train.eval_every=250 train.log_every=25 "train.output_dir=$work/main" > "$work/main.log" 2>&1
  ;;
evaluate)
  data=$2 work=$3
  target=$(cat "$work/target_path")
  mkdir -p "$work/results"
  # float32: the lossless check is exact there. Two processes side by side, one per GPU where two are
  # given (each then times its decoding on a GPU of its own). The held-out prompts of the training
  # sources run too: they show what the draft reaches where training and traffic match.
  IFS=, read -ra gpus <<< "${CUDA_VISIBLE_DEVICES:-0}"
  pids=() n=0
  for group in "gsm8k heldout_word heldout_gym" "humaneval chat heldout_code"; do
    benches=() name=eval
    for b in $group; do benches+=("$data/$b.jsonl"); name+=_$b; done
    CUDA_VISIBLE_DEVICES=${gpus[n % ${#gpus[@]}]} run flashdraft evaluate --draft "$work/main/export" \
      --target "$target" --bench "${benches[@]}" --max-new-tokens 192 --dtype float32 \
      --device "${DEVICE:-cuda}" --output "$work/results/$name/report.json" > "$work/results/$name.log" 2>&1 &
    pids+=($!)
    n=$((n + 1))
  done
  wait_all "${pids[@]}"
  ;;
all)
  # Every phase in order on the GPUs given (the 2-process check needs two of them, or DEVICE=cpu), then
  # the report.
  gguf=$2 data=$3 work=$4
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  bash "$0" warmup "$gguf" "$data" "$work"
  bash "$0" check 1 "$data" "$work"
  if [[ ${DEVICE:-cuda} == cpu ]] || (( gpus >= 2 )); then
    bash "$0" check 2 "$data" "$work"
  else
    echo "one GPU visible: the 2-GPU check is left out" >&2
  fi
  bash "$0" main "$data" "$work"
  bash "$0" evaluate "$data" "$work"
  python3 "$(dirname "$0")/smollm2_report.py" "$work" --out "$work/report"
  ;;
*)
  echo "usage: $0 warmup GGUF DATA WORK | check 1|2 DATA WORK | main DATA WORK | evaluate DATA WORK" \
       "| all GGUF DATA WORK" >&2
  exit 2
  ;;
esac
