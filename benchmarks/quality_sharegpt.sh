#!/usr/bin/env bash
# Draft quality side by side with the peer trainer (issue 22): SmolLM2-135M-Instruct answers ShareGPT
# first turns and the packaged mix (its model card's sampling, up to the training length); two drafts train on the same
# prepared data, in the same order, with the same draft, optimizer, schedule and number of steps:
# flashdraft's objective and SpecForge 0.2.0's (benchmarks/peer_objective.py, at SpecForge's suggested
# decay for the block size, run inside flashdraft's trainer by benchmarks/peer_train.py); both are
# evaluated by `flashdraft evaluate` on the same GPU.
#
#   python benchmarks/quality_sharegpt_prepare.py --out DATA     # any machine with the packaged sources
#   python benchmarks/quality_sharegpt_prepare.py --out DATA2 --exclude DATA  # new prompts only: warmed up into a
#                                         # WORK holding a copy of the earlier answers, both train together
#   benchmarks/quality_sharegpt.sh warmup GGUF DATA WORK         # regenerate answers (one process a DATA)
#   benchmarks/quality_sharegpt.sh train DATA WORK               # our objective and SpecForge's, side by side
#   benchmarks/quality_sharegpt.sh evaluate flashdraft DATA WORK # decoding + teacher-forced tau
#   benchmarks/quality_sharegpt.sh evaluate peer DATA WORK
#   SPEED_DTYPE=bfloat16 benchmarks/quality_sharegpt.sh speed flashdraft DATA WORK  # the speedup a server sees
#   SPEED_DTYPE=bfloat16 SPEED_BLOCK=8 benchmarks/quality_sharegpt.sh speed flashdraft DATA WORK  # verifying 8
#   benchmarks/quality_sharegpt.sh anchors DATA WORK             # teacher-forced tau at the answers' ends
#   benchmarks/quality_sharegpt.sh collect WORK OUT              # the evidence folder
#   benchmarks/quality_sharegpt.sh all GGUF DATA WORK OUT        # everything in order, then the report;
#                                         # run again, it continues where a machine window stopped it
#   VARIANTS="lr3e-4: train.lr=3e-4; anchors128: objective.num_anchors=128" \
#     benchmarks/quality_sharegpt.sh variants DATA WORK OUT     # recipe variants on WORK's answers, side by side
#
# Seeds are fixed (data.seed, train.seed, warmup.seed, evaluate.seed = 0). Phases are separate so each fits a
# machine window; WORK keeps the state between them. On one H100 (fortieth session): warmup ~3 minutes for a
# DATA of 12,000 prompts (5.4M answer tokens at T=0.2, one process of 1,024 rows; ~6 with a process a shard of
# 128 rows, ~12.5 with batches on an H200), train ~7.5 minutes at 3,600 steps of 32 x 1,024 tokens (compiled
# layers; ~14.5 at 7,200, forty-first session), evaluate ~2-3 minutes a draft on 12 prompts a benchmark in float32
# and the speed pass ~2 more.
# Needs, besides
# flashdraft: specforge==0.2.0 and dflash==0.1.0 (pip install --no-deps). Environment: STEPS (optimizer steps
# of each draft, default 400), MAX_LENGTH (training length = the answers' limit, default 1024), WARMUP_BATCH
# (prompts a generate call, the warmup's resumable unit; default 16,384 on a GPU, a whole DATA in one call: each
# call ends in a tail of steps draining its last long answers, 1.35-1.43x the answer tokens a second against
# 4,096 on an H100, RESULTS.md section 8; else 128), WARMUP_ROWS
# (warmup.rows of the graphed backend: of a call's prompts, this many decode at once, each finished row taking the
# next; default 1,024 on a GPU, where WARMUP_BACKEND is auto or graphed, else unset: all at once; the runs before
# the thirty-ninth session ran a process a shard of 128 rows, those before the thirty-first batches of 128), CHECKPOINT_EVERY (training steps between checkpoints, default 100: a phase stopped at a machine
# window's end resumes from the newest one), EVAL_NEW_TOKENS (decoded tokens a prompt, default 256; the second-turn benchmark's context answers
# get twice that), TEMPERATURE and TOP_P (the answers' sampling, default 0.2 and 0.9), WARMUP_BACKEND (warmup.backend, default auto: graphed on a GPU), DEVICE (evaluation: cuda; cpu for a smoke
# run), ATTENTION (flex; sdpa on a CPU), DRAFTS (the drafts trained, evaluated and collected, default
# "flashdraft peer"; add distill for the distillation experiment, benchmarks/distill_objective.py), TRAIN_ARGS
# (extra key=value settings of both trainings, e.g. for a small smoke run: "data.eval_samples=2
# train.micro_batch_size=2"), EVAL_PROMPTS (the first N prompts of each benchmark, default all 32), EVALUATE
# (the variants phase: 0 trains and collects without decoding, to compare the drafts by the trainer's held-out
# curves with gamma_curves.py, which order drafts as decoding does (RESULTS.md section 8); default 1),
# SPEED_DTYPE (bfloat16 or float16: the evaluate phase then decodes once more at that dtype, the one a server
# runs, for the speedup (`all` runs these passes one draft at a time, alone on the GPU): a float32 verify of 16
# rows runs a GEMM where the plain step's one row runs a GEMV, so on SmolLM2 a float32 draft + verify step costs
# 2.9x a plain one against 1.5-1.8x in bf16, RESULTS.md sections 7 and 8; its report, NAME_report_DTYPE.json,
# counts sequences equal to plain decoding at that dtype, where the two steps round differently, so losslessness
# is the float32 report's; default none), SPEED_BLOCK (the speed pass verifies this many tokens a step,
# evaluate's --block-size, report NAME_report_DTYPE_blockN.json: on SmolLM2 a verify of 8 costs 1.58 plain
# steps against 1.72 for 16, RESULTS.md section 8; default the draft's block).
set -euo pipefail
phase=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
run() { echo "+ $*" >&2; "$@"; }
flashdraft() { python3 -m flashdraft.cli "$@"; }
wait_all() { local rc=0 pid; for pid in "$@"; do wait "$pid" || rc=$?; done; return $rc; }
# One draft decoded on the five benchmarks at one dtype (greedy), with further evaluate options after the
# report: decode NAME DATA WORK DTYPE REPORT [OPTION ...]
decode() {
  run flashdraft evaluate --draft "$3/train_$1/export" --target "$(cat "$3/target_path")" \
    --max-new-tokens "${EVAL_NEW_TOKENS:-256}" --device "${DEVICE:-cuda}" --dtype "$4" --no-prompt-lookup "${@:6}" \
    ${EVAL_PROMPTS:+--num-prompts "$EVAL_PROMPTS"} --output "$5" \
    --bench "$2/gsm8k.jsonl" "$2/humaneval.jsonl" "$2/chat.jsonl" "$2/sharegpt_first_turn.jsonl" \
    "$3/sharegpt_second_turn.jsonl"
}
max_length=${MAX_LENGTH:-1024}
# The WORK folder of DATA's answers, named after its prompt files (warmup_prompts_0-7; one file: warmup_prompts_0):
# the DATA of an --exclude chain number theirs on.
answers_of() {
  local numbers
  numbers=$(cd "$1" 2> /dev/null && ls prompts_*.jsonl 2> /dev/null | sed 's/^prompts_//; s/[.]jsonl$//' | sort -n)
  [ -n "$numbers" ] || { echo "error: $1 holds no prompts_*.jsonl; make it with quality_sharegpt_prepare.py" >&2
    return 2; }
  local first last name
  first=$(head -1 <<< "$numbers") last=$(tail -1 <<< "$numbers")
  name=warmup_prompts_$first
  [ "$first" == "$last" ] || name+="-$last"
  echo "$name"
}
objective_of() { case $1 in flashdraft) echo dflash ;; peer) echo specforge ;; distill) echo distill ;;
  *) echo "error: unknown draft $1 (DRAFTS or the evaluate phase); known: flashdraft peer distill" >&2; exit 2 ;; esac; }
