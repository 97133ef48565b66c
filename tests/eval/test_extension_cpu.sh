#!/usr/bin/env bash
# Context extension end to end at CPU scale: `bench/run_extension.sh cpu` (h5synth's documents,
# a tiny base model trained until it finds the needle at 128 tokens, the extension stage
# configs/recipes/extension-cpu/s1-512.yaml started from its checkpoint with model.init: ckpt:
# and a larger model.rope_theta, easyctx_eval_needle and easyctx_eval_ppl on one grid for the
# base, the control (--rope-theta only) and the extended model, the tables and the report
# page), then the direction of the result from its CSVs: the base finds the needle at its
# length and not beyond, the extended model does beyond it by a clear margin, and the held-out
# text's perplexity at 512 tokens is lower after the extension. Also h5synth's flag errors.
# A fresh seed every run (printed; EASYCTX_TEST_SEED repeats one).
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

B=$bin SEED=$seed bash "$src/bench/run_extension.sh" cpu "$work/out" > "$work/run.log" 2>&1 || fail "run_extension.sh cpu"
cat "$work/out/summary.txt"
acc=$work/out/accuracy.csv
[ -f "$acc" ] && [ -f "$work/out/ppl.csv" ] && [ -f "$work/out/report.html" ] || fail "missing outputs"
for f in runs/s0-base-128/eval/needle.csv runs/s0-base-128/eval/needle-control.csv runs/s1-512/eval/needle.csv \
         runs/s1-512/eval/ppl.csv ppl.png accuracy.md; do
  [ -s "$work/out/$f" ] || fail "no $f"
done
# mean MODEL LO HI: the needle's mean accuracy over prompt lengths in [LO, HI].
mean() {
  awk -F, -v m="$1" -v lo="$2" -v hi="$3" '$1 == m && $2 == "needle" && $3 >= lo && $3 <= hi { s += $5; n++ }
    END { if (!n) { print "none"; exit 1 } printf "%.3f\n", s / n }' "$acc"
}
base_at=$(mean s0-base-128 128 128) || fail "no base row at 128 in accuracy.csv"
base_beyond=$(mean s0-base-128 129 512) || fail "no base rows beyond 128"
control_beyond=$(mean control 129 512) || fail "no control rows beyond 128"
ext_beyond=$(mean s1-512 129 512) || fail "no extended rows beyond 128"
ext_at=$(mean s1-512 128 128) || fail "no extended row at 128"
ppl_of() { awk -F, -v m="$1" '$1 == m && $2 == 512 { print $3 }' "$work/out/ppl.csv"; }
ppl_base=$(ppl_of s0-base-128)
ppl_ext=$(ppl_of s1-512)
[ -n "$ppl_base" ] && [ -n "$ppl_ext" ] || fail "no perplexity at 512 tokens in ppl.csv"
echo "needle accuracy: base $base_at at 128, $base_beyond at 256-512; control $control_beyond at 256-512;" \
  "extended $ext_beyond at 256-512 ($ext_at at 128); held-out perplexity at 512: base $ppl_base, extended $ppl_ext;" \
  "$((SECONDS - t0)) s"
check() { awk "BEGIN { exit !($1) }" || fail "$2"; }
check "$base_at >= 0.6" "the base does not find the needle at its length ($base_at < 0.6)"
check "$base_beyond <= 0.1" "the base finds the needle beyond its length ($base_beyond > 0.1): nothing to extend"
check "$ext_beyond >= $base_beyond + 0.15" "the extended model ($ext_beyond) is not clearly better than the base ($base_beyond) beyond 128 tokens"
check "$ppl_ext < $ppl_base" "perplexity at 512 tokens not lower after the extension ($ppl_ext vs $ppl_base)"
echo "PASS"
