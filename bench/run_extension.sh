#!/usr/bin/env bash
# The context-extension proof (docs/results.md), with easyctx's own programs only: a base model
# trained from random init at a short length to retrieve, extended in stages (stage YAMLs,
# model.init: ckpt:, rising model.rope_theta) to a long one, and evaluated on a retrieval
# format that no training window ever holds: EasyContext's needle ("The special magic
# Singapore number is: N") in held-out text. One seed per run; bench/extension_seeds.sh
# collects several.
#
#   bash bench/run_extension.sh [cpu|gpu] [OUT_DIR]
#
#   gpu  configs/recipes/extension-gpu/: a 29M-parameter model (configs/models/ext-gpu.yaml),
#        2K (theta 1e4) -> 8K (1e5) -> 32K (1e6) -> 64K (5e6); one seed is one device call of
#        one H100 or H200 (bench/run_extension_device.sh)
#   cpu  configs/recipes/extension-cpu/: a 0.4M-parameter model, 256 -> 512 -> 1K on a small
#        corpus, a few minutes on 2 CPU cores (the e2e test test_extension_cpu)
#
# Phases, each timed (timing.txt):
#   corpus     CORPUS (scripts/make_text_corpus.py's folder: train/, heldout/, haystack.txt),
#              made here when not given (with CORPUS_FLAGS; cpu: the first 300 KB of each
#              source in blocks of 64 KB)
#   tokenizer  TOKENIZER, else scripts/make_text_tokenizer.sh on CORPUS's training blocks
#   shards     h5tokenize: CORPUS/train -> shards/train (the training text), CORPUS/heldout ->
#              shards/heldout (the perplexity documents, never trained on)
#   data       h5recall per stage (data/<stage>): windows of the training text with episodes of
#              the retrieval grammar at every distance up to the window (log-uniform in the
#              base, uniform in the stages), loss on the answers (and on the text of LM_SHARE of
#              the windows); steps x batch + 1 windows per stage (the loader's sample j is
#              tokens [j L, j L + L] of the stream: n windows make n - 1 samples)
#   isolation  h5inspect --forbid over every training shard, decoded from its token ids: the
#              needle's wording, its city and book framing (eval::forbidden_phrases) and lines
#              of the held-out haystack must not occur (isolation.txt); a find ends the run
#   base       stage 0 from random init; then its evaluation and the control's (the base with
#              the last stage's RoPE theta, no training: --rope-theta)
#   stages     every later stage from the previous one's last checkpoint; the last one
#              evaluated at once, the others after it
#   ablation   (ABLATION=1) the same stages with the base's RoPE theta; its last evaluated
#   tables     bench/extension_seeds.sh tables: accuracy.csv/.md, ppl.csv, targets.txt
# Evaluation of a model: easyctx_eval_needle --task needle (EasyContext's needle, --digits
# DIGITS) over CORPUS/haystack.txt (held-out text) at prompt lengths S0, 2 S0, 4 S0, ... up to
# the last stage's length (a prompt of length S fits one S-token window), depths 0..1 every
# DEPTH, SAMPLES per cell, one seed for every model; easyctx_eval_ppl over PPL_DOCS held-out
# documents at the same lengths.
#
# MODE=pilot (gpu): the base and the first stage in full, the later stages only PILOT_STEPS
# steps each (their tokens/s, no evaluation), the evaluation up to the first stage's length, no
# ablation; timing.txt then projects a full seed's minutes. DEADLINE_S (seconds from the
# start): the optional phases (the middle stages' evaluations, the ablation) are skipped when
# they would end after it (the device script sets it below its time limit).
#
# Environment: B (programs, default build/bin), SEED (default 1: every data, training and eval
# seed derives from it), MODE, ABLATION (default 0), DEADLINE_S, CORPUS, TOKENIZER, VOCAB,
# STAGE_STEPS ("N0 N1 ..." overriding the stage files' train.steps), EPISODES ("E0 E1 ...": per
# window, per stage), DISTANCES ("log uniform ...": h5recall's distance law per stage; default
# log-uniform in the base, where the copy must first be found at short range, uniform in the
# stages), LM_SHARE ("F0 F1 ...": the share of language-model windows per stage, the last
# repeated; default 0.1 in the base, 0.25 in the stages), MIX, CORPUS_FLAGS, SAMPLES, DEPTH, DIGITS, PPL_DOCS, DEVICE (the
# evaluations'), TRAIN_SET (more --set flags for every easyctx_train call), THREADS (h5recall's,
# h5tokenize's).
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${1:-gpu}
out=${2:-out/extension-$scale}
B=${B:-build/bin}
SEED=${SEED:-1}
MODE=${MODE:-full}
ABLATION=${ABLATION:-0}
DEADLINE_S=${DEADLINE_S:-0}
case "$scale" in
  cpu)
    recipe=configs/recipes/extension-cpu
    stages=(s0-base-256 s1-512 s2-1k)
    device=${DEVICE:-cpu}
    : "${VOCAB:=2048}" "${EPISODES:=3 5 8}" "${SAMPLES:=4}" "${DEPTH:=0.5}" "${PPL_DOCS:=4}"
    : "${CORPUS_FLAGS:=--max-bytes 300000 --block-bytes 65536}"
    ;;
  gpu)
    recipe=configs/recipes/extension-gpu
    stages=(s0-base-2k s1-8k s2-32k s3-64k)
    device=${DEVICE:-cuda}
    : "${VOCAB:=4096}" "${EPISODES:=12 48 128 192}" "${SAMPLES:=8}" "${DEPTH:=0.25}" "${PPL_DOCS:=8}"
    : "${CORPUS_FLAGS:=}"
    ;;
  *) echo "run_extension.sh: unknown scale '$scale' (cpu or gpu)" >&2; exit 2 ;;
