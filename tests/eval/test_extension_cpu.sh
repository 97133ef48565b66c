#!/usr/bin/env bash
# The context-extension proof's pipeline at CPU scale (bench/run_extension.sh cpu,
# docs/results.md), one fresh seed with the ablation arm: the corpus (the first 300 KB of each
# Debian text package, scripts/make_text_corpus.py), its tokenizer, the shards, h5recall's
# windows for the three stages (256 -> 512 -> 1K), the isolation check, the base, the control,
# the stages, the ablation, every evaluation, the tables and the targets. Then, from its files:
#   - isolation: the bench's h5inspect --forbid passed over every training shard, decoded from
#     its token ids; and it is real: the same bench over a corpus with the needle's sentence
#     in one training block stops at its isolation phase, naming the phrase;
#   - the split: no held-out block is among the training blocks, and the needle's haystack
#     (held-out text) is not in the training text;
#   - the outputs: accuracy.csv rows of every model at 256, 512 and 1K, the heatmaps, ppl.csv,
#     targets.txt with its six targets and the ablation's line;
#   - every evaluation scored (accuracies of 12 prompts per length, finite perplexities);
#   - determinism: h5recall's windows are the same at 1 and 2 threads, and the base stage
#     trained twice for 20 steps gives the same losses to the bit;
#   - bench/extension_seeds.sh collects the run;
# and h5recall's and h5synth's flag errors (one line, exit 2).
# What the toy model learns is not asserted: at this scale it learns neither retrieval nor much
# language (docs/results.md); the GPU scale is where the targets are measured. Fresh seed every run (printed; EASYCTX_TEST_SEED=S repeats it).
set -uo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-extension.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  tail -30 "$work/run.log" 2> /dev/null | cut -c1-300
  [ -n "${EASYCTX_EXTENSION_KEEP:-}" ] && cp -r "$work/out" "$EASYCTX_EXTENSION_KEEP"
  exit 1
}
seed=${EASYCTX_TEST_SEED:-$((RANDOM * 32768 + RANDOM + 1))}
echo "seed $seed (EASYCTX_TEST_SEED=$seed repeats it)"
t0=$SECONDS
out=$work/out
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# h5recall's and h5synth's flag errors: one line naming the flag or file, exit 2.
tok=$(bash "$src/scripts/make_demo_tokenizer.sh" "$work/demo-tok") || fail "tokenizer"
expect_error() {  # expect_error TOOL PATTERN ARGS...
  local tool=$1 pattern=$2
  shift 2
  "$bin/$tool" "$@" > "$work/err.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "$tool $*: exit $rc, expected 2: $(cat "$work/err.log")"
  grep -q -- "$pattern" "$work/err.log" || fail "$tool $*: no '$pattern' in: $(cat "$work/err.log")"
  [ "$(grep -c . "$work/err.log")" -eq 1 ] || fail "$tool $*: not one line: $(cat "$work/err.log")"
}
text=$(dirname "$tok")/kjv.txt
expect_error h5recall "--mix: unknown episode kind 'needle'" -t "$tok" -o "$work/x" --text-dir "$text" --length 256 --windows 4 --mix needle=1
expect_error h5recall "--length: 64" -t "$tok" -o "$work/x" --text-dir "$text" --length 64 --windows 4
expect_error h5recall "--lm-share: 2" -t "$tok" -o "$work/x" --text-dir "$text" --length 256 --windows 4 --lm-share 2
expect_error h5recall "--min-distance 300 is above --max-distance 100" -t "$tok" -o "$work/x" --text-dir "$text" --length 512 \
  --windows 4 --min-distance 300 --max-distance 100
expect_error h5recall "--text-dir" -t "$tok" -o "$work/x" --text-dir "$work/nothing" --length 256 --windows 4
expect_error h5recall "--tokenizer: $work/none.model is not a file" -t "$work/none.model" -o "$work/x" --text-dir "$text" \
  --length 256 --windows 4