drafts=${DRAFTS:-flashdraft peer}
for name in $drafts; do objective_of "$name" > /dev/null; done  # an unknown name fails before any work
speed_dtype=${SPEED_DTYPE:-}
case $speed_dtype in ""|bfloat16|float16) ;; *)
  echo "error: SPEED_DTYPE=$speed_dtype; give bfloat16 or float16 (the speed pass's dtype), or leave it unset" >&2
  exit 2 ;; esac
speed_block=${SPEED_BLOCK:-}
[[ -z $speed_block || $speed_block =~ ^[1-9][0-9]*$ ]] || {
  echo "error: SPEED_BLOCK=$speed_block; give the tokens a verify checks (at most the draft's block), or leave it unset" >&2
  exit 2; }
# The speed phase's report is NAME_report_TAG.json: TAG the dtype, and the verify's block where SPEED_BLOCK sets one.
speed_tag=$speed_dtype${speed_block:+_block$speed_block}

case $phase in
warmup)
  gguf=$2 data=$3 work=$4
  mkdir -p "$work"
  # One warmup process answers all of DATA's prompt files (a mixture). Sampled answers with the target's
  # recommended settings (SmolLM2-135M-Instruct's card: T=0.2, top-p 0.9; runs 1 to 3 used the Nemotron recipe's
  # T=0.8, where a quarter of the answer tokens are not the target's greedy choice: RESULTS.md section 8) up
  # to the training length.
  # On a GPU the graphed backend decodes WARMUP_ROWS prompts at once, each finished row taking the next one: its
  # decode step costs about the same at 128 rows as at 1,024, so one process of many rows answers more a second
  # than processes of few rows side by side, which share the GPU by turns (RESULTS.md section 8).
  for old in SHARD_BATCH SHARD_ROWS; do
    [ -z "${!old+set}" ] || { echo "error: $old is now WARMUP_${old#SHARD_} (one warmup process answers a whole" \
      "DATA); set that instead" >&2; exit 2; }
  done
  warmup_batch=${WARMUP_BATCH:-128} warmup_rows=${WARMUP_ROWS:-}
  answers=$(answers_of "$data") || exit 2
  shards=("$data"/prompts_*.jsonl)
  # A prompt file is answered once: answers of the same files under another name (a DATA grown in place, a
  # WORK of per-shard answers) would train twice on them.
  range=${answers#warmup_prompts_}
  for folder in "$work"/warmup_prompts_*/; do
    [ -d "$folder" ] || continue
    other=$(basename "$folder") && span=${other#warmup_prompts_}
    [ "$other" != "$answers" ] && (( ${span%-*} <= ${range#*-} && ${range%-*} <= ${span#*-} )) || continue
    echo "error: $work/$other already answers some of $data's prompt files (${range%-*} to ${range#*-}):" \
      "draw new prompts with quality_sharegpt_prepare.py --exclude into a new DATA, or give another WORK" >&2
    exit 2
  done
  if python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    if [[ ${WARMUP_BACKEND:-auto} =~ ^(auto|graphed)$ ]]; then
      warmup_batch=${WARMUP_BATCH:-16384} warmup_rows=${WARMUP_ROWS-1024}  # WARMUP_ROWS= (empty): all at once
    fi
  elif [ -z "${OMP_NUM_THREADS:-}" ]; then
    # On a CPU this warmup and the second-turn benchmark's share the cores; each at torch's default (a thread
    # a core) would spin against the other.
    export OMP_NUM_THREADS=$(( $(nproc) / 2 ))
    (( OMP_NUM_THREADS >= 1 )) || OMP_NUM_THREADS=1
  fi
  # A DATA drawn with --sharegpt-second-turns holds conversations of two user turns: every turn is answered, the
  # second after the target's own first answer. Earlier DATA answer first turns only, as their WORK did.
  turns=first
  if [ -f "$data/counts.json" ]; then
    turns=$(python3 -c '
import json, sys
try:
    print("all" if json.load(open(sys.argv[1])).get("sharegpt_second_turns") else "first")
except (ValueError, AttributeError):
    sys.exit(f"error: {sys.argv[1]} is not the counts a quality_sharegpt_prepare.py run wrote; prepare DATA again")
' "$data/counts.json") || exit 1
  fi
  run flashdraft warmup --target "$gguf" --prompts "${shards[@]}" --output "$work/$answers" \
    --cache-dir "$work/cache_$answers" --max-new-tokens "$max_length" --temperature "${TEMPERATURE:-0.2}" \
    --top-p "${TOP_P:-0.9}" --batch-size "$warmup_batch" ${warmup_rows:+--rows "$warmup_rows"} \
    --backend "${WARMUP_BACKEND:-auto}" --max-length "$max_length" --turns "$turns" > "$work/$answers.log" 2>&1 &
  pids=($!)
  # The second-turn benchmark: the target answers both user turns greedily; its own first answer is
  # then the context of the second turn. Answers of an earlier DATA of an --exclude chain (identical
  # benchmark files), perhaps on another machine without its DATA or caches, are kept by the warmup itself,
  # which compares prompt files and the target by content; other conversations or another target are refused.
  answered=$work/warmup_second_turn
  run flashdraft warmup --target "$gguf" --prompts "$data/sharegpt_second_turn_source.jsonl" \
    --output "$answered" --cache-dir "$work/cache_second_turn" --max-new-tokens $((2 * ${EVAL_NEW_TOKENS:-256})) \
    --temperature 0 --backend "${WARMUP_BACKEND:-auto}" --turns all > "$work/warmup_second_turn.log" 2>&1 &
  pids+=($!)
  wait_all "${pids[@]}"
  cp "$answered/train.jsonl" "$work/sharegpt_second_turn.jsonl"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['target_path'])" \
    "$work/$answers/manifest.json" > "$work/target_path"
  ;;
train)
  work=$3
  answers=$(printf '%s,' "$work"/warmup_prompts_*/train.jsonl)
  # Everything but objective.name is the same for both drafts, the tokenised data too: prepared once,
  # then both trainings read it, side by side on the one GPU (each is launch-bound at this size).
  common=(--config smollm2_135m "target.name_or_path=$(cat "$work/target_path")" target.dtype=bfloat16
    "data.train=[${answers%,}]" data.limit=null "data.max_length=$max_length" data.eval_samples=64
    "data.cache_dir=$work/tokenized" objective.num_anchors=64 "objective.attention=${ATTENTION:-flex}")
  run flashdraft prepare-data "${common[@]}" ${TRAIN_ARGS:-} > "$work/prepare_data.log" 2>&1
  pids=()
  for name in $drafts; do
    run python3 -m torch.distributed.run --standalone --nproc-per-node 1 "$here/peer_train.py" "${common[@]}" \
      train.micro_batch_size=32 train.epochs=100 "train.max_steps=${STEPS:-400}" train.eval_every=100 \
      train.log_every=10 "train.checkpoint_every=${CHECKPOINT_EVERY:-100}" "objective.name=$(objective_of $name)" \
      "train.output_dir=$work/train_$name" ${TRAIN_ARGS:-} > "$work/train_$name.log" 2>&1 &
    pids+=($!)
  done
  wait_all "${pids[@]}"
  ;;
evaluate)
  name=$2 data=$3 work=$4
  objective_of "$name" > /dev/null
  mkdir -p "$work/results"
  # float32, greedy: the lossless check is exact only there (in bf16 a 16-token verify and a 1-token
  # step round differently, and near-ties flip: RESULTS.md section 8). A 135M target is launch-bound, so
  # float32 costs it little time. No prompt-lookup baseline: it decodes eagerly at ~50 tokens/s (RESULTS.md
  # section 4), about ten minutes an evaluation, and the issue's goals are absolute taus.
  decode "$name" "$data" "$work" float32 "$work/results/${name}_report.json" > "$work/results/$name.log" 2>&1
  # Teacher-forced expected tau of the same draft on the target's own answers to held-out ShareGPT
  # conversations: the number training optimises, beside the tau that decoding reaches. The training's
  # settings come first (a variant's draft shape must match its export), the measure's own after them.
  run python3 "$here/heldout_tau.py" --config smollm2_135m --draft "$work/train_$name/export" \
    --eval "sharegpt_heldout=$work/sharegpt_second_turn.jsonl" --out "$work/results/${name}_heldout_tau.json" \
    -- ${TRAIN_ARGS:-} "target.name_or_path=$(cat "$work/target_path")" target.dtype=bfloat16 "data.max_length=$max_length" \
    objective.num_anchors=64 "objective.attention=${ATTENTION:-flex}" >> "$work/results/$name.log" 2>&1
  [ -z "$speed_dtype" ] || bash "$0" speed "$name" "$data" "$work"
  ;;
speed)
  name=$2 data=$3 work=$4
  objective_of "$name" > /dev/null
  [ -n "$speed_dtype" ] || { echo "error: the speed phase needs SPEED_DTYPE (bfloat16 or float16)" >&2; exit 2; }
  mkdir -p "$work/results"
  # The float32 evaluation's prompts and settings at the serving dtype, whose 16-row verify is not priced
  # as float32's GEMM against the plain step's GEMV.
  decode "$name" "$data" "$work" "$speed_dtype" "$work/results/${name}_report_$speed_tag.json" \
    ${speed_block:+--block-size "$speed_block"} > "$work/results/${name}_$speed_tag.log" 2>&1
  ;;
anchors)
  data=$2 work=$3
  target=$(cat "$work/target_path")
  mkdir -p "$work/results"
  # Teacher-forced tau of both drafts on the blocks decoding drafts at an answer's end (their last slots
  # past it), beside the blocks of the training rule, on the target's greedy answers to the decoding prompts
  # that stopped on their own (RESULTS.md section 8, runs 4 and 5).
  cat "$data/gsm8k.jsonl" "$data/humaneval.jsonl" "$data/chat.jsonl" "$data/sharegpt_first_turn.jsonl" \
    > "$work/bench_prompts.jsonl"
  run flashdraft warmup --target "$target" --prompts "$work/bench_prompts.jsonl" --output "$work/bench_greedy" \
    --cache-dir "$work/cache_bench" --max-new-tokens "${EVAL_NEW_TOKENS:-256}" --temperature 0 \
    --backend "${WARMUP_BACKEND:-auto}" > "$work/bench_greedy.log" 2>&1
  python3 -c "import json, sys; rows = [json.loads(line) for line in open(sys.argv[1])]
open(sys.argv[2], 'w').writelines(json.dumps(r) + '\n' for r in rows if r['finish_reason'] == 'stop')" \
    "$work/bench_greedy/train.jsonl" "$work/bench_stopped.jsonl"
  pids=()
  for name in $drafts; do
    for anchors in train tail; do
      run python3 "$here/heldout_tau.py" --config smollm2_135m --draft "$work/train_$name/export" \
        --eval "bench_stopped=$work/bench_stopped.jsonl" --anchors "$anchors" \
        --out "$work/results/${name}_bench_${anchors}.json" -- ${TRAIN_ARGS:-} "target.name_or_path=$target" \
        target.dtype=bfloat16 "data.max_length=$max_length" objective.num_anchors=64 \
        "objective.attention=${ATTENTION:-flex}" > "$work/results/anchors_${name}_${anchors}.log" 2>&1 &
      pids+=($!)
    done
  done
  wait_all "${pids[@]}"
  python3 - "$work" $drafts <<'EOF'
import json, sys
from pathlib import Path

work, drafts = Path(sys.argv[1]), sys.argv[2:]
rules = {"train": "anchors a <= length - B (runs 1-4's training rule)",
         "tail": "the tail (a > length - B: blocks past the end)"}
out = {"what": "teacher-forced expected tau (benchmarks/heldout_tau.py) of both drafts on chosen blocks of the "
               "target's greedy answers to the decoding prompts that stopped on their own",
       "bench_greedy_warmup": json.loads((work / "bench_greedy" / "stats.json").read_text()), "results": {}}
for anchors, label in rules.items():
    scores = {name: json.loads((work / "results" / f"{name}_bench_{anchors}.json").read_text())
              for name in drafts}
    out["results"][f"bench_stopped / {label}"] = {
        name: {k: v for k, v in score["results"]["bench_stopped"].items() if k != "spec"}
        for name, score in scores.items()}
(work / "results" / "heldout_tau_by_anchors.json").write_text(json.dumps(out, indent=1) + "\n")
EOF
  ;;
collect)
  work=$2 out=$3
  python3 - "$work" "$out" $drafts <<'EOF'
