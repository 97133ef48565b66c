#!/usr/bin/env bash
# easyctx_eval_ppl end to end on the CPU: a demo model trained for a few steps on KJV chapters
# is evaluated as its Hugging Face export and as its checkpoint (ckpt:DIR) in one call (the
# combined CSV with a model column, a CSV per model, one PNG chart with both; the two give the
# same bits: the export is f32), then under mpirun -np 2 sequence parallel (zigzag ring) and
# data parallel (the same perplexities, 1e-5), the checkpoint too; a flipped bit in the
# checkpoint ends both programs under mpirun on every rank with exit 2 and one message; --plan prints a plan and exits 0 (a 7B at 1M
# tokens on one H200) or 3 (at 8M, naming flags that fit), bad flags exit 2.
set -uo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-eval-ppl.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$work"/*.log 2>/dev/null | cut -c1-300; trap - EXIT; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

source "$src/tests/tiny_data.sh"
tiny_mpirun
tok=$(tiny_data "$bin" "$work" 120) || fail "the training data (tests/tiny_data.sh)"
sed -n '1000,1040p' "$work/chapters.jsonl" > "$work/eval.jsonl"
tiny_shard "$bin" "$tok" "$work/eval.jsonl" "$work/evaldata" || fail "h5tokenize eval"
{
  tiny_stage "$work/data" 96 12
  cat <<YAML
  batch_size: 2
  lr: 3e-3
  device: cpu
output:
  dir: $work/run
  hf_dtype: f32
YAML
} > "$work/stage.yaml"
"$bin/easyctx_train" "$work/stage.yaml" > "$work/train.log" 2>&1 || fail "training the model"
[ -f "$work/run/final/config.json" ] || fail "no HF export in run/final"

common=(--tokenized "$work/evaldata" --min-tokens 64 --max-tokens 256 --tokens-step 64 --samples 3 --device cpu)
mkdir -p "$work/out"
"$bin/easyctx_eval_ppl" --model "$work/run/final" --model "ckpt:$work/run" "${common[@]}" \
  --output-file "$work/out/both.csv" > "$work/both.log" 2>&1 || fail "two models"
head -n 1 "$work/out/both.csv" | grep -qx "model,tokens,ppl,documents,nll" || fail "combined CSV header"
[ "$(grep -c '^final,' "$work/out/both.csv")" -eq 4 ] || fail "4 rows for final"
[ "$(grep -c '^step-' "$work/out/both.csv")" -eq 4 ] || fail "4 rows for the checkpoint"
ckpt_csv=$(ls "$work"/out/both.step-*.csv 2>/dev/null | head -n 1)
[ -f "$work/out/both.final.csv" ] && [ -n "$ckpt_csv" ] || fail "per-model CSVs: $(ls "$work/out")"
head -n 1 "$work/out/both.final.csv" | grep -qx "tokens,ppl,documents,nll" || fail "per-model CSV header"
cmp -s "$work/out/both.final.csv" "$ckpt_csv" || fail "HF export and checkpoint differ: $(paste -d'|' "$work/out/both.final.csv" "$ckpt_csv")"
awk -F, 'NR > 1 && !($2 > 1 && $2 < 2000 && $3 == 3) { bad = 1 } END { exit bad }' "$work/out/both.final.csv" \
  || fail "ppl not in (1, vocab) or not 3 documents: $(cat "$work/out/both.final.csv")"
head -c 4 "$work/out/both.png" | od -An -c | grep -q "P   N   G" || fail "no PNG chart"
grep -q "eval ppl summary: final: " "$work/both.log" || fail "no summary line"
grep -q "tok/s" "$work/both.log" || fail "no progress or rate"
grep -q "memory: predicted peak" "$work/both.log" || fail "no plan-vs-measured line"

for run in "--sp-size 2 --sp-mode zigzag_ring" "--sp-size 1" "--sp-size 2 --sp-mode ulysses"; do
  name=$(echo "$run" | tr -d ' -')
  # shellcheck disable=SC2086
  "${mpi[@]}" "$bin/easyctx_eval_ppl" --model "$work/run/final" "${common[@]}" $run \
    --output-file "$work/out/$name.csv" > "$work/$name.log" 2>&1 || fail "mpirun $run"
  paste -d, "$work/out/$name.csv" "$work/out/both.final.csv" | awk -F, -v run="$run" '
    NR == 1 { next }
    { d = $2 - $6; if (d < 0) d = -d; if ($1 != $5 || $3 != $7 || d > 1e-5 * $6) { print run ": " $0; bad = 1 } }
    END { exit bad }' || fail "mpirun $run differs from one process"
done