esac
: "${LM_SHARE:=0.1 0.25}" "${DISTANCES:=log uniform uniform uniform}" "${MIX:=fact=4,passkey=1,list=1,chain=1}" "${DIGITS:=7}" "${PILOT_STEPS:=4}"
case "$MODE" in full | pilot) ;; *) echo "run_extension.sh: MODE '$MODE' (full or pilot)" >&2; exit 2 ;; esac
for p in easyctx_train easyctx_eval_needle easyctx_eval_ppl h5tokenize h5recall h5inspect; do
  [ -x "$B/$p" ] || { echo "run_extension.sh: $B/$p not found (build it: bash scripts/build.sh; or set B)" >&2; exit 2; }
done
read -r -a episodes <<< "$EPISODES"
read -r -a laws <<< "$DISTANCES"
read -r -a lm_shares <<< "$LM_SHARE"
for i in "${!stages[@]}"; do lm_shares[$i]=${lm_shares[$i]:-${lm_shares[${#lm_shares[@]} - 1]}}; done
read -r -a stage_steps <<< "${STAGE_STEPS:-}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.txt
: > "$summary"
: > "$out/timing.txt"
say() { echo "$*" | tee -a "$summary"; }
say "run_extension.sh $scale: seed $SEED, mode $MODE, ablation $ABLATION, $(date -u +%Y-%m-%dT%H:%MZ)"
# phase NAME COMMAND...: runs it, records its wall time.
phase() {
  local name=$1 t0=$SECONDS
  shift
  echo "== $name ($SECONDS s)"
  "$@"
  echo "$name $((SECONDS - t0))" >> "$out/timing.txt"
  say "phase $name: $((SECONDS - t0)) s"
}
# room SECONDS: true when an optional phase of about that long ends before DEADLINE_S.
room() { [ "$DEADLINE_S" -le 0 ] || [ $((SECONDS + $1)) -le "$DEADLINE_S" ]; }
# A stage file's value of a top-level section's key (model.rope_theta -> the number).
yaml_value() {
  awk -v sec="${2%%.*}" -v key="${2#*.}" '
    /^[a-z]/ { in_sec = ($1 == sec ":") }
    in_sec && $1 == key ":" { print $2; exit }' "$1"
}
index_of() { local i; for i in "${!stages[@]}"; do [ "${stages[$i]}" = "$1" ] && echo "$i"; done; }
seq_of() { yaml_value "$recipe/$1.yaml" data.seq_length; }
theta_of() { yaml_value "$recipe/$1.yaml" model.rope_theta; }
batch_of() { yaml_value "$recipe/$1.yaml" train.batch_size; }
steps_of() {
  local i
  i=$(index_of "$1")
  if [ "$MODE" = pilot ] && [ "$i" -ge 2 ]; then echo "$PILOT_STEPS"
  elif [ -n "${stage_steps[$i]:-}" ]; then echo "${stage_steps[$i]}"
  else yaml_value "$recipe/$1.yaml" train.steps; fi
}
S0=$(seq_of "${stages[0]}")
theta0=$(theta_of "${stages[0]}")
last=${stages[${#stages[@]} - 1]}
theta_last=$(theta_of "$last")
# The stages evaluated, and the longest length evaluated (pilot: the first stage's).
if [ "$MODE" = pilot ]; then evaluated=("${stages[1]}"); else evaluated=("${stages[@]:1}"); fi
S_eval=$(seq_of "${evaluated[${#evaluated[@]} - 1]}")
lengths=()
for ((L = S0; L <= S_eval; L *= 2)); do lengths+=("$L"); done

# 1. The corpus, the tokenizer, the shards.
corpus() {
  if [ -z "${CORPUS:-}" ]; then
    CORPUS=$out/corpus
    # shellcheck disable=SC2086  # CORPUS_FLAGS: word-split
    python3 scripts/make_text_corpus.py "$CORPUS" $CORPUS_FLAGS > /dev/null
  fi
  CORPUS=$(cd "$CORPUS" && pwd)
  [ -d "$CORPUS/train" ] && [ -d "$CORPUS/heldout" ] && [ -s "$CORPUS/haystack.txt" ] ||
    { echo "run_extension.sh: $CORPUS is not a scripts/make_text_corpus.py folder" >&2; return 1; }
  say "corpus $CORPUS: $(ls "$CORPUS/train" | wc -l) training blocks ($(cat "$CORPUS"/train/*.txt | wc -c) bytes)," \
    "$(ls "$CORPUS/heldout" | wc -l) held out ($(cat "$CORPUS"/heldout/*.txt | wc -c) bytes)"
}
phase corpus corpus
tokenizer() {
  tok=${TOKENIZER:-$(bash scripts/make_text_tokenizer.sh "$CORPUS" "$out/tok" "$VOCAB" | tail -1)}
  say "tokenizer $tok"
}
phase tokenizer tokenizer
shards() {
  local d
  mkdir -p "$out/shards" "$out/data"
  for d in train heldout; do
    rm -rf "$out/shards/$d"
    "$B/h5tokenize" -t "$tok" -o "$out/shards/$d" --progress 0 ${THREADS:+--threads "$THREADS"} "$CORPUS/$d" > "$out/shards/$d.log" 2>&1 ||
      { tail -5 "$out/shards/$d.log"; return 1; }
  done
  # h5recall reads the shards alone (the folder's summary .json is no text).
  rm -rf "$out/shards/train-text" && mkdir -p "$out/shards/train-text"
  ln -s "$out"/shards/train/*.h5 "$out/shards/train-text/"
  say "shards: training text $(sed -nE 's/.*"tokens": *([0-9]+)[,}].*"seconds".*/\1/p' "$out/shards/train/h5tokenize_summary.json") tokens," \
    "held out $(sed -nE 's/.*"tokens": *([0-9]+)[,}].*"seconds".*/\1/p' "$out/shards/heldout/h5tokenize_summary.json")"
}
phase shards shards

# 2. Every stage's windows (the pilot's short stages get their few steps' worth). One more than
# steps x batch: the loader's sample j is stream tokens [j L, j L + L] (L + 1 of them), so n
# windows of L tokens make n - 1 samples.
data() {
  local i s n law
  for i in "${!stages[@]}"; do
    s=${stages[$i]}
    n=$(($(steps_of "$s") * $(batch_of "$s") + 1))
    law=()
    [ "${laws[$i]:-uniform}" = log ] && law=(--log-distance)
    "$B/h5recall" -t "$tok" -o "$out/data/$s" --text-dir "$out/shards/train-text" --length "$(seq_of "$s")" --windows "$n" \
      --episodes "${episodes[$i]}" --lm-share "${lm_shares[$i]}" --mix "$MIX" --eval-digits "$DIGITS" "${law[@]}" \
      --seed $((SEED * 100 + i)) ${THREADS:+--threads "$THREADS"} 2> "$out/data/$s.log" | sed "s/^h5recall: /$s: /" | tee -a "$summary"
  done
}
phase data data
overhead=$(sed -nE 's/.*"needle": ([0-9]+).*/\1/p' "$out/data/${stages[0]}/h5recall.json" | head -1)
[ -n "$overhead" ] || { echo "run_extension.sh: no eval_overhead in h5recall.json" >&2; exit 1; }

# 3. No training window holds the evaluation's wording, its city, or held-out text.
isolation() {
  local forbid=() p line
  # eval::forbidden_phrases, as h5recall.json lists them.
  while IFS= read -r p; do forbid+=("--forbid=$p"); done < <(tr -d '\n' < "$out/data/${stages[0]}/h5recall.json" |
    sed -nE 's/.*"forbidden_phrases": \[([^]]*)\].*/\1/p' | tr ',' '\n' | sed -E 's/^ *"//; s/" *$//')
  # Sixteen lines of the held-out haystack that the training text does not hold.
  while IFS= read -r line; do
    grep -rqF -- "$line" "$CORPUS/train" || forbid+=("--forbid=$line")
  done < <(awk 'length($0) >= 60 && length($0) <= 120 && !/["\\]/ { if (++n % 97 == 0) print }' "$CORPUS/haystack.txt" | head -16)
  "$B/h5inspect" "$out"/data/*/recall.h5 "$out/shards/train" -t "$tok" "${forbid[@]}" > "$out/isolation.txt" 2>&1 ||
    { tail -3 "$out/isolation.txt"; say "isolation: FAILED"; return 1; }
  say "isolation: $(grep '^forbidden phrases' "$out/isolation.txt")"
}
phase isolation isolation

train() {  # train NAME STAGE INIT [--set ...]: the stage file with this run's folders
  local name=$1 s=$2 init=$3
  shift 3
  mkdir -p "$out/runs"
  rm -rf "$out/runs/$name"
  local steps warm=()
  steps=$(steps_of "$s")
  [ "$steps" -gt "$(yaml_value "$recipe/$s.yaml" train.warmup_steps)" ] || warm=(--set train.warmup_steps=1)
  # shellcheck disable=SC2086  # TRAIN_SET: more --set flags, word-split
  "$B/easyctx_train" "$recipe/$s.yaml" --set data.path="$out/data/$s" --set output.dir="$out/runs/$name" \
    --set train.seed="$SEED" --set train.steps="$steps" --set model.init="$init" "${warm[@]}" ${TRAIN_SET:-} "$@" \
    --resume none > "$out/runs/$name.log" 2>&1 || { tail -5 "$out/runs/$name.log"; return 1; }
  # One line: steps, tokens per step, the last loss, the median step's tokens/s.
  awk -v n="$name" -v L="$(seq_of "$s")" -v b="$(batch_of "$s")" '
    { if (match($0, /"loss":[0-9.e+-]+/)) loss = substr($0, RSTART + 7, RLENGTH - 7)
      if (match($0, /"tokens_per_s":[0-9.e+-]+/)) { t[++k] = substr($0, RSTART + 15, RLENGTH - 15) + 0 } }
    END { for (i = 2; i <= k; i++) for (j = i; j > 1 && t[j - 1] > t[j]; j--) { x = t[j]; t[j] = t[j - 1]; t[j - 1] = x }
          printf "%s: %d steps of %d x %d tokens, last loss %s, median %.0f tokens/s\n", n, k, b, L, loss, k ? t[int((k + 1) / 2)] : 0 }' \
    "$out/runs/$name/metrics.jsonl" | tee -a "$summary" | sed 's/^/  /' >> "$out/timing.txt"
}
# evaluate NAME MODEL [--rope-theta T]: the needle grid and held-out perplexity into eval/NAME.
evaluate() {
  local name=$1 model=$2 ctx=() L
  shift 2
  for L in "${lengths[@]}"; do ctx+=($((L - overhead))); done
  mkdir -p "$out/eval/$name"
  "$B/easyctx_eval_needle" --model "$model" --tokenizer "$tok" --output-dir "$out/eval/$name" --task needle \
    --haystack-dir "$CORPUS/haystack.txt" --device "$device" --digits "$DIGITS" --seed $((SEED * 100 + 55)) \
    --context-lengths "$(IFS=,; echo "${ctx[*]}")" --depth-interval "$DEPTH" --samples "$SAMPLES" \
    --progress-every 600 --tensorboard none "$@" > "$out/eval/$name/needle.log" 2>&1 ||
    { tail -5 "$out/eval/$name/needle.log"; return 1; }
  "$B/easyctx_eval_ppl" --model "$model" --tokenized "$out/shards/heldout" --min-tokens "$S0" --max-tokens "$S_eval" \
    --samples "$PPL_DOCS" --device "$device" --output-file "$out/eval/$name/ppl.csv" --plot none --tensorboard none \
    "$@" > "$out/eval/$name/ppl.log" 2>&1 || { tail -5 "$out/eval/$name/ppl.log"; return 1; }
  say "eval $name: needle $(awk -F, -v ov="$overhead" 'NR > 1 { s[$1 + ov] += $3; n[$1 + ov]++ } END { for (L in s) printf "%d:%.2f ", L, s[L] / n[L] }' \
    "$out/eval/$name/needle.csv" | tr ' ' '\n' | sort -n | tr '\n' ' ')| ppl $(awk -F, 'NR > 1 { printf "%d:%.1f ", $1, $2 }' "$out/eval/$name/ppl.csv")"
}
model_of() { echo "$out/runs/$1"; }  # a run's folder: its final/ export

# 4. The base, its evaluation and the control's.
base() {
  train "${stages[0]}" "${stages[0]}" random
  evaluate "${stages[0]}" "$(model_of "${stages[0]}")"
  evaluate control "$(model_of "${stages[0]}")" --rope-theta "$theta_last"
}
phase base base

# 5. The stages, each from the previous one's last checkpoint; the last evaluated first.
stages_run() {
  local prev=${stages[0]} s
  for s in "${stages[@]:1}"; do
    train "$s" "$s" "ckpt:$out/runs/$prev/checkpoints"
    prev=$s
  done
}
phase stages stages_run
phase "eval ${evaluated[${#evaluated[@]} - 1]}" evaluate "${evaluated[${#evaluated[@]} - 1]}" \
  "$(model_of "${evaluated[${#evaluated[@]} - 1]}")"
for s in "${evaluated[@]:0:${#evaluated[@]}-1}"; do
  if room 60; then phase "eval $s" evaluate "$s" "$(model_of "$s")"; else say "eval $s: skipped (deadline)"; fi
done

# 6. The ablation: the same stages at the base's RoPE theta.
ablation() {
  local prev=${stages[0]} s
  for s in "${stages[@]:1}"; do
    train "abl-$s" "$s" "ckpt:$out/runs/$prev/checkpoints" --set model.rope_theta="$theta0"
    prev=abl-$s
  done
  evaluate "abl-$last" "$(model_of "abl-$last")"
}
if [ "$ABLATION" = 1 ] && [ "$MODE" = full ]; then
  need=$(awk '/^stages / { s = $2 } END { print s + 90 }' "$out/timing.txt")
  if room "$need"; then phase ablation ablation; else say "ablation: skipped (deadline: about $need s needed)"; fi
fi

# 7. Tables and targets (bench/extension_seeds.sh), and in pilot mode the projected full seed.
bash bench/extension_seeds.sh tables "$out" "$scale" | tee -a "$summary"
if [ "$MODE" = pilot ]; then
  # Each stage's full steps x tokens per step at the measured tokens/s.
  awk -v steps="$(for s in "${stages[@]}"; do printf '%s:%s ' "$s" "$(yaml_value "$recipe/$s.yaml" train.steps)"; done)" '
    BEGIN { n = split(steps, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, ":"); full[kv[1]] = kv[2] } }
    /^  [^ ]+: [0-9]+ steps of/ { name = $1; sub(/:$/, "", name); tps = $(NF - 1); per = $5 * $7
      if ((name in full) && tps > 0) { t = full[name] * per / tps; total += t
        printf "projected %s: %d steps, %.0f s at %.0f tokens/s\n", name, full[name], t, tps } }
    END { printf "projected training of a full seed: %.0f s (plus data, evaluation and start-up)\n", total }' \
    "$out/timing.txt" | tee -a "$summary"
fi
say "outputs in $out (summary.txt, timing.txt, isolation.txt, accuracy.md, ppl.csv, targets.txt, eval/*/needle.png)"