import hashlib, json, shutil, sys
from pathlib import Path

work, out, drafts = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
unfinished = [name for name in drafts if not (work / f"train_{name}" / "summary.json").is_file()]
if unfinished:  # checked before anything is written: OUT gets every draft or none
    sys.exit(f"error: {', '.join(f'train_{name}' for name in unfinished)} in {work} did not finish training "
             "(no summary.json); run the train phase again to continue it from its newest checkpoint")
out.mkdir(parents=True, exist_ok=True)
evidence = {}
for name in drafts:
    # A draft whose decoding evaluation has not run (EVALUATE=0, or a machine window that ended in it) is
    # collected without it: its held-out curve still compares it (gamma_curves.py).
    evaluated = all((work / "results" / f"{name}_{part}").is_file() for part in ("report.json", "heldout_tau.json"))
    if evaluated:
        shutil.copy(work / "results" / f"{name}_report.json", out / f"{name}_report.json")
        shutil.copy(work / "results" / f"{name}_heldout_tau.json", out / f"{name}_heldout_tau.json")
    else:
        print(f"note: {name} has no decoding evaluation in {work}/results; collected without it", file=sys.stderr)
    for speed in sorted((work / "results").glob(f"{name}_report_*.json")):  # the speed phase's, per dtype
        shutil.copy(speed, out / speed.name)
    run = work / f"train_{name}"
    shutil.copy(run / "metrics.jsonl", out / f"{name}_training_curve.jsonl")
    shutil.copy(run / "config.yaml", out / f"{name}_config.yaml")
    weights = (run / "export" / "model.safetensors").read_bytes()
    evidence[name] = {"model.safetensors sha256": hashlib.sha256(weights).hexdigest(),
                      "steps": json.loads((run / "summary.json").read_text())["steps"], "evaluated": evaluated}
