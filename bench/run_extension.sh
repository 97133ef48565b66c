#!/usr/bin/env bash
# Context extension end to end, with easyctx's own programs only (docs/results.md): a
# short-context base model trained by easyctx to retrieve, extended in stages on long natural
# text with the recipe machinery (stage YAMLs, model.init: ckpt:, rising model.rope_theta), and
# evaluated before and after. One seed per run; bench/extension_seeds.sh collects several.
#
#   bash bench/run_extension.sh [cpu|h200] [OUT_DIR]
#
#   cpu   configs/recipes/extension-cpu/: a 0.15M-parameter model, 128 -> 512 tokens, a few
#         minutes on 2 CPU cores (what the e2e test test_extension_cpu runs, two seeds)
#   h200  configs/recipes/extension-h200/: a 66M-parameter model, 2K -> 8K -> 32K, one device
#         call of one H200 per seed (docs/results.md)
#
# Every training run is deterministic (train.deterministic: true in the stage files): a rerun of
# a seed gives the same models and the same numbers.
#
# Phases (each prints its wall time):
#   tokenizer  scripts/make_demo_tokenizer.sh (2000-piece BPE on the KJV) unless TOKENIZER; the
#              KJV split into training verses and the last HELDOUT_VERSES, the held-out text of
#              the perplexity eval (never trained on); the stages' natural text: the training
#              verses plus TEXT_DIR's .txt files (default: scripts/make_text_corpus.sh: the
#              Jargon File and fortune-mod's cookies, from Debian packages)
#   data       h5synth documents. Base rungs: one whole retrieval prompt per window (needle in
#              KJV text, pass key). Extension stages: packed windows (h5synth --prompt-max):
#              a run of the natural text across the whole window with whole retrieval prompts
#              of at most PROMPT_MAX tokens (default: the base length) put in at random
#              points, STAGE_MIX giving the token shares; so every needle distance beyond the
#              base length is one the model never trained on. What each stage saw (tokens and
#              prompts by kind, prompt lengths) goes into summary.txt and data/<stage>/h5synth.json.
#   base       BASE_RUNGS, a length curriculum "LENGTH:BATCH:MIX[:LR] ..." (each rung from the
#              previous rung's checkpoint, fresh Adam), each trained in chunks of BASE_CHUNK steps
#              (easyctx_train resumes its run with a larger train.steps) until a held-out probe
#              (easyctx_eval_needle at the rung's length; fresh prompts at every probe: its own
#              seed plus the step) reaches PROBE_TARGET PROBE_TIMES times in a row, at most
#              BASE_MAX_STEPS steps per rung; the last rung is the base stage at its length
#   extension  each later stage from the previous one's last checkpoint, its own length and
#              RoPE theta (STEPS overrides every stage's train.steps)
#   evaluation the base, the control (the base with the last stage's RoPE theta, no training:
#              --rope-theta) and every stage on one grid: the TASKS of easyctx_eval_needle
#              (needle: EasyContext's, KJV haystack, depths every DEPTH; pass key) at prompt
#              lengths S0, S0 + GRID_STEP, ... up to the last stage's length, SAMPLES prompts per
#              cell; perplexity of PPL_DOCS held-out documents by easyctx_eval_ppl every
#              EVAL_STEP tokens
#   tables     accuracy tables, the targets of docs/results.md checked (targets.txt), and
#              easyctx_report's page
#
# Outputs in OUT_DIR (default out/extension-<scale>):
#   accuracy.csv   model,task,length,context,score,samples   (length: prompt tokens, the
#                  window it fits; context: the haystack's tokens; needle: mean over depths)
#   accuracy.md    the same as markdown tables, model x length, per task and all together
#   targets.txt    one line per target: PASS/FAIL, the measured value, the threshold
#   ppl.csv, ppl.png   perplexity by context length, every model (model column first)
#   runs/<stage>/  the training runs; runs/<stage>/eval/ holds its needle.csv, synthetic.csv
#                  (heatmap PNGs beside them) and ppl.csv, the base's also the control's
#   report.html    easyctx_report of the stages (loss, throughput, plans, heatmaps, curves)
#   summary.txt    the phase times, what each stage saw, the headline numbers
#
# Environment: B (programs, default build/bin; on the GPU host .deps/gpubin), SEED (default 1:
# every data, training, probe and eval seed derives from it), TOKENIZER (an existing
# kjv_bpe2000.model: skips spm_train), KJV (the KJV's verses, one per line, "Ge1:1 " prefixes
# allowed; default .deps/haystack/kjv.txt when present, else `bible` through
# make_demo_tokenizer.sh), TEXT_DIR, BASE_RUNGS, BASE_CHUNK, BASE_MAX_STEPS, PROBE_TARGET,
# PROBE_TIMES, PROBE_SAMPLES, STEPS, STAGE_MIX, PROMPT_MAX, STAGE_PROMPT_MIN, SAMPLES, DEPTH,
# GRID_STEP, EVAL_STEP, DEVICE (the evaluations'), TRAIN_SET (more --set flags for every
# easyctx_train call), TASKS, PPL_MIX, PPL_DOCS, DIGITS, HELDOUT_VERSES (defaults per scale
# below).
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${1:-h200}
out=${2:-out/extension-$scale}
B=${B:-build/bin}
SEED=${SEED:-1}
case "$scale" in
  cpu)
    recipe=configs/recipes/extension-cpu
    stages=(s0-base-128 s1-512)
    device=${DEVICE:-cpu}
    # The base: pass keys only, each prompt one whole window (what the tiny model learns
    # reliably at 128 tokens; needles and other mixes were not reliable: docs/results.md). The
    # stage: natural text with pass-key prompts of at most 128 tokens packed in.
    : "${BASE_RUNGS=}" "${BASE_CHUNK:=200}" "${BASE_MAX_STEPS:=2000}" "${PROBE_TARGET:=0.95}" "${SAMPLES:=40}"
    : "${DEPTH:=0.25}" "${EVAL_STEP:=64}" "${PPL_DOCS:=8}" "${PROBE_SAMPLES:=40}" "${TASKS:=passkey}"
    : "${MIX:=passkey=1}" "${PROMPT_MIN:=1}" "${STAGE_MIX:=text=1,passkey=1}" "${STAGE_PROMPT_MIN:=0.5}"
    : "${PPL_MIX:=text=1}" "${PROBE_TIMES:=2}"
    ;;
  h200)
    recipe=configs/recipes/extension-h200
    stages=(s0-base-2k s1-8k s2-32k)
    device=${DEVICE:-cuda}
    # The base: a curriculum of whole-window prompts, pass keys at 128 then needles and pass
    # keys up to 2K, at half the first rung's learning rate from 256 on (docs/results.md). The
    # stages: the natural text with needle and pass-key prompts of at most 2K packed in, half
    # the tokens.
    : "${BASE_RUNGS=128:256:passkey=1:1e-3 256:128:needle=2,passkey=1:5e-4 512:64:needle=2,passkey=1:5e-4 1024:32:needle=2,passkey=1:5e-4 2048:16:needle=2,passkey=1:5e-4}"
    : "${BASE_CHUNK:=150}" "${BASE_MAX_STEPS:=900}" "${PROBE_TARGET:=0.9}" "${SAMPLES:=4}" "${DEPTH:=0.25}"
    : "${EVAL_STEP:=2048}" "${PPL_DOCS:=4}" "${PROBE_SAMPLES:=8}" "${TASKS:=needle,passkey}"
    : "${MIX:=needle=2,passkey=1}" "${PROMPT_MIN:=1}" "${STAGE_MIX:=text=2,needle=1,passkey=1}"
    : "${STAGE_PROMPT_MIN:=0.125}" "${PPL_MIX:=text=1}" "${PROBE_TIMES:=2}"
    ;;
  *) echo "run_extension.sh: unknown scale '$scale' (cpu or h200)" >&2; exit 2 ;;
