#!/usr/bin/env bash
# easyctx_eval_needle end to end on the CPU: a random model of the demo's shape with the demo
# tokenizer over the default haystack (the KJV through bible-kjv) and every task: the CSVs,
# the heatmap PNGs, summary.json, progress lines (cells, tok/s, ETA) and the summary line;
# under mpirun -np 2 sequence parallel (zigzag ring) and data parallel (the cells of a length
# shared by the two ranks) the same CSVs and answer NLLs; bad flags, a missing tokenizer or
# haystack exit 2 naming them (under mpirun too, every rank agreeing), and so does a haystack
# file that cannot be read (rank 0 reads it alone; every rank exits 2, one message).
set -uo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-eval-needle.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$work"/*.log 2>/dev/null | cut -c1-300; trap - EXIT; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

source "$src/tests/tiny_data.sh"
tiny_mpirun
tok=$(tiny_tokenizer "$work") || fail "tokenizer"
seed=$((RANDOM % 1000))
common=(--model "random:demo@$seed" --device cpu --min-context-length 100
        --max-context-length 300 --context-interval 100 --depth-interval 0.5 --samples 2 --digits 5
        --distractors 1 --seed "$seed" --task needle,passkey,multikey,multivalue,vt --progress-every 0)

"$bin/easyctx_eval_needle" "${common[@]}" --tokenizer "$tok" --output-dir "$work/one" > "$work/one.log" 2>&1 || fail "one process"
head -n 1 "$work/one/needle.csv" | grep -qx "context,depth,score,samples" || fail "needle.csv header"
[ "$(tail -n +2 "$work/one/needle.csv" | wc -l)" -eq 9 ] || fail "needle.csv: 3 lengths x 3 depths"
head -n 1 "$work/one/synthetic.csv" | grep -qx "task,context,score,samples" || fail "synthetic.csv header"
[ "$(tail -n +2 "$work/one/synthetic.csv" | wc -l)" -eq 12 ] || fail "synthetic.csv: 4 tasks x 3 lengths"
for png in needle synthetic; do
  head -c 4 "$work/one/$png.png" | od -An -c | grep -q "P   N   G" || fail "no $png.png"
done
grep -q '"haystack": "the King James Bible (bible-kjv)' "$work/one/summary.json" || fail "default haystack not the KJV"
grep -q '"answer_nll"' "$work/one/summary.json" || fail "no answer NLL in summary.json"
grep -q "eval needle: cells 7/21, prompts 14/42, .* tok/s, elapsed .*, ETA " "$work/one.log" || fail "no progress line"
grep -q "^needle L=200: depth 0 ./2, 0.5 ./2, 1 ./2" "$work/one.log" || fail "no per-length line"
grep -q "eval needle summary: 21 cells, average accuracy needle 0.0000, passkey 0.0000" "$work/one.log" \
  || fail "no summary line (a random model retrieves nothing)"

nll() { grep -o '"answer_nll": [0-9.e+-]*' "$1/summary.json" | cut -d' ' -f2; }
for run in "--sp-size 2 --sp-mode zigzag_ring" "--sp-size 1"; do
  name=$(echo "$run" | tr -d ' -')
  # shellcheck disable=SC2086
  "${mpi[@]}" "$bin/easyctx_eval_needle" "${common[@]}" --tokenizer "$tok" $run --output-dir "$work/$name" > "$work/$name.log" 2>&1 \
    || fail "mpirun $run"
  for csv in needle synthetic; do
    cmp -s "$work/one/$csv.csv" "$work/$name/$csv.csv" || fail "mpirun $run: $csv.csv differs from one process"
  done
  paste <(nll "$work/one") <(nll "$work/$name") | awk -v run="$run" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print run ": answer NLL " $0; bad = 1 } } END { exit bad }' \
    || fail "mpirun $run: answer NLLs differ"
  grep -q "2 rank(s)" "$work/$name.log" || fail "mpirun $run: not 2 ranks"
done

