#!/usr/bin/env bash
# Context extension end to end at CPU scale, two seeds at once: `bench/run_extension.sh cpu`
# (h5synth's documents, a tiny base model trained until it retrieves the pass key at 128
# tokens, the extension stage configs/recipes/extension-cpu/s1-512.yaml started from its
# checkpoint with model.init: ckpt: and a larger model.rope_theta, trained on natural text (the
# KJV's training verses, the Jargon File, fortune-mod's cookies) with pass-key prompts of at
# most 128 tokens packed in, easyctx_eval_needle and easyctx_eval_ppl on one grid for the base,
# the control (--rope-theta only) and the extended model, the tables, the targets and the report
# page), then, for each seed, from its CSVs:
#   - the base retrieves the pass key at its length (>= 0.8) and not beyond (<= 0.1);
#   - the extended model beats the base beyond 128 tokens on the held-out KJV text: its
#     perplexity below half the base's at every length in (128, 512];
#   - beyond 128 it retrieves no worse than the base within sampling noise (both near chance
#     there: 3 lengths x 40 prompts each, 0.1 is over four standard errors of the difference at
#     the 0.03 measured there). At this
#     scale retrieval does not carry beyond the length it was trained at (docs/results.md,
#     measured with this model and the 2-layer one); the H200 scale is where that is measured.
# Also h5synth's flag errors, and bench/extension_seeds.sh collecting the two runs. Fresh seeds
# every run (printed; EASYCTX_TEST_SEED=S repeats S and S + 1).
set -uo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-extension.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  tail -30 "$work/run.log" 2>/dev/null | cut -c1-300
  [ -n "${EASYCTX_EXTENSION_KEEP:-}" ] && cp -r "$work/out" "$EASYCTX_EXTENSION_KEEP"
  exit 1
}
seed=${EASYCTX_TEST_SEED:-$((RANDOM * 32768 + RANDOM + 1))}
echo "seed $seed (EASYCTX_TEST_SEED=$seed repeats it)"
t0=$SECONDS

# h5synth: bad input is one line naming the flag or file, exit 2.
tok=$(bash "$src/scripts/make_demo_tokenizer.sh" "$work/tok") || fail "tokenizer"
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1
  shift
  "$bin/h5synth" "$@" > "$work/err.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "h5synth $*: exit $rc, expected 2: $(cat "$work/err.log")"
  grep -q -- "$pattern" "$work/err.log" || fail "h5synth $*: no '$pattern' in: $(cat "$work/err.log")"
  [ "$(grep -c . "$work/err.log")" -eq 1 ] || fail "h5synth $*: not one line: $(cat "$work/err.log")"
}
expect_error "--mix: unknown document kind 'essay'" -t "$tok" -o "$work/x" --length 256 --documents 4 --mix essay=1
expect_error "--length: 16" -t "$tok" -o "$work/x" --length 16 --documents 4
expect_error "--tokenizer: $work/none.model is not a file" -t "$work/none.model" -o "$work/x" --length 256 --documents 4
expect_error "--haystack-dir" -t "$tok" -o "$work/x" --length 256 --documents 4 --haystack-dir "$work/nothing"
expect_error "documents" -t "$tok" -o "$work/x" --length 256

expect_error "--prompt-max: 32" -t "$tok" -o "$work/x" --length 256 --documents 4 --prompt-max 32
expect_error "--text-dir: only packed windows" -t "$tok" -o "$work/x" --length 256 --documents 4 --text-dir "$work"
expect_error "--text-dir" -t "$tok" -o "$work/x" --length 256 --documents 4 --prompt-max 128 --text-dir "$work/nothing"

# The two seeds side by side, one core each.
seeds=("$seed" $((seed + 1)))
pids=()
for s in "${seeds[@]}"; do
  OMP_NUM_THREADS=1 B=$bin SEED=$s bash "$src/bench/run_extension.sh" cpu "$work/out-$s" > "$work/run-$s.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  wait "${pids[$i]}" || { cp "$work/run-${seeds[$i]}.log" "$work/run.log"; fail "run_extension.sh cpu, seed ${seeds[$i]}"; }
done