expect_error h5synth "--mix: unknown document kind 'essay'" -t "$tok" -o "$work/x" --length 256 --documents 4 --mix essay=1
expect_error h5synth "--length: 16" -t "$tok" -o "$work/x" --length 16 --documents 4
expect_error h5synth "--haystack-dir" -t "$tok" -o "$work/x" --length 256 --documents 4 --haystack-dir "$work/nothing"
expect_error h5synth "--prompt-max: 32" -t "$tok" -o "$work/x" --length 256 --documents 4 --prompt-max 32
expect_error h5synth "--text-dir: only packed windows" -t "$tok" -o "$work/x" --length 256 --documents 4 --text-dir "$work"

# The whole pipeline, the ablation arm too, at a quarter of the stages' steps (nothing learned
# is asserted here, and CI runs it on 2 cores; EXT_STAGE_STEPS="150 60 30" runs the recipe's).
B=$bin SEED=$seed ABLATION=1 THREADS=2 STAGE_STEPS="${EXT_STAGE_STEPS:-40 20 10}" bash "$src/bench/run_extension.sh" cpu "$out" > "$work/run.log" 2>&1 ||
  fail "run_extension.sh cpu"
cat "$out/summary.txt"
check() { awk "BEGIN { exit !($1) }" || fail "$2"; }

# Isolation: the bench's check ran over every training shard and found nothing.
grep -q "^forbidden phrases: none of [0-9]* in [0-9]* tokens of [0-9]* documents" "$out/isolation.txt" ||
  fail "isolation.txt: $(cat "$out/isolation.txt")"
nphrases=$(sed -nE 's/^forbidden phrases: none of ([0-9]+) .*/\1/p' "$out/isolation.txt")
check "$nphrases >= 5" "isolation: only $nphrases phrases checked (the needle's 4 and held-out lines)"
for s in s0-base-256 s1-512 s2-1k; do
  grep -q "$out/data/$s/recall.h5" "$out/isolation.txt" || fail "isolation: $s's windows not checked"
done
# The split: held-out blocks are not training blocks, and the haystack is not training text.
for f in "$out"/corpus/heldout/*.txt; do
  name=$(basename "$f" | sed -E 's/^[0-9]+-//')
  [ ! -e "$out/corpus/train/$name" ] || fail "held-out block $name is also a training block"
done
line=$(awk 'length($0) > 60 { print; exit }' "$out/corpus/haystack.txt")
[ -n "$line" ] && ! grep -rqF -- "$line" "$out/corpus/train" || fail "the haystack's line '$line' is in the training text"

# The outputs.
for f in accuracy.csv accuracy.md ppl.csv targets.txt timing.txt eval/s0-base-256/needle.png eval/control/needle.png \
         eval/s2-1k/needle.png eval/abl-s2-1k/needle.png data/s2-1k/h5recall.json; do
  [ -s "$out/$f" ] || fail "no $f"
done
for m in s0-base-256 control s1-512 s2-1k abl-s2-1k; do
  for L in 256 512 1024; do
    grep -q "^$m,$L," "$out/accuracy.csv" || fail "accuracy.csv: no $m at $L"
    grep -q "^$m,$L," "$out/ppl.csv" || fail "ppl.csv: no $m at $L"
  done
done
[ "$(grep -cE '^(PASS|FAIL) ' "$out/targets.txt")" -eq 6 ] && grep -q "^INFO ablation abl-s2-1k" "$out/targets.txt" ||
  fail "targets.txt: $(cat "$out/targets.txt")"
# What the stages trained on: windows of their length, distances up to near it.
longest=$(sed -nE 's/.*"longest_distance": ([0-9]+).*/\1/p' "$out/data/s2-1k/h5recall.json")
check "${longest:-0} > 700" "s2-1k's longest statement-question distance is ${longest:-none} (expected most of 1024)"
# Every evaluation scored: accuracies in [0, 1] over 12 prompts (3 depths x 4), perplexities finite.
awk -F, 'NR > 1 && !($4 >= 0 && $4 <= 1 && $5 == 12) { print; bad = 1 } END { exit bad }' "$out/accuracy.csv" ||
  fail "accuracy.csv: a row out of range or not 12 prompts"
awk -F, 'NR > 1 && !($3 > 1 && $3 < 1e6) { print; bad = 1 } END { exit bad }' "$out/ppl.csv" ||
  fail "ppl.csv: a perplexity that is not finite"