# ckpt:DIR under mpirun: verified once over the ranks (each file by one), the same perplexities.
"${mpi[@]}" "$bin/easyctx_eval_ppl" --model "ckpt:$work/run" "${common[@]}" --output-file "$work/out/ckptmpi.csv" \
  > "$work/ckptmpi.log" 2>&1 || fail "mpirun ckpt:"
paste -d, "$work/out/ckptmpi.csv" "$ckpt_csv" | awk -F, '
  NR == 1 { next }
  { d = $2 - $6; if (d < 0) d = -d; if ($1 != $5 || $3 != $7 || d > 1e-5 * $6) { print "ckpt: " $0; bad = 1 } }
  END { exit bad }' || fail "mpirun ckpt: differs from one process"

# A flipped bit in the checkpoint (the middle of rank-00000.h5's slice_0, where h5dump says its
# bytes are): under mpirun both programs end every rank with exit 2 and one message naming the
# file, the dataset and the checksums (found, expected), no abort.
cp -r "$work/run" "$work/corrupt"
step=$(ls -d "$work"/corrupt/checkpoints/step-* | tail -n 1)
h5=$step/rank-00000.h5
layout=$(h5dump -p -H -d slice_0 "$h5")
off=$(echo "$layout" | grep -o 'OFFSET [0-9]*' | head -n 1 | cut -d' ' -f2)
size=$(echo "$layout" | grep -o 'SIZE [0-9]*' | head -n 1 | cut -d' ' -f2)
[ -n "$off" ] && [ -n "$size" ] || fail "h5dump gave no layout of slice_0: $layout"
at=$((off + size / 2))
byte=$(od -An -tu1 -j "$at" -N1 "$h5" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 16)))" | dd of="$h5" bs=1 seek="$at" conv=notrunc status=none
# Each rank's exit status on a line of its own ("rank R exit S").
each=(bash -c '"$@"; echo "rank ${OMPI_COMM_WORLD_RANK:-?} exit $?"' each)
for app in ppl needle; do
  if [ $app = ppl ]; then
    args=(--model "ckpt:$step" "${common[@]}" --output-file "$work/out/corrupt.csv")
  else
    args=(--model "ckpt:$step" --tokenizer "$tok" --output-dir "$work/corrupt-needle" --task passkey --device cpu
          --min-context-length 100 --max-context-length 100)
  fi
  "${mpi[@]}" "${each[@]}" "$bin/easyctx_eval_$app" "${args[@]}" > "$work/corrupt-$app.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && [ "$(grep -c '^rank [01] exit 2$' "$work/corrupt-$app.log")" -eq 2 ] \
    && [ "$(grep -c 'error:' "$work/corrupt-$app.log")" -eq 1 ] && ! grep -q MPI_ABORT "$work/corrupt-$app.log" \
    && grep -q "error: .*/rank-00000.h5: slice_0 (master/[^)]*) fails its checksum (CRC32 [0-9a-f]\{8\}, index.json records [0-9a-f]\{8\})" \
         "$work/corrupt-$app.log" \
    || fail "easyctx_eval_$app, corrupt checkpoint under mpirun: expected exit 2 on both ranks and one message naming the file and checksums: $(cat "$work/corrupt-$app.log")"
done
[ ! -e "$work/out/corrupt.csv" ] && [ ! -e "$work/corrupt-needle" ] || fail "a corrupt checkpoint wrote output"

# --plan: no data read, no weights loaded.
plan=(--tokenized "$work/nothing" --min-tokens 2 --tokens-step 1 --output-file "$work/out/plan.csv" --plan
      --model random:llama2-7b --device cuda --set target.gpu=H200)
"$bin/easyctx_eval_ppl" "${plan[@]}" --max-tokens 1048576 > "$work/plan.log" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "llama2-7b at 1M on one H200: --plan exited $rc, expected 0"
grep -q "workspace fwd.resid" "$work/plan.log" || fail "no forward workspace in the plan"
grep -q "weights (bf16" "$work/plan.log" || fail "no bf16 weights in the plan"
tail -n 1 "$work/plan.log" | grep -q '^{"fits":true' || fail "the last line is not the JSON plan"
"$bin/easyctx_eval_ppl" "${plan[@]}" --max-tokens 8388608 > "$work/plan8m.log" 2>&1
rc=$?
[ $rc -eq 3 ] || fail "llama2-7b at 8M on one H200: --plan exited $rc, expected 3"
grep -q "Would fit: .*--sp-size" "$work/plan8m.log" || fail "the refusal names no flag"
"$bin/easyctx_eval_ppl" --model "$work/run/final" "${common[@]}" --sp-size 3 --output-file "$work/out/x.csv" \
  > "$work/bad.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q -- "--sp-size" "$work/bad.log" || fail "--sp-size 3 on one rank: exit $rc, expected 2 naming it"
echo "ok"
