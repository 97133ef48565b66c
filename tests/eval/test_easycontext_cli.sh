#!/usr/bin/env bash
# EasyContext's own commands (README.md and train_scripts/ at 6b0d310), with only the paths
# changed, run on the CPU on tiny data and models (docs/easycontext.md). PART is one of:
#   train   train_scripts/EasyContext-1M-Llama-2-7B.sh stages 1, 2 and 3 as written with
#           --print-config (every mapped key checked), then stages 1 and 2 for real with
#           --max-train-steps 2 --seq-length 64 (the only change), stage 2 reading stage 1's
#           output folder as EasyContext's does, and stage 3 (zigzag_ring_attn) under mpirun -np 2
#   ppl     README's eval_ppl.py command as written with --print-sweep on two documents of
#           more than 500,000 tokens; then for real with its lengths divided by 1000: the wide
#           CSV EasyContext's plot.py reads, equal to easyctx's own sweep of the same documents
#   needle  README's eval_needle.py command as written with --print-sweep; then for real with
#           --max_context_length 300 --min_context_length 100 --context_interval 100
#   modes   EasyContext's mode names in YAML (mode: zigzag_ring_attn prints as zigzag_ring, ...)
#           and on command lines, --ring_degree / ring_degree -> ulysses_size = size / ring_degree
# "Paths" are the model, dataset, haystack and output folders; `accelerate launch
# --config_file ... train.py` becomes easyctx_train (mpirun -np 2 easyctx_train for 2 ranks).
set -uo pipefail
src=$1
bin=$2
part=$3
work=$(mktemp -d /tmp/easyctx-easycontext.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL ($part): $*"; tail -20 "$work"/*.log 2>/dev/null | cut -c1-300; trap - EXIT; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
source "$src/tests/tiny_data.sh"
tiny_mpirun
seed=$(( (RANDOM << 8 | RANDOM) % 100000 + 1 ))

# key VALUE in a --print-config dump ("    mode: none" under its section).
has_key() {  # file key value
  grep -qE "^ *$2: $3\$" "$1" || fail "$1: expected '$2: $3', got: $(grep -E "^ *$2:" "$1" | head -3)"
}

# A base model folder (what --model meta-llama/Llama-2-7b-hf names): the demo shape, random
# weights of a fresh seed, exported as a Hugging Face folder with the data's tokenizer.
base_model() {
  tok=$(tiny_data "$bin" "$work" 60) || fail "tiny data (tests/tiny_data.sh)"
  {
    tiny_stage "$work/data" 64 1
    cat <<YAML
  seed: $seed
  device: cpu
output:
  dir: $work/base
  save_final: false
YAML
  } > "$work/base.yaml"
  "$bin/easyctx_train" "$work/base.yaml" > "$work/base.log" 2>&1 || fail "the base model"
  [ -f "$work/base/final/config.json" ] || fail "no base/final/config.json"
}

# The command in array $1 with flag $2's value replaced by $3 (and so on for further pairs),
# into the array `changed`: the smallest change that makes a command CI-sized.
with_values() {
  local -n cmd=$1
  shift
  changed=("${cmd[@]}")
  while [ $# -ge 2 ]; do
    local i found=0
    for ((i = 0; i < ${#changed[@]} - 1; i++)); do
      if [ "${changed[$i]}" = "$1" ]; then changed[$((i + 1))]=$2; found=1; fi
    done
    [ $found = 1 ] || fail "with_values: $1 is not in the command"
    shift 2
  done
}

case $part in
train)
  base_model
  cd "$work" || fail "cd"
  # Stage 1 of train_scripts/EasyContext-1M-Llama-2-7B.sh, as written.
  stage1=(--batch-size 1 --gradient-accumulate-every 4
    --output-dir ./output/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5 --wandb EasyContext --max-train-steps 1000
    --learning-rate 2e-5 --dataset "$work/data" --model "$work/base/final" --seq-length 32768
    --rope-theta 1000000 --parallel_mode data_parallel)
  "$bin/easyctx_train" "${stage1[@]}" --print-config > s1.log 2>&1 || fail "stage 1 --print-config"
  for kv in "batch_size 1" "grad_accum 4" "dir ./output/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5" "steps 1000" \
            "lr 2e-05" "path $work/data" "init \"hf:$work/base/final\"" "seq_length 32768" "rope_theta 1000000.0" \
            "mode none" "size 1" "tensorboard true" "seed 42" "schedule constant" "warmup_steps 0" \
            "weight_decay 0.1" "beta2 0.95" "grad_clip 1.0" "stage 3"; do
    has_key s1.log ${kv% *} "${kv#* }"
  done
  grep -qx -- "--wandb EasyContext: logging.tensorboard is on; upload the run with: wandb sync --sync-tensorboard --project EasyContext ./output/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5/tensorboard" s1.log \
    || fail "no wandb sync line"
  # Stage 2 as written: --seed 2022 and --model naming stage 1's output folder.
  stage2=(--batch-size 1 --gradient-accumulate-every 2
    --output-dir ./output/7B_64K_bs_1M_rope_5M_step_1000_lr_2e-5 --seed 2022 --wandb EasyContext
    --max-train-steps 1000 --learning-rate 2e-5 --dataset "$work/data"
    --model output/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5 --seq-length 65536 --rope-theta 5000000
    --parallel_mode data_parallel)
  # Stage 3 as written (zigzag_ring_attn at 256000 tokens), here from the base model.
  stage3=(--batch-size 1 --gradient-accumulate-every 4
    --output-dir ./output/7B_0.256M_bs_1M_rope_10M_step_500_lr_2e-5 --seed 2023 --wandb EasyContext
    --max-train-steps 500 --learning-rate 2e-5 --dataset "$work/data" --model "$work/base/final"
    --seq-length 256000 --rope-theta 10000000 --parallel_mode zigzag_ring_attn)
  "${mpi[@]}" "$bin/easyctx_train" "${stage3[@]}" --print-config > s3.log 2>&1 || fail "stage 3 --print-config"
  for kv in "grad_accum 4" "seed 2023" "steps 500" "seq_length 256000" "rope_theta 10000000.0" \
            "mode zigzag_ring" "size 2"; do
    has_key s3.log ${kv% *} "${kv#* }"
  done
  # For real: stage 1 with --max-train-steps 2 --seq-length 64, then stage 2 the same way
  # (it reads stage 1's output folder: its final/ export).
  with_values stage1 --max-train-steps 2 --seq-length 64
  "$bin/easyctx_train" "${changed[@]}" > s1run.log 2>&1 || fail "stage 1, 2 steps"
  grep -q "step 2/2" s1run.log || fail "stage 1 did not reach step 2/2"
  [ -f output/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5/final/config.json ] || fail "stage 1 wrote no final/"
  grep -q '"rope_theta": 1e+06,' output/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5/final/config.json \
    || fail "stage 1's export does not carry --rope-theta 1000000"
  "$bin/easyctx_train" "${stage2[@]}" --print-config > s2.log 2>&1 || fail "stage 2 --print-config"
  has_key s2.log init '"hf:output/7B_32K_bs_1M_rope_1M_step_1000_lr_2e-5/final"'
  has_key s2.log seed 2022
  with_values stage2 --max-train-steps 2 --seq-length 64
  "$bin/easyctx_train" "${changed[@]}" > s2run.log 2>&1 || fail "stage 2, 2 steps"
  grep -q "step 2/2" s2run.log || fail "stage 2 did not reach step 2/2"
  grep -q '"rope_theta": 5e+06,' output/7B_64K_bs_1M_rope_5M_step_1000_lr_2e-5/final/config.json \
    || fail "stage 2's export does not carry --rope-theta 5000000"
  with_values stage3 --max-train-steps 1 --seq-length 64
  "${mpi[@]}" "$bin/easyctx_train" "${changed[@]}" > s3run.log 2>&1 \
    || fail "stage 3 under mpirun, 1 step"
  grep -q "step 1/1" s3run.log || fail "stage 3 did not reach step 1/1"
  # Without a YAML, the flags not given take train.py's defaults; older train.py's schedule flags.
  "$bin/easyctx_train" --output-dir o --model "$work/base/final" --dataset "$work/data" --parallel_mode data_parallel \
    --warmup-steps 5 --lr-schedule linear --print-config > defaults.log 2>&1 || fail "defaults: $(cat defaults.log)"
  for kv in "batch_size 1" "grad_accum 8" "seed 42" "steps 400" "lr 2e-05" "rope_theta 100000.0" \
            "seq_length 16384" "beta1 0.9" "eps 1e-08" "warmup_steps 5" "schedule linear" "tensorboard true"; do
    has_key defaults.log ${kv% *} "${kv#* }"
  done
  # With a YAML the flags override its keys, --set overrides the flags, the rest is the YAML's.
  printf 'data:\n  seq_length: 99\ntrain:\n  steps: 7\n  grad_accum: 3\n' > stage.yaml
  "$bin/easyctx_train" stage.yaml "${stage1[@]}" --set train.grad_accum=6 --print-config > yaml.log 2>&1 \
    || fail "YAML + flags: $(cat yaml.log)"
  for kv in "steps 1000" "seq_length 32768" "grad_accum 6"; do
    has_key yaml.log ${kv% *} "${kv#* }"
  done
  "$bin/easyctx_train" stage.yaml --model "$work/base/final" --print-config > yaml2.log 2>&1 || fail "YAML + --model"
  has_key yaml2.log seq_length 99
  has_key yaml2.log steps 7
  # What cannot be honoured: one line naming the flag, exit 2.
  for bad in "--lora" "--ring_attention" "--model $work/nothing"; do
    # shellcheck disable=SC2086
    "$bin/easyctx_train" "${stage1[@]}" $bad --print-config > bad.log 2>&1
    rc=$?
    flag=${bad%% *}
    [ $rc -eq 2 ] && [ "$(grep -c . bad.log)" -eq 1 ] && grep -q -- "$flag" bad.log \
      || fail "$bad: exit $rc, expected 2 and one line naming $flag: $(cat bad.log)"
  done
  # A bad value: one line naming the flag as typed.
  for fv in "--batch-size abc" "--parallel_mode zigzag" "--seq-length 1"; do
    # shellcheck disable=SC2086
    with_values stage1 $fv
    "$bin/easyctx_train" "${changed[@]}" --print-config > bad.log 2>&1
    rc=$?
    [ $rc -eq 2 ] && [ "$(grep -c . bad.log)" -eq 1 ] && grep -q -- "^error: $fv: " bad.log \
      || fail "$fv: exit $rc, expected 2 and one line naming it: $(cat bad.log)"
  done
  "$bin/easyctx_train" --batch-size 1 --output-dir x --model "$work/base/final" --dataset "$work/data" \
    > bad.log 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q -- "--parallel_mode: required" bad.log || fail "no --parallel_mode: exit $rc, $(cat bad.log)"
  ;;

ppl)
  base_model
  cd "$work" || fail "cd"
  # Two documents of more than 500,000 tokens (the whole KJV, twice over, each) for the README
  # command as written, with --print-sweep (500K-token forwards are beyond CI on a CPU).
  awk 'BEGIN { printf "{\"text\": \"" } { gsub(/["\\]/, ""); printf "%s ", $0 } END { print "\"}" }' \
    "$work/tok/kjv.txt" > one.jsonl
  cat one.jsonl one.jsonl > long.jsonl
  tiny_shard "$bin" "$tok" long.jsonl longdata || fail "h5tokenize long documents"
  readme=(--tokenized "$work/longdata" --dataset-min-tokens 500000 --samples 2 --output-file data/debug.csv
    --min-tokens 50000 --max-tokens 500000 --tokens-step 50000 --truncate --aggressive-memory
    -m "$work/base/final")
  "$bin/easyctx_eval_ppl" "${readme[@]}" --print-sweep > sweep.log 2>&1 || fail "README command --print-sweep"
  grep -qx "lengths: 50000 100000 150000 200000 250000 300000 350000 400000 450000 500000" sweep.log \
    || fail "lengths: $(cat sweep.log)"
  grep -qx "documents: 2 (EasyContext's: the first 2 of the 2 with >= 500000 tokens, of 2)" sweep.log \
    || fail "documents: $(cat sweep.log)"
  grep -qx "windows: one per document (--truncate)" sweep.log || fail "windows: $(cat sweep.log)"
  grep -qx "requests: 2" sweep.log || fail "requests: $(cat sweep.log)"
  grep -qx "tokens: 1000000" sweep.log || fail "tokens (2 windows of BOS + 499999): $(cat sweep.log)"
  grep -qx "csv-format: wide" sweep.log || fail "csv-format: $(cat sweep.log)"
  [ ! -e data/debug.csv ] || fail "--print-sweep wrote the CSV"
  # For real, every length divided by 1000 (the only change), on KJV chapters of which the
  # first ones are long enough: EasyContext's wide CSV.
  awk 'length($0) > 4000' "$work/chapters.jsonl" | head -n 6 > longch.jsonl
  tiny_shard "$bin" "$tok" longch.jsonl chdata || fail "h5tokenize chapters"
  mkdir -p data
  with_values readme --tokenized "$work/chdata" --dataset-min-tokens 500 --min-tokens 50 --max-tokens 500 \
    --tokens-step 50
  small=("${changed[@]}")
  "$bin/easyctx_eval_ppl" "${small[@]}" > small.log 2>&1 || fail "README command at 1/1000"
  grep -q "EasyContext's documents: 2 of the 6 with >= 500 tokens (of 6)" small.log \
    || fail "every chapter should have 500 tokens: $(grep documents small.log)"
  head -n 1 data/debug.csv | grep -qx ",50,100,150,200,250,300,350,400,450,500" || fail "wide header: $(head -n 1 data/debug.csv)"
  [ "$(wc -l < data/debug.csv)" -eq 2 ] || fail "one row per model: $(cat data/debug.csv)"
  tail -n 1 data/debug.csv | grep -q "^$work/base/final," || fail "the row is not named by -m as given"
  # The same perplexities as easyctx's own sweep of the same two documents (first L tokens,
  # BOS first) in the long CSV.
  "$bin/easyctx_eval_ppl" --tokenized "$work/chdata" --samples 2 --min-tokens 50 --max-tokens 500 \
    --tokens-step 50 --model "$work/base/final" --device cpu --output-file long.csv > long.log 2>&1 || fail "long form"
  head -n 1 long.csv | grep -qx "tokens,ppl,documents,nll" || fail "long header"
  tail -n 1 data/debug.csv | tr ',' '\n' | tail -n +2 > wide.txt
  tail -n +2 long.csv | cut -d, -f2 > long.txt
  [ "$(wc -l < wide.txt)" -eq 10 ] || fail "10 perplexities"
  paste wide.txt long.txt | awk '{ d = $1 - $2; if (d < 0) d = -d; if (!($1 > 1) || d > 1e-8 * $2) { print; bad = 1 } }
    END { exit bad }' || fail "wide and long perplexities differ"
  # Without --truncate: EasyContext's 256-token stride. The first chapter's n tokens after BOS
  # (from a --truncate sweep at a length beyond it: one window of BOS + n), then its windows at
  # L = 500: one starting every 256 tokens until one reaches the end, 1 + ceil((n - 499) / 256).
  "$bin/easyctx_eval_ppl" --tokenized "$work/chdata" --dataset-min-tokens 500 --samples 1 --min-tokens 100000 \
    --max-tokens 100000 --truncate -m "$work/base/final" --print-sweep > n.log 2>&1 || fail "truncate --print-sweep"
  n=$(( $(sed -n 's/^tokens: //p' n.log) - 1 ))
  [ "$n" -gt 499 ] || fail "the first chapter has $n tokens after BOS"
  for stride in 256 100; do
    sw=()
    [ $stride = 256 ] || sw=(--sliding-window $stride)
    "$bin/easyctx_eval_ppl" --tokenized "$work/chdata" --dataset-min-tokens 500 --samples 1 --min-tokens 500 \
      --max-tokens 500 "${sw[@]}" -m "$work/base/final" --print-sweep > slide.log 2>&1 || fail "sliding --print-sweep"
    grep -qx "windows: every $stride tokens (sliding window)" slide.log || fail "sliding: $(cat slide.log)"
    want=$(( 1 + (n - 499 + stride - 1) / stride ))
    grep -qx "requests: $want" slide.log || fail "stride $stride over $n tokens: $want windows expected: $(cat slide.log)"
  done
  "$bin/easyctx_eval_ppl" --tokenized "$work/chdata" --dataset-min-tokens 500 --samples 2 --min-tokens 250 \
    --max-tokens 500 -m "$work/base/final" --device cpu --output-file slide.csv > sliderun.log 2>&1 || fail "sliding run"
  head -n 1 slide.csv | grep -qx ",250,500" || fail "sliding: doubling lengths: $(head -n 1 slide.csv)"
  # Without --output-file nothing is written (as EasyContext); the results are logged.
  # --hide-progress drops the progress lines, and --sp-mode takes EasyContext's names.
  mkdir -p quiet && cd quiet || fail "cd quiet"
  for hide in "" --hide-progress; do
    # shellcheck disable=SC2086
    "$bin/easyctx_eval_ppl" --tokenized "$work/chdata" --dataset-min-tokens 500 --samples 1 --min-tokens 64 \
      --max-tokens 64 --truncate -m "$work/base/final" --progress-every 0 --sp-mode zigzag_ring_attn $hide \
      > "../quiet$hide.log" 2>&1 || fail "no --output-file $hide: $(cat "../quiet$hide.log")"
  done
  cd .. || fail "cd .."
  [ -z "$(ls quiet)" ] || fail "wrote $(ls quiet) without --output-file"
  grep -q "final: tokens 64: ppl " quiet.log || fail "no result line: $(cat quiet.log)"
  grep -q "eval ppl: items 1/1" quiet.log || fail "no progress line: $(cat quiet.log)"
  ! grep -q "eval ppl: items 1/1" quiet--hide-progress.log || fail "--hide-progress printed progress"
  # Hugging Face datasets are not read: one line naming the flag.
  for f in "-d emozilla/proofpile-test:--dataset" "-s default:--subset" "-f text:--feature" "--split test:--split" \
           "--save-tokenized x:--save-tokenized"; do
    # shellcheck disable=SC2086
    "$bin/easyctx_eval_ppl" ${f%:*} -m "$work/base/final" --tokenized "$work/chdata" > bad.log 2>&1
    rc=$?
    [ $rc -eq 2 ] && [ "$(grep -c . bad.log)" -eq 1 ] && grep -q -- "${f#*:}: Hugging Face datasets are not read here" bad.log \
      || fail "${f%:*}: exit $rc $(cat bad.log)"
  done
  ;;

needle)
  base_model
  cd "$work" || fail "cd"
  mkdir -p PaulGrahamEssays && cp "$work/tok/kjv.txt" PaulGrahamEssays/kjv.txt
  readme=(--model "$work/base/final" --max_context_length 1000000 --min_context_length 50000
    --context_interval 50000 --depth_interval 0.1 --num_samples 2 --rnd_number_digits 7
    --haystack_dir PaulGrahamEssays)
  "$bin/easyctx_eval_needle" "${readme[@]}" --print-sweep > sweep.log 2>&1 || fail "README command --print-sweep"
  for line in "tokenizer: $work/base/final/tokenizer.model" "output-dir: data/needle_final" \
              "haystack-dir: PaulGrahamEssays" "context lengths: 20 (50000 to 1000000 step 50000)" \
              "depths: 0 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 1" "samples: 2" "digits: 7" "distractors: 0" \
              "seed: 24242424"; do
    grep -qxF "$line" sweep.log || fail "expected '$line': $(cat sweep.log)"
  done
  "$bin/easyctx_eval_needle" "${readme[@]}" --num_distractor 3 --rope_theta 50000 --print-sweep > d.log 2>&1 \
    || fail "--num_distractor"
  grep -qx "distractors: 3" d.log && grep -qx "rope-theta: 50000" d.log || fail "--num_distractor / --rope_theta: $(cat d.log)"
  # For real with the lengths cut to 100..300 (the only change): 3 lengths x 11 depths.
  with_values readme --max_context_length 300 --min_context_length 100 --context_interval 100
  "$bin/easyctx_eval_needle" "${changed[@]}" > run.log 2>&1 || fail "README command at 100..300 tokens"
  [ "$(tail -n +2 data/needle_final/needle.csv | wc -l)" -eq 33 ] || fail "needle.csv: 3 x 11 cells"
  awk -F, 'NR > 1 && $4 != 2 { bad = 1 } END { exit bad }' data/needle_final/needle.csv || fail "2 samples a cell"
  grep -q '"digits": 7' data/needle_final/summary.json || fail "summary.json: digits 7: $(head -c 600 data/needle_final/summary.json)"
  # A training run's folder: the tokenizer of its final/ export.
  "$bin/easyctx_eval_needle" --model "$work/base" --print-sweep > runfolder.log 2>&1 || fail "run folder"
  grep -qxF "tokenizer: $work/base/final/tokenizer.model" runfolder.log || fail "run folder: $(cat runfolder.log)"
  grep -qxF "output-dir: data/needle_base" runfolder.log || fail "run folder: $(cat runfolder.log)"
  # A bad value in EasyContext's spelling: one line naming both spellings.
  with_values readme --rnd_number_digits 0
  "$bin/easyctx_eval_needle" "${changed[@]}" --print-sweep > bad.log 2>&1
  rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c . bad.log)" -eq 1 ] && grep -q -- "^error: --digits: .*(given as --rnd_number_digits)$" bad.log \
    || fail "--rnd_number_digits 0: exit $rc $(cat bad.log)"
  # Both spellings at once are refused.
  "$bin/easyctx_eval_needle" "${readme[@]}" --samples 3 --print-sweep > bad.log 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q -- "--samples" bad.log || fail "--num_samples with --samples: exit $rc $(cat bad.log)"
  ;;

modes)
  cd "$work" || fail "cd"
  sizes=(1 2 4 8)
  size=8
  ring=${sizes[$((RANDOM % 4))]}
  for m in "zigzag_ring_attn zigzag_ring" "ulysses_attn ulysses" "dist_flash_attn dist_flash" "usp_attn usp" \
           "data_parallel none"; do
    ec=${m% *}
    ours=${m#* }
    sz=$size
    [ "$ours" = none ] && sz=1
    for name in "$ec" "$ours"; do
      printf 'model:\n  config: tiny\nparallel:\n  sequence:\n    mode: %s\n    size: %s\n' "$name" "$sz" > "$name.yaml"
      "$bin/easyctx_train" "$name.yaml" --print-config 2>&1 | grep -v "^# resolved configuration" > "$name.log" \
        || fail "mode: $name"
    done
    has_key "$ec.log" mode "$ours"
    cmp -s "$ec.log" "$ours.log" || fail "mode: $ec and mode: $ours differ: $(diff "$ec.log" "$ours.log")"
    "$bin/easyctx_train" "$ours.yaml" --set "parallel.sequence.mode=$ec" --print-config > set.log 2>&1 \
      || fail "--set parallel.sequence.mode=$ec"
    has_key set.log mode "$ours"
  done
  # ring_degree (YAML) and --ring_degree: ulysses_size = size / ring_degree.
  printf 'model:\n  config: tiny\nparallel:\n  sequence:\n    mode: usp_attn\n    size: %s\n    ring_degree: %s\n' \
    "$size" "$ring" > usp.yaml
  "$bin/easyctx_train" usp.yaml --print-config > usp.log 2>&1 || fail "ring_degree $ring"
  has_key usp.log ulysses_size $((size / ring))
  has_key usp.log ring_degree "$ring"
  grep -q "ring groups ($((size / ring)) x $ring)" usp.log || fail "layout: $(grep groups usp.log)"
  "$bin/easyctx_train" usp.yaml --set parallel.sequence.ring_degree=3 --print-config > bad.log 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "ring_degree = 3 must divide parallel.sequence.size = $size" bad.log \
    || fail "ring_degree 3: exit $rc $(cat bad.log)"
  "$bin/easyctx_train" usp.yaml --set parallel.sequence.ulysses_size=$((size / ring == 1 ? 2 : 1)) --print-config \
    > bad.log 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "ring_degree = $ring means ulysses_size = size / ring_degree = $((size / ring))" bad.log \
    || fail "ring_degree and a different ulysses_size: exit $rc $(cat bad.log)"
  printf 'model:\n  config: tiny\nparallel:\n  sequence:\n    mode: zigzag_ring_attn\n    ring_degree: 2\n' > zz.yaml
  "$bin/easyctx_train" zz.yaml --print-config > bad.log 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "ring_degree = 2 is only used with mode usp" bad.log || fail "ring_degree with zigzag: $(cat bad.log)"
  mkdir -p d && touch d/x.h5
  "$bin/easyctx_train" --output-dir o --model hf:/nonexistent --dataset d --parallel_mode usp_attn \
    --ring_degree "$ring" --set parallel.sequence.size=$size --print-config > cli.log 2>&1 || fail "--ring_degree $ring: $(cat cli.log)"
  has_key cli.log ulysses_size $((size / ring))
  has_key cli.log mode usp
  # Evaluations take EasyContext's names for --sp-mode too.
  "$bin/easyctx_eval_needle" --model random:demo --tokenizer x.model --sp-mode ulysses_attn --print-sweep > e.log 2>&1 \
    || fail "--sp-mode ulysses_attn: $(cat e.log)"
  grep -qx "sp-mode: ulysses" e.log || fail "sp-mode: $(cat e.log)"
  ;;
*)
  echo "usage: $0 SRC BIN train|ppl|needle|modes"; exit 2 ;;
esac
echo "ok"