esac
: "${DIGITS:=4}" "${HELDOUT_VERSES:=3000}"
for p in easyctx_train easyctx_eval_needle easyctx_eval_ppl easyctx_report h5synth; do
  [ -x "$B/$p" ] || { echo "run_extension.sh: $B/$p not found (build it: bash scripts/build.sh; or set B)" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
say "run_extension.sh $scale: seed $SEED, $(date -u +%Y-%m-%dT%H:%MZ)"
# phase NAME COMMAND...: runs it, prints its wall time.
phase() {
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  say "phase $name: $((SECONDS - t0)) s"
}
# A stage file's value of a top-level section's key (model.rope_theta -> the number).
yaml_value() {
  awk -v sec="${2%%.*}" -v key="${2#*.}" '
    /^[a-z]/ { in_sec = ($1 == sec ":") }
    in_sec && $1 == key ":" { print $2; exit }' "$1"
}
seq_of() { yaml_value "$recipe/$1.yaml" data.seq_length; }
theta_of() { yaml_value "$recipe/$1.yaml" model.rope_theta; }
steps_of() { yaml_value "$recipe/$1.yaml" train.steps; }
batch_of() { yaml_value "$recipe/$1.yaml" train.batch_size; }
train() {  # train STAGE [--set ...]: the stage file with this experiment's folders
  # shellcheck disable=SC2086  # TRAIN_SET: more --set flags for every stage, word-split
  "$B/easyctx_train" "$recipe/$1.yaml" --set data.path="$out/data/$1" --set output.dir="$out/runs/$1" \
    --set train.seed="$SEED" ${TRAIN_SET:-} "${@:2}"
}
S0=$(seq_of "${stages[0]}")
last=${stages[${#stages[@]} - 1]}
S_last=$(seq_of "$last")
theta_last=$(theta_of "$last")

# 1. Tokenizer and text.
text() {
  mkdir -p "$out/tok"
  local kjv=${KJV:-}
  [ -z "$kjv" ] && [ -f .deps/haystack/kjv.txt ] && kjv=.deps/haystack/kjv.txt
  if [ -n "$kjv" ] && [ ! -s "$out/tok/kjv.txt" ]; then
    sed -E 's/^[^ ]+[0-9]+:[0-9]+ //' "$kjv" > "$out/tok/kjv.txt"
  fi
  if [ -n "${TOKENIZER:-}" ]; then
    tok=$TOKENIZER
    [ -s "$out/tok/kjv.txt" ] || bible -f gen1:1-rev22:21 | sed -nE 's/^[^ ]+[0-9]+:[0-9]+ //p' > "$out/tok/kjv.txt"
  else
    tok=$(bash scripts/make_demo_tokenizer.sh "$out/tok" | tail -1)
  fi
  # Training text: every verse but the last HELDOUT_VERSES; those are the perplexity text.
  head -n "-$HELDOUT_VERSES" "$out/tok/kjv.txt" > "$out/tok/train.txt"
  tail -n "$HELDOUT_VERSES" "$out/tok/kjv.txt" > "$out/tok/heldout.txt"
  # The stages' natural text: the training verses and TEXT_DIR's files (never the held-out verses).
  local extra=${TEXT_DIR:-}
  [ -n "$extra" ] || extra=$(bash scripts/make_text_corpus.sh "$out/tok/corpus")
  ls "$extra"/*.txt > /dev/null 2>&1 || { echo "run_extension.sh: no .txt files in TEXT_DIR $extra" >&2; return 1; }
  rm -rf "$out/tok/text"
  mkdir -p "$out/tok/text"
  cp "$out/tok/train.txt" "$out/tok/text/kjv-train.txt"
  cp "$extra"/*.txt "$out/tok/text/"
  echo "tokenizer $tok; $(wc -l < "$out/tok/train.txt") training verses, $HELDOUT_VERSES held out;" \
    "stage text: $(cd "$out/tok/text" && for f in *.txt; do printf '%s %s bytes, ' "$f" "$(wc -c < "$f")"; done)"
}
phase tokenizer text
hay=$out/tok/train.txt

# 2. Documents: every stage's windows, the probe's and the held-out text.
data() {
  local i=0 s S n
  for s in "${stages[@]}"; do
    if [ $i -eq 0 ]; then i=1; continue; fi  # the base's documents: per rung, in base()
    S=$(seq_of "$s")
    n=$((${STEPS:-$(steps_of "$s")} * $(batch_of "$s")))
    [ $n -gt 40000 ] && n=40000  # the sampler goes round again: a few epochs at most
    "$B/h5synth" -t "$tok" -o "$out/data/$s" --haystack-dir "$hay" --text-dir "$out/tok/text" --length "$S" \
      --documents "$n" --mix "$STAGE_MIX" --prompt-max "${PROMPT_MAX:-$S0}" --prompt-min "$STAGE_PROMPT_MIN" \
      --digits "$DIGITS" --seed $((SEED * 100 + i)) | grep ' documents of ' | sed "s/^h5synth: /$s data: /" | tee -a "$summary"
    i=$((i + 1))
  done
  # Held-out documents of S_last tokens for perplexity, from the held-out verses (PPL_MIX: plain text).
  "$B/h5synth" -t "$tok" -o "$out/data/heldout" --haystack-dir "$out/tok/heldout.txt" --length "$S_last" \
    --documents "$PPL_DOCS" --mix "$PPL_MIX" --prompt-min 1 --digits "$DIGITS" --seed $((SEED * 100 + 99))
}
phase data data
# Prompt tokens beyond the haystack, per task (the same for every stage): eval contexts
# L = S - overhead give prompts of exactly S tokens, the length of a training window: "at
# length S" means that prompt. (The tiny CPU model retrieves at exactly its training length
# and one token off already much less: docs/results.md.)
declare -A ovh
for t in needle passkey multikey multivalue vt; do
  ovh[$t]=$(awk -F'[:,]' -v t="\"$t\"" '/"eval_overhead"/ { on = 1 } on && index($0, t) { print $2 + 0; exit }' \
    "$out/data/${stages[1]}/h5synth.json")
  [ -n "${ovh[$t]}" ] && [ "${ovh[$t]}" -gt 0 ] ||
    { echo "run_extension.sh: no eval_overhead for $t in $out/data/${stages[1]}/h5synth.json" >&2; exit 1; }
done

# needle_eval MODEL OUTDIR SEED SMIN SMAX STEP SAMPLES [flags...]: every task of TASKS at prompt
# lengths SMIN, SMIN + STEP, ..., SMAX (one easyctx_eval_needle run per task, each with its own
# contexts), merged into OUTDIR/needle.csv and OUTDIR/synthetic.csv.
needle_eval() {
  local m=$1 dir=$2 seed=$3 lo=$4 hi=$5 step=$6 samples=$7 t
  shift 7
  mkdir -p "$dir"
  rm -f "$dir/needle.csv" "$dir/synthetic.csv"
  for t in ${TASKS//,/ }; do
    "$B/easyctx_eval_needle" --model "$m" --tokenizer "$tok" --output-dir "$dir/$t" --haystack-dir "$hay" \
      --task "$t" --device "$device" --digits "$DIGITS" --seed "$seed" --min-context-length $((lo - ovh[$t])) \
      --max-context-length $((hi - ovh[$t])) --context-interval "$step" --depth-interval "$DEPTH" \
      --samples "$samples" --progress-every 600 "$@" || return 1
    if [ "$t" = needle ]; then
      cp "$dir/$t/needle.csv" "$dir/$t/needle.png" "$dir/"
    elif [ -f "$dir/synthetic.csv" ]; then
      tail -n +2 "$dir/$t/synthetic.csv" >> "$dir/synthetic.csv"
    else
      cp "$dir/$t/synthetic.csv" "$dir/$t/synthetic.png" "$dir/"
    fi
  done
}
# mean_score DIR: the mean cell score of needle.csv and synthetic.csv (every task together).
mean_score() {
  awk -F, 'FNR > 1 { s += $3; n++ } END { printf "%.4f\n", n ? s / n : 0 }' $(ls "$1"/needle.csv "$1"/synthetic.csv 2>/dev/null)
}

# 3. The base: rung by rung (BASE_RUNGS), each in chunks until its probe retrieves at its length.
base_lr=$(yaml_value "$recipe/${stages[0]}.yaml" train.lr)
read -r -a rungs <<< "${BASE_RUNGS:-}"
[ ${#rungs[@]} -gt 0 ] || rungs=("$S0:$(batch_of "${stages[0]}"):$MIX")
[ "${rungs[${#rungs[@]} - 1]%%:*}" = "$S0" ] ||
  { echo "run_extension.sh: BASE_RUNGS must end at the base stage's length $S0: ${rungs[*]}" >&2; exit 2; }
base() {
  local s=${stages[0]} r L b mix lr ptasks dir init=random i=0 steps acc resume passed total=0
  rm -rf "$out/runs/$s" "$out/runs/$s".* "$out/data/$s" "$out/data/$s".*
  mkdir -p "$out/runs"
  : > "$out/runs/$s.log"
  for r in "${rungs[@]}"; do
    IFS=: read -r L b mix lr <<< "$r"
    lr=${lr:-$base_lr}
    i=$((i + 1))
    # The last rung is the base stage's run (the later stages start from it); the others beside it.
    if [ $i -eq ${#rungs[@]} ]; then dir=$s; else dir=$s.rung-$L; fi
    local n=$((BASE_MAX_STEPS * b))
    [ $n -gt 40000 ] && n=40000  # the sampler goes round again: a few epochs at most
    "$B/h5synth" -t "$tok" -o "$out/data/$dir" --haystack-dir "$hay" --length "$L" --documents "$n" \
      --mix "$mix" --prompt-min "$PROMPT_MIN" --digits "$DIGITS" --seed $((SEED * 100 + 50 + i)) > /dev/null
    # The probe asks the rung's own retrieval tasks (a pass-key rung is not probed on needles).
    ptasks=$(tr ',' '\n' <<< "$mix" | cut -d= -f1 | grep -xE 'needle|passkey|multikey|multivalue|vt' | paste -sd, -)
    [ -n "$ptasks" ] || ptasks=$TASKS
    steps=0 resume=none passed=0
    while :; do
      steps=$((steps + BASE_CHUNK))
      [ $steps -gt "$BASE_MAX_STEPS" ] && steps=$BASE_MAX_STEPS
      train "$s" --set data.path="$out/data/$dir" --set output.dir="$out/runs/$dir" --set data.seq_length="$L" \
        --set train.batch_size="$b" --set train.lr="$lr" --set model.init="$init" --set train.steps=$steps --resume $resume \
        > "$out/runs/$dir.train.log" 2>&1 || { tail -5 "$out/runs/$dir.train.log"; return 1; }
      cat "$out/runs/$dir.train.log" >> "$out/runs/$s.log"
      resume=auto
      TASKS=$ptasks needle_eval "$out/runs/$dir" "$out/runs/$dir.probe" $((SEED * 100 + 77 + steps)) "$L" "$L" 1 \
        "$PROBE_SAMPLES" > "$out/runs/$dir.probe.log" 2>&1 || { tail -5 "$out/runs/$dir.probe.log"; return 1; }
      acc=$(mean_score "$out/runs/$dir.probe")
      say "base: ${L} tokens ($mix, lr $lr), step $steps, probe accuracy $acc ($ptasks) (loss $(grep -o '"loss":[0-9.]*' \
        "$out/runs/$dir/metrics.jsonl" | tail -20 | awk -F: '{ s += $2 } END { printf "%.3f", s / NR }'))"
      if awk -v a="$acc" -v t="$PROBE_TARGET" 'BEGIN { exit !(a >= t) }'; then passed=$((passed + 1)); else passed=0; fi
      [ $passed -ge "$PROBE_TIMES" ] && break  # past the jump, not on its way up
      [ $steps -ge "$BASE_MAX_STEPS" ] && { say "base: the probe stayed below $PROBE_TARGET at $L tokens after $BASE_MAX_STEPS steps"; break; }
    done
    total=$((total + steps))
    init=ckpt:$out/runs/$dir/checkpoints
  done
  base_steps=$total
}
phase "base (${stages[0]})" base

# 4. The extension stages, each from the previous one's last checkpoint.
extend() {
  local prev=${stages[0]} s
  for s in "${stages[@]:1}"; do
    rm -rf "$out/runs/$s"
    train "$s" --set model.init="ckpt:$out/runs/$prev/checkpoints" ${STEPS:+--set train.steps=$STEPS} \
      --resume none > "$out/runs/$s.log" 2>&1 || { tail -5 "$out/runs/$s.log"; return 1; }
    say "$s: $(grep -c '"loss"' "$out/runs/$s/metrics.jsonl") steps at $(seq_of "$s") tokens, rope_theta $(theta_of "$s"), last loss $(grep -o '"loss":[0-9.]*' "$out/runs/$s/metrics.jsonl" | tail -1 | cut -d: -f2)"
    prev=$s
  done
}
phase "extension (${stages[*]:1})" extend

# 5. Evaluation: base, control, every stage on one grid.
evaluate() {
  local m s name dir
  mkdir -p "$out/models" "$out/eval"
  models=()
  for s in "${stages[@]}"; do
    ln -sfn "../runs/$s/final" "$out/models/$s"
    models+=("$s")
  done
  for name in "${stages[0]}" control "${stages[@]:1}"; do
    if [ "$name" = control ]; then m=$out/models/${stages[0]} flags=(--rope-theta "$theta_last"); dir=$out/runs/${stages[0]}/eval/control
    else m=$out/models/$name flags=(); dir=$out/runs/$name/eval; fi
    needle_eval "$m" "$dir" $((SEED * 100 + 55)) "$S0" "$S_last" "${GRID_STEP:-$S0}" "$SAMPLES" "${flags[@]}" \
      > "$out/eval/needle-$name.log" 2>&1 || { tail -5 "$out/eval/needle-$name.log"; return 1; }
    grep "summary" "$out/eval/needle-$name.log" | sed -E 's/;.*//; s/^/'"$name"': /' | tr '\n' ' '
    echo
  done
  # The control's CSVs beside the base's, under their own names (easyctx_report shows both).
  for f in needle synthetic; do
    if [ -f "$out/runs/${stages[0]}/eval/control/$f.csv" ]; then
      cp "$out/runs/${stages[0]}/eval/control/$f.csv" "$out/runs/${stages[0]}/eval/$f-control.csv"
    fi
  done
  local ppl_args=(--tokenized "$out/data/heldout" --min-tokens "$EVAL_STEP" --max-tokens "$S_last"
                  --tokens-step "$EVAL_STEP" --samples "$PPL_DOCS" --device "$device")
  "$B/easyctx_eval_ppl" $(printf -- '--model %s ' "${models[@]/#/$out/models/}") "${ppl_args[@]}" \
    --output-file "$out/ppl.csv" > "$out/eval/ppl.log" 2>&1 || { tail -5 "$out/eval/ppl.log"; return 1; }
  "$B/easyctx_eval_ppl" --model "$out/models/${stages[0]}" --rope-theta "$theta_last" "${ppl_args[@]}" \
    --output-file "$out/eval/ppl-control.csv" --plot none > "$out/eval/ppl-control.log" 2>&1 ||
    { tail -5 "$out/eval/ppl-control.log"; return 1; }
  for s in "${stages[@]}"; do cp "$out/ppl.$s.csv" "$out/runs/$s/eval/ppl.csv"; done
  cp "$out/eval/ppl-control.csv" "$out/runs/${stages[0]}/eval/ppl-control.csv"
  awk -F, 'NR > 1 { print "control," $0 }' "$out/eval/ppl-control.csv" >> "$out/ppl.csv"
}
phase evaluation evaluate

# 6. Tables and the report page.
tables() {
  local name dir
  echo "model,task,length,context,score,samples" > "$out/accuracy.csv"
  for name in "${stages[0]}" control "${stages[@]:1}"; do
    if [ "$name" = control ]; then dir=$out/runs/${stages[0]}/eval/control; else dir=$out/runs/$name/eval; fi
    awk -F, -v m="$name" -v ov="$(for t in "${!ovh[@]}"; do printf '%s=%s ' "$t" "${ovh[$t]}"; done)" '
      BEGIN { nk = split(ov, kv, " "); for (i = 1; i <= nk; i++) { split(kv[i], p, "="); o[p[1]] = p[2] } }
      FNR == 1 { next }
      FILENAME ~ /needle.csv$/ { s[$1] += $3; n[$1] += $4; c[$1]++; next }
      { printf "%s,%s,%d,%d,%.4f,%d\n", m, $1, $2 + o[$1], $2, $3, $4 }
      END { for (k in s) printf "%s,needle,%d,%d,%.4f,%d\n", m, k + o["needle"], k, s[k] / c[k], n[k] }' \
      $(ls "$dir/needle.csv" "$dir/synthetic.csv" 2>/dev/null) | sort -t, -k2,2 -k3,3n >> "$out/accuracy.csv"
  done
  awk -F, '
    NR == 1 { next }
    { key = $1 SUBSEP $2 SUBSEP $3; v[key] = $5; if (!($1 in seen)) { seen[$1] = 1; order[++nm] = $1 }
      if (!($3 in len)) { len[$3] = 1; lens[++nl] = $3 } tasks[$2] = 1
      both[$1 SUBSEP $3] += $5; nb[$1 SUBSEP $3]++ }
    END {
      n = nl  # lengths in ascending order (insertion sort: mawk has no asort)
      for (i = 2; i <= n; i++) for (j = i; j > 1 && lens[j - 1] + 0 > lens[j] + 0; j--) { t = lens[j]; lens[j] = lens[j - 1]; lens[j - 1] = t }
      nt = 0
      for (t in tasks) tl[++nt] = t
      for (i = 2; i <= nt; i++) for (j = i; j > 1 && tl[j - 1] > tl[j]; j--) { x = tl[j]; tl[j] = tl[j - 1]; tl[j - 1] = x }
      if (nt > 1) tl[++nt] = "all"
      for (t = 1; t <= nt; t++) {
        printf "\n**%s** (accuracy by prompt length in tokens)\n\n| model |", tl[t]
        for (i = 1; i <= n; i++) printf " %d |", lens[i]
        printf " mean |\n|---|"
        for (i = 1; i <= n + 1; i++) printf "---|"
        printf "\n"
        for (m = 1; m <= nm; m++) {
          printf "| %s |", order[m]; sum = 0
          for (i = 1; i <= n; i++) {
            k = order[m] SUBSEP lens[i]
            x = tl[t] == "all" ? both[k] / nb[k] : v[order[m] SUBSEP tl[t] SUBSEP lens[i]]
            printf " %.2f |", x; sum += x
          }
          printf " %.2f |\n", sum / n
        }
      }
    }' "$out/accuracy.csv" > "$out/accuracy.md"
  "$B/easyctx_report" "${stages[@]/#/$out/runs/}" --output "$out/report.html" \
    --title "easyctx context extension ($scale): ${stages[*]}" > /dev/null
}
phase tables tables
cat "$out/accuracy.md" | tee -a "$summary"
say ""
say "perplexity of the held-out documents (ppl.csv: $PPL_MIX), at $S0 and $S_last tokens:"
awk -F, -v a="$S0" -v b="$S_last" 'NR > 1 && ($2 == a || $2 == b) { printf "  %-12s %6d tokens  %.2f\n", $1, $2, $3 }' \
  "$out/ppl.csv" | tee -a "$summary"
say "base trained ${base_steps} steps; outputs in $out (accuracy.csv, accuracy.md, targets.txt, ppl.csv, ppl.png, report.html)"

# 7. The targets of docs/results.md, from the CSVs (bench/extension_seeds.sh collects them over seeds).
bash bench/extension_seeds.sh targets "$out" "${stages[0]}" "$last" "$S0" "$S_last" | tee "$out/targets.txt" | tee -a "$summary"