if (work / "results" / "heldout_tau_by_anchors.json").exists():
    shutil.copy(work / "results" / "heldout_tau_by_anchors.json", out / "heldout_tau_by_anchors.json")
manifests = sorted(work.glob("warmup_prompts_*/manifest.json"))
evidence["warmup"] = [json.loads(m.read_text()) for m in manifests]
# Sessions regenerate the answers; the hashes let a later comparison check it trained on the same ones.
answers = sorted(work.glob("warmup_prompts_*/train.jsonl")) + [work / "sharegpt_second_turn.jsonl"]
evidence["answers sha256"] = {str(path.relative_to(work)): hashlib.sha256(path.read_bytes()).hexdigest()
                              for path in answers}
(out / "evidence.json").write_text(json.dumps(evidence, indent=1) + "\n")
print(json.dumps({k: v for k, v in evidence.items() if k not in ("warmup", "answers sha256")}, indent=1))
EOF
  ;;
variants)
  # Variants of flashdraft's recipe trained and evaluated side by side on WORK's answers (its warmup), each
  # in a folder of its own that links those answers: VARIANTS="NAME: key=value ...; NAME: key=value ...",
  # each variant's settings after TRAIN_ARGS (common to all). Run again with the same settings, the phase
  # continues the variants where a machine window stopped them. OUT gets NAME_training_curve.jsonl,
  # NAME_config.yaml, NAME_evidence.json and, where decoded (not with EVALUATE=0), NAME_report.json,
  # NAME_heldout_tau.json and with SPEED_DTYPE NAME_report_DTYPE.json a variant; with the baseline's
  # flashdraft_* files in OUT (the run whose answers and seed the variants share), quality_NAME_vs_flashdraft.md.
  data=$2 work=$3 out=$4
  [ -n "${VARIANTS:-}" ] || { echo "error: VARIANTS is empty; give 'NAME: key=value ...; NAME: ...'" >&2; exit 2; }
  case ${EVALUATE:-1} in 0|1) ;; *)
    echo "error: EVALUATE=$EVALUATE; give 1 (train, then decode: the default) or 0 (train only)" >&2; exit 2 ;; esac
  ls "$work"/warmup_prompts_*/train.jsonl "$work/target_path" "$work/sharegpt_second_turn.jsonl" > /dev/null ||
    { echo "error: $work lacks the warmup phase's answers; run the warmup phase into it first" >&2; exit 2; }
  names=() settings=() records=()
  IFS=";" read -ra specs <<< "${VARIANTS//$'\n'/ }"  # line breaks are blanks
  for spec in "${specs[@]}"; do
    [[ $spec =~ ^[[:space:]]*$ ]] && continue
    read -r name <<< "${spec%%:*}"
    args=${spec#*:}
    # Every check before any training: a bad variant found after the others trained wastes the machine.
    [[ $spec == *:* && $name =~ ^[A-Za-z0-9._-]+$ ]] ||
      { echo "error: variant '$spec' is not 'NAME: key=value ...' (NAME of letters, digits, . _ -)" >&2; exit 2; }
    case $name in flashdraft|peer|distill)
      echo "error: variant name $name is a draft of the comparison itself; name the variant by what it changes" >&2
      exit 2 ;; esac
    for arg in $args; do [[ $arg == ?*=* ]] ||
      { echo "error: variant $name: '$arg' is not key=value" >&2; exit 2; }; done
    [ -n "${args//[[:space:]]/}" ] || { echo "error: variant $name changes nothing; give its key=value settings" >&2; exit 2; }
    for seen in "${names[@]}"; do [ "$seen" != "$name" ] ||
      { echo "error: variant $name is given twice" >&2; exit 2; }; done
    # A variant folder of the same settings is continued (a machine window ended inside it); of others, kept.
    read -ra words <<< "${TRAIN_ARGS:-} $args STEPS=${STEPS:-400} MAX_LENGTH=$max_length"
    recorded=$(cat "$work/variant_$name/variant_settings" 2> /dev/null || echo "none recorded")
    [ ! -e "$work/variant_$name" ] || [ "$recorded" == "${words[*]}" ] ||
      { echo "error: $work/variant_$name exists with other settings ($recorded; now ${words[*]});" \
          "remove it or name the variant otherwise" >&2; exit 2; }
    [ -z "$(ls "$out/${name}_"* 2> /dev/null)" ] ||
      { echo "error: $out already holds ${name}_* files; give another OUT or name" >&2; exit 2; }
    names+=("$name") settings+=("$args") records+=("${words[*]}")
  done
  for i in "${!names[@]}"; do
    vwork=$work/variant_${names[$i]}
    [ ! -e "$vwork" ] || continue
    mkdir -p "$vwork"
    abs=$(cd "$work" && pwd)
    ln -s "$abs"/warmup_prompts_*/ "$abs"/{target_path,sharegpt_second_turn.jsonl} "$vwork/"  # not the warmup logs
    echo "${records[$i]}" > "$vwork/variant_settings"
  done
  # The variants side by side, each training then evaluating; what a variant has done is not redone, and
  # its training resumes from its newest checkpoint. The speed passes after, one variant at a time, alone on
  # the GPU (as in the all phase).
  pids=()
  for i in "${!names[@]}"; do
    vwork=$work/variant_${names[$i]}
    (
      export DRAFTS=flashdraft TRAIN_ARGS="${TRAIN_ARGS:-} ${settings[$i]}"
      [ -e "$vwork/train_flashdraft/summary.json" ] || bash "$0" train "$data" "$vwork"
      [ "${EVALUATE:-1}" == 0 ] || [ -e "$vwork/results/flashdraft_heldout_tau.json" ] ||
        SPEED_DTYPE= bash "$0" evaluate flashdraft "$data" "$vwork"
    ) &
    pids+=($!)
  done
  wait_all "${pids[@]}"
  for name in "${names[@]}"; do
    vwork=$work/variant_$name
    [ "${EVALUATE:-1}" == 0 ] || [ -z "$speed_dtype" ] ||
      [ -e "$vwork/results/flashdraft_report_$speed_tag.json" ] ||
      DRAFTS=flashdraft bash "$0" speed flashdraft "$data" "$vwork"
  done
  mkdir -p "$out"
  for name in "${names[@]}"; do
    vwork=$work/variant_$name
    DRAFTS=flashdraft bash "$0" collect "$vwork" "$vwork/evidence" > /dev/null
    for file in "$vwork"/evidence/flashdraft_*; do
      cp "$file" "$out/${name}_${file##*/flashdraft_}"
    done
    cp "$vwork/evidence/evidence.json" "$out/${name}_evidence.json"
  done
  if [ -e "$out/flashdraft_report.json" ]; then
    for name in "${names[@]}"; do
      [ ! -e "$out/${name}_report.json" ] ||
        run python3 "$here/quality_sharegpt_report.py" "$out" --ours "$name" --against flashdraft
    done
  else
    echo "no flashdraft_* files in $out: copy the baseline run's there and run" \
      "quality_sharegpt_report.py $out --ours NAME --against flashdraft for the tables" >&2
  fi
  ;;