# Determinism: h5recall at 1 and 2 threads; the base trained twice.
for t in 1 2; do
  tok=$(ls "$out"/tok/*.model)
  "$bin/h5recall" -t "$tok" -o "$work/recall-$t" --text-dir "$out/shards/train-text" --length 512 --windows 64 --episodes 5 \
    --seed "$seed" --threads $t > /dev/null 2>&1 || fail "h5recall --threads $t"
  h5dump -d /tokens -d /loss_weights "$work/recall-$t/recall.h5" | grep -v "HDF5 \"" > "$work/recall-$t.txt"
done
cmp -s "$work/recall-1.txt" "$work/recall-2.txt" || fail "h5recall's windows differ between 1 and 2 threads"
for r in 1 2; do
  "$bin/easyctx_train" "$src/configs/recipes/extension-cpu/s0-base-256.yaml" --set data.path="$out/data/s0-base-256" \
    --set output.dir="$work/det-$r" --set train.seed="$seed" --set train.steps=20 --set train.warmup_steps=5 \
    --set output.export_hf=false \
    --resume none > "$work/det-$r.log" 2>&1 || { cp "$work/det-$r.log" "$work/run.log"; fail "easyctx_train (determinism $r)"; }
  grep -o '"loss":[0-9.e+-]*' "$work/det-$r/metrics.jsonl" > "$work/det-$r.loss"
done
[ "$(wc -l < "$work/det-1.loss")" -eq 20 ] && cmp -s "$work/det-1.loss" "$work/det-2.loss" ||
  fail "the base stage trained twice gave other losses: $(paste "$work/det-1.loss" "$work/det-2.loss" | head -5)"

# The isolation check is real: a training block with the needle's sentence stops the bench.
tok=$(ls "$out"/tok/*.model)
cp -r "$out/corpus" "$work/poisoned"
printf '\nThe special magic Singapore number is: 4417.\n' >> "$(ls "$work"/poisoned/train/*.txt | tail -1)"
B=$bin SEED=$seed TOKENIZER=$tok THREADS=2 STAGE_STEPS="2 2 2" CORPUS=$work/poisoned \
  bash "$src/bench/run_extension.sh" cpu "$work/poisoned-out" > "$work/poisoned.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "isolation: FAILED" "$work/poisoned.log" && grep -qiE "'(singapore|special magic)'" "$work/poisoned-out/isolation.txt" &&
  [ ! -d "$work/poisoned-out/runs" ] || { cp "$work/poisoned.log" "$work/run.log"; fail "a poisoned corpus passed the isolation check (exit $rc)"; }

bash "$src/bench/extension_seeds.sh" collect "$work/seeds.md" "$out" > /dev/null || fail "extension_seeds.sh collect"
grep -q "seeds $seed" "$work/seeds.md" && grep -q "^| s2-1k |" "$work/seeds.md" || fail "extension_seeds.sh collect: $(cat "$work/seeds.md")"
# A seed run without the ablation arm (ABLATION=0, as seeds 2 and 3 run): its tables, and the
# collection of it beside one with the arm, end well (no arm is no error under pipefail).
cp -r "$out" "$work/noabl" && rm -rf "$work"/noabl/eval/abl-* "$work/noabl/targets.txt"
bash "$src/bench/extension_seeds.sh" tables "$work/noabl" cpu > "$work/noabl.log" 2>&1 || fail "extension_seeds.sh tables without an ablation: $(tail -3 "$work/noabl.log")"
[ "$(grep -cE '^(PASS|FAIL) ' "$work/noabl/targets.txt")" -eq 6 ] && ! grep -q "^INFO" "$work/noabl/targets.txt" ||
  fail "targets.txt without an ablation: $(cat "$work/noabl/targets.txt")"
bash "$src/bench/extension_seeds.sh" collect "$work/seeds2.md" "$out" "$work/noabl" > /dev/null 2>&1 ||
  fail "extension_seeds.sh collect of runs with and without the ablation"
grep -q "^Runs: 2 " "$work/seeds2.md" || fail "extension_seeds.sh collect of two runs: $(head -3 "$work/seeds2.md")"
echo "$((SECONDS - t0)) s"
echo "PASS"