bad() {  # flags, expected text
  "$bin/easyctx_eval_needle" "${common[@]}" --tokenizer "${tokenizer:-$tok}" --output-dir "$work/bad" "${@:1:$#-1}" > "$work/bad.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && grep -q -- "${!#}" "$work/bad.log" || fail "$* : exit $rc, expected 2 naming it: $(cat "$work/bad.log")"
}
# --context-lengths: exactly the lengths listed (any spacing), alone or refused beside the range flags.
"$bin/easyctx_eval_needle" --model "random:demo@$seed" --device cpu --tokenizer "$tok" --output-dir "$work/list" \
  --context-lengths 90,150,260 --depth-interval 0.5 --samples 1 --digits 5 --progress-every 0 > "$work/list.log" 2>&1 ||
  fail "--context-lengths"
[ "$(tail -n +2 "$work/list/needle.csv" | cut -d, -f1 | sort -nu | paste -sd,)" = "90,150,260" ] ||
  fail "--context-lengths 90,150,260: needle.csv has lengths $(tail -n +2 "$work/list/needle.csv" | cut -d, -f1 | sort -nu | paste -sd,)"
bad --context-lengths 100,200 "give it or --"
bad --depth-interval 0 "--depth-interval"
bad --sp-size 2 "--sp-size"
bad --haystack-dir "$work/nothing" "--haystack-dir"
bad --task needles "--task"
"$bin/easyctx_eval_needle" --model "random:demo@$seed" --device cpu --tokenizer "$tok" --output-dir "$work/bad" \
  --context-lengths 300,200 > "$work/bad.log" 2>&1
[ $? -eq 2 ] && grep -q -- "--context-lengths: '300,200'" "$work/bad.log" || fail "--context-lengths 300,200: $(cat "$work/bad.log")"
tokenizer="$work/none.model" bad "none.model"
# Under mpirun every rank agrees on the error: exit 2, one message, no abort.
"${mpi[@]}" "$bin/easyctx_eval_needle" "${common[@]}" --tokenizer "$tok" --output-dir "$work/bad" \
  --haystack-dir "$work/nothing" > "$work/badmpi.log" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(grep -c -- "--haystack-dir" "$work/badmpi.log")" -eq 1 ] && ! grep -q MPI_ABORT "$work/badmpi.log" \
  || fail "mpirun, missing haystack: exit $rc, expected 2 and one message: $(cat "$work/badmpi.log")"
# A haystack file that is there but cannot be read (a JSON line that does not parse): rank 0
# alone reads it, and every rank ends alike: exit 2 each, one message naming the file, no abort.
mkdir -p "$work/badhay"
printf '{"text": "fine"}\n{"text": broken\n' > "$work/badhay/a.jsonl"
"${mpi[@]}" bash -c '"$@"; echo "rank ${OMPI_COMM_WORLD_RANK:-?} exit $?"' each "$bin/easyctx_eval_needle" "${common[@]}" \
  --tokenizer "$tok" --output-dir "$work/bad" --haystack-dir "$work/badhay" > "$work/badhay.log" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c '^rank [01] exit 2$' "$work/badhay.log")" -eq 2 ] \
  && [ "$(grep -c 'error:' "$work/badhay.log")" -eq 1 ] && grep -q "error: .*badhay/a.jsonl line 2" "$work/badhay.log" \
  && ! grep -q MPI_ABORT "$work/badhay.log" \
  || fail "mpirun, unreadable haystack: expected exit 2 on both ranks and one message: $(cat "$work/badhay.log")"
# --plan: the memory plan of the longest prompt (on this machine, and for an A100-40GB at 2M
# tokens, which does not fit and names --sp-size), exit 0 / 3, nothing written.
"$bin/easyctx_eval_needle" "${common[@]}" --tokenizer "$tok" --output-dir "$work/plan" --plan > "$work/plan.log" 2>&1 \
  || fail "--plan: exit $?"
grep -qE "^longest prompt: [0-9]+ tokens \(context length 300 " "$work/plan.log" && grep -q '^{"fits":true' "$work/plan.log" \
  || fail "--plan: no longest prompt or plan: $(cat "$work/plan.log")"
"$bin/easyctx_eval_needle" --model random:llama2-7b --tokenizer "$tok" --output-dir "$work/plan" --device cuda --plan \
  --task passkey --min-context-length 2000000 --max-context-length 2000000 --set target.gpu=A100-40GB \
  > "$work/plan3.log" 2>&1
rc=$?
[ $rc -eq 3 ] && grep -q "does not fit: .* Would fit: .*--sp-size" "$work/plan3.log" \
  || fail "--plan on an A100-40GB at 2M tokens: exit $rc, expected 3 naming --sp-size: $(tail -3 "$work/plan3.log")"
[ ! -e "$work/plan" ] || fail "--plan wrote $work/plan"
echo "ok"