all)
  # Every phase in order. Run again (a machine window ended inside it), it goes on where it stopped: a phase
  # whose outputs WORK holds is skipped, the warmup continues from its last finished call and training from its newest
  # checkpoint.
  # WORK records the settings that shape those outputs; a rerun with others is refused before any work.
  gguf=$2 data=$3 work=$4 out=$5
  settings="TEMPERATURE=${TEMPERATURE:-0.2} TOP_P=${TOP_P:-0.9} MAX_LENGTH=$max_length STEPS=${STEPS:-400}"
  settings+=" TRAIN_ARGS=${TRAIN_ARGS:-} EVAL_PROMPTS=${EVAL_PROMPTS:-all} EVAL_NEW_TOKENS=${EVAL_NEW_TOKENS:-256}"
  # DATA's shards too: drafts trained before a DATA of --exclude added shards did not see their answers.
  settings+=" DATA_SHARDS=$(cd "$data" 2> /dev/null && ls prompts_*.jsonl 2> /dev/null | sort -V | paste -sd, -)"
  recorded=$(cat "$work/all_settings" 2> /dev/null || true)
  [ -z "$recorded" ] || [ "$recorded" == "$settings" ] ||
    { echo "error: $work holds a run of other settings ($recorded; now $settings): give another WORK," \
        "or the same settings to continue it" >&2; exit 2; }
  mkdir -p "$work"
  echo "$settings" > "$work/all_settings"
  # The warmup is done when DATA has its answers (a DATA of --exclude adds its own to a WORK).
  warmed=$([ -e "$work/target_path" ] && [ -e "$work/$(answers_of "$data")/manifest.json" ] && echo 1 || echo 0)
  [ "$warmed" == 1 ] || bash "$0" warmup "$gguf" "$data" "$work"
  for name in $drafts; do
    [ -e "$work/train_$name/summary.json" ] || { bash "$0" train "$data" "$work"; break; }
  done
  # The evaluations side by side, as in the variants phase (each is launch-bound on a 135M target); their
  # taus do not depend on timing. The speed passes then one at a time, alone on the GPU: their step times are
  # what they measure.
  pids=()
  for name in $drafts; do
    [ -e "$work/results/${name}_heldout_tau.json" ] && continue
    SPEED_DTYPE= bash "$0" evaluate "$name" "$data" "$work" &
    pids+=($!)
  done
  wait_all "${pids[@]}"
  for name in $drafts; do
    [ -z "$speed_dtype" ] || [ -e "$work/results/${name}_report_$speed_tag.json" ] ||
      bash "$0" speed "$name" "$data" "$work"
  done
  [ -e "$work/results/heldout_tau_by_anchors.json" ] || bash "$0" anchors "$data" "$work"
  bash "$0" collect "$work" "$out"
  if [[ " $drafts " == *" flashdraft "* && " $drafts " == *" peer "* ]]; then
    run python3 "$here/quality_sharegpt_report.py" "$out"
  fi
  ;;
*)
  echo "usage: $0 warmup GGUF DATA WORK | train DATA WORK | evaluate flashdraft|peer DATA WORK" \
       "| speed flashdraft|peer DATA WORK | anchors DATA WORK" \
       "| collect WORK OUT | variants DATA WORK OUT | all GGUF DATA WORK OUT" >&2
  exit 2
  ;;
esac