check() { awk "BEGIN { exit !($1) }" || fail "$2"; }
for s in "${seeds[@]}"; do
  out=$work/out-$s
  cp "$work/run-$s.log" "$work/run.log"
  cat "$out/summary.txt"
  acc=$out/accuracy.csv
  [ -f "$acc" ] && [ -f "$out/ppl.csv" ] && [ -f "$out/report.html" ] && [ -s "$out/targets.txt" ] || fail "seed $s: missing outputs"
  for f in runs/s0-base-128/eval/synthetic.csv runs/s0-base-128/eval/synthetic-control.csv \
           runs/s1-512/eval/synthetic.csv runs/s1-512/eval/ppl.csv runs/s0-base-128/eval/ppl-control.csv ppl.png \
           accuracy.md data/s1-512/h5synth.json; do
    [ -s "$out/$f" ] || fail "seed $s: no $f"
  done
  # What the stage saw: text and pass-key prompts of at most the base length, nothing longer.
  longest=$(sed -nE 's/.*"longest_prompt": ([0-9]+).*/\1/p' "$out/data/s1-512/h5synth.json")
  text_tokens=$(tr -d '\n ' < "$out/data/s1-512/h5synth.json" | sed -nE 's/.*"tokens_by_kind":\{[^}]*"text":([0-9]+).*/\1/p')
  [ -n "$longest" ] && [ "$longest" -le 128 ] && [ "$longest" -ge 100 ] || fail "seed $s: the stage's longest prompt is '$longest' tokens, not in [100, 128]"
  [ -n "$text_tokens" ] && [ "$text_tokens" -gt 0 ] || fail "seed $s: the stage's windows hold no text"
  # mean MODEL LO HI: the pass key's mean accuracy over prompt lengths in [LO, HI].
  mean() {
    awk -F, -v m="$1" -v lo="$2" -v hi="$3" '$1 == m && $2 == "passkey" && $3 >= lo && $3 <= hi { s += $5; n++ }
      END { if (!n) { print "none"; exit 1 } printf "%.3f\n", s / n }' "$acc"
  }
  base_at=$(mean s0-base-128 128 128) || fail "seed $s: no base row at 128 in accuracy.csv"
  base_beyond=$(mean s0-base-128 129 512) || fail "seed $s: no base rows beyond 128"
  control_beyond=$(mean control 129 512) || fail "seed $s: no control rows beyond 128"
  ext_beyond=$(mean s1-512 129 512) || fail "seed $s: no extended rows beyond 128"
  ext_at=$(mean s1-512 128 128) || fail "seed $s: no extended row at 128"
  ppl_of() { awk -F, -v m="$1" -v t="$2" '$1 == m && $2 == t { print $3 }' "$out/ppl.csv"; }
  ppl_base=$(ppl_of s0-base-128 512)
  ppl_ext=$(ppl_of s1-512 512)
  ppl_control=$(ppl_of control 512)
  [ -n "$ppl_base" ] && [ -n "$ppl_ext" ] && [ -n "$ppl_control" ] || fail "seed $s: no perplexity at 512 tokens in ppl.csv"
  # Beyond the base length, at every length: the extended model's perplexity below half the base's.
  worse=$(awk -F, '$2 > 128 { p[$1 "," $2] = $3; if ($1 == "s1-512") L[$2] = 1 }
    END { for (t in L) if (!(p["s1-512," t] < 0.5 * p["s0-base-128," t])) print t }' "$out/ppl.csv" | sort -n | tr '\n' ' ')
  echo "seed $s: pass-key accuracy: base $base_at at 128, $base_beyond at 256-512; control $control_beyond at 256-512;" \
    "extended $ext_beyond at 256-512 ($ext_at at 128); held-out perplexity at 512: base $ppl_base, control" \
    "$ppl_control, extended $ppl_ext"
  check "$base_at >= 0.8" "seed $s: the base does not retrieve the pass key at its length ($base_at < 0.8)"
  check "$base_beyond <= 0.1" "seed $s: the base retrieves beyond its length ($base_beyond > 0.1): nothing to extend"
  [ -z "$worse" ] || fail "seed $s: perplexity after the extension not below half the base's at $worse tokens"
  check "$ext_beyond >= $base_beyond - 0.1" "seed $s: the extended model retrieves less than the base beyond 128 tokens, by more than sampling noise ($ext_beyond < $base_beyond - 0.1)"
done
bash "$src/bench/extension_seeds.sh" collect "$work/seeds.md" "$work/out-${seeds[0]}" "$work/out-${seeds[1]}" > /dev/null ||
  fail "extension_seeds.sh collect"
grep -q "seeds ${seeds[0]} ${seeds[1]}" "$work/seeds.md" && grep -q "^| s1-512 |" "$work/seeds.md" ||
  fail "extension_seeds.sh collect: no table of both seeds in $(cat "$work/seeds.md")"
echo "both seeds: $((SECONDS - t0)) s"
echo "PASS"
