#!/usr/bin/env bash
# Draft quality on a real chat target (SmolLM2-135M-Instruct) on GPUs, end to end with flashdraft's own
# commands: regenerate answers with the target -> train a DFlash draft -> evaluate (DFlash vs prompt
# lookup vs plain decoding), plus a 1-GPU vs 2-GPU training check with the same global batch.
#
#   python benchmarks/smollm2_prepare.py --out DATA          # on any machine with the packaged sources
#   benchmarks/smollm2_quality.sh train GGUF DATA WORK       # needs 2 GPUs
#   benchmarks/smollm2_quality.sh evaluate DATA WORK         # then: results under WORK/results
#
# Phases are separate so that each fits a 10-minute window; WORK keeps the state between them.
# Environment: MAIN_BUDGET_S (seconds of main training, default 240), CHECK_STEPS (default 60),
# ATTENTION (flex; sdpa for a CPU smoke run), DEVICE (cuda; cpu for a smoke run).
set -euo pipefail
phase=$1
run() { echo "+ $*" >&2; "$@"; }
flashdraft() { python3 -m flashdraft.cli "$@"; }

if [[ $phase == train ]]; then
  gguf=$2 data=$3 work=$4
  mkdir -p "$work"
  # Regenerate the training answers with the target, greedy, one warmup per GPU on half the prompts.
  for shard in 0 1; do
    CUDA_VISIBLE_DEVICES=$shard run flashdraft warmup --target "$gguf" --prompts "$data/prompts_$shard.jsonl" \
      --output "$work/warmup_$shard" --cache-dir "$work/cache_$shard" --max-new-tokens 256 \
      --temperature 0 --batch-size 128 --backend transformers > "$work/warmup_$shard.log" 2>&1 &
  done
  wait
  target=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['target_path'])" "$work/warmup_0/manifest.json")
  echo "$target" > "$work/target_path"
  common=(--config smollm2_135m "target.name_or_path=$target" target.dtype=bfloat16
          "data.train=[$work/warmup_0/train.jsonl,$work/warmup_1/train.jsonl]" data.limit=null
          data.max_length=512 data.eval_samples=64 strategy.num_anchors=64 "strategy.attention=${ATTENTION:-flex}"
          train.micro_batch_size=8 train.epochs=100 train.checkpoint_every=100000 train.log_every=5)
  steps=${CHECK_STEPS:-60}
  # Same global batch (16 samples), same data order: 1 GPU x 2 accumulation vs 2 GPUs x 1.
  CUDA_VISIBLE_DEVICES=0 run flashdraft train "${common[@]}" train.grad_accum_steps=2 \
    "train.max_steps=$steps" train.eval_every=0 "train.output_dir=$work/check_1gpu" > "$work/check_1gpu.log" 2>&1
  run python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m flashdraft.cli train "${common[@]}" \
    train.grad_accum_steps=1 "train.max_steps=$steps" train.eval_every=0 \
    "train.output_dir=$work/check_2gpu" > "$work/check_2gpu.log" 2>&1
  # The main run: 2 GPUs, as many steps as fit the budget at the measured step time.
  # (the last logged interval: the first one includes compilation)
  main_steps=$(python3 -c "
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if 'step_time_s' in line]
print(max(20, int(float(sys.argv[2]) / rows[-1]['step_time_s'])))" "$work/check_2gpu/metrics.jsonl" "${MAIN_BUDGET_S:-240}")
  run python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m flashdraft.cli train "${common[@]}" \
    train.grad_accum_steps=1 "train.max_steps=$main_steps" train.eval_every=250 train.log_every=25 \
    "train.output_dir=$work/main" > "$work/main.log" 2>&1
elif [[ $phase == evaluate ]]; then
  data=$2 work=$3
  target=$(cat "$work/target_path")
  mkdir -p "$work/results"
  # float32: the lossless check is exact there. One benchmark group per GPU.
  CUDA_VISIBLE_DEVICES=0 run flashdraft evaluate --draft "$work/main/export" --target "$target" \
    --bench "$data/gsm8k.jsonl" --max-new-tokens 192 --dtype float32 --device ${DEVICE:-cuda} \
    --output "$work/results/eval_gsm8k/report.json" > "$work/results/eval_gsm8k.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 run flashdraft evaluate --draft "$work/main/export" --target "$target" \
    --bench "$data/humaneval.jsonl" "$data/chat.jsonl" --max-new-tokens 192 --dtype float32 --device ${DEVICE:-cuda} \
    --output "$work/results/eval_humaneval_chat/report.json" > "$work/results/eval_humaneval_chat.log" 2>&1 &
  wait
else
  echo "usage: $0 train GGUF DATA WORK | evaluate DATA WORK" >&2
  exit 2
fi
