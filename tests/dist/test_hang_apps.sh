#!/usr/bin/env bash
# Nothing hangs in the programs: under `mpirun -np 2`, rank 1 stalls (or dies) before a chosen
# collective of h5tokenize, easyctx_train (start-up, a step's gradient all-reduce, the stop
# check) or easyctx_eval_ppl (EASYCTX_FAULT, dist/watchdog.h). Each run must end every rank
# with a non-zero exit within the timeout (2 s here) plus a few seconds, and say which
# operation, which group and which rank never arrived. Prints the time to the clean exit.
set -euo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-hang.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$work/out" 2>/dev/null; exit 1; }
bound=30  # seconds: the 2 s timeout, the roll call, the abort and mpirun on a loaded machine

source "$src/tests/tiny_data.sh"
tiny_mpirun
tok=$(tiny_data "$bin" "$work" 60)
{
  tiny_stage "$work/data" 64 4
  cat <<YAML
  batch_size: 1
parallel:
  collective_timeout_s: 2
YAML
} > "$work/stage.yaml"

# expect NAME FAULT PATTERN... -- COMMAND...: runs COMMAND with EASYCTX_FAULT=FAULT and a 2 s
# start-up timeout; it must fail within $bound s with every PATTERN in its output.
expect() {
  local name=$1 fault=$2
  shift 2
  local patterns=()
  while [ "$1" != "--" ]; do
    patterns+=("$1")
    shift
  done
  shift
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  EASYCTX_FAULT=$fault EASYCTX_COLLECTIVE_TIMEOUT_S=2 timeout 120 "$@" >"$work/out" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t1" -v b="$t0" 'BEGIN{printf "%.1f", a - b}')
  [ "$rc" -ne 0 ] || fail "$name: exit 0 despite EASYCTX_FAULT=$fault"
  [ "$rc" -ne 124 ] || fail "$name: hung until the outer timeout"
  awk -v s="$secs" -v b="$bound" 'BEGIN{exit !(s < b)}' || fail "$name: took $secs s (bound $bound s)"
  local p
  for p in "${patterns[@]}"; do
    grep -qF -- "$p" "$work/out" || fail "$name: no '$p' in the output"
  done
  printf 'PASS %-52s exit %3d after %5s s\n' "$name" "$rc" "$secs"
}

expect "h5tokenize: rank 1 stalls before the start barrier" "stall:1:start barrier:world" \
  "start barrier on group 'world'" "rank 1 (" "has not reached it" -- \
  "${mpi[@]}" "$bin/h5tokenize" --tokenizer "$tok" --output "$work/data2" "$work/train.jsonl"
expect "h5tokenize: rank 1 stalls before gathering statistics" "stall:1:gather statistics:world" \
  "gather statistics on group 'world'" "rank 1 (" -- \
  "${mpi[@]}" "$bin/h5tokenize" --tokenizer "$tok" --output "$work/data3" "$work/train.jsonl"

train=("${mpi[@]}" "$bin/easyctx_train" "$work/stage.yaml" --resume none)
expect "easyctx_train: rank 1 stalls while loading the config" "stall:1:run_collectively:world" \
  "run_collectively on group 'world'" "rank 1 (" -- "${train[@]}" --set output.dir="$work/t1"
expect "easyctx_train: rank 1 stalls while creating the groups" "stall:1:create group:sp" \
  "MPI_Comm_split (creating the group) on group 'sp'" "on rank 0" -- "${train[@]}" --set output.dir="$work/t2"
expect "easyctx_train: rank 1 stalls before a gradient all-reduce" "stall:1:all_reduce:dp:2" \
  "all_reduce on group 'dp'" "rank 1 (" "has not reached it" -- "${train[@]}" --set output.dir="$work/t3"
expect "easyctx_train: rank 1 stalls before the stop check of step 3" "stall:1:all_reduce_scalar:world:3" \
  "on group 'world'" "rank 1 (" -- "${train[@]}" --set output.dir="$work/t4"
expect "easyctx_train: rank 1 dies (SIGKILL) before a gradient all-reduce" "kill:1:all_reduce:dp:2" \
  "rank 1" -- "${train[@]}" --set output.dir="$work/t5"

# A finished run to evaluate (its Hugging Face export, final/).
"${mpi[@]}" "$bin/easyctx_train" "$work/stage.yaml" --resume none --set output.dir="$work/run" >"$work/out" 2>&1 \
  || fail "the reference run failed"
eval_ppl=("${mpi[@]}" "$bin/easyctx_eval_ppl" --model "$work/run/final" --tokenized "$work/data" --min-tokens 32
          --max-tokens 64 --tokens-step 32 --samples 4 --output-file "$work/ppl.csv" --collective-timeout-s 2)
expect "easyctx_eval_ppl: rank 1 stalls before the reduction" "stall:1:all_reduce:world" \
  "all_reduce on group 'world'" "rank 1 (" "has not reached it" -- "${eval_ppl[@]}"
EASYCTX_COLLECTIVE_TIMEOUT_S=2 "${eval_ppl[@]}" >"$work/out" 2>&1 || fail "easyctx_eval_ppl without a fault failed"
echo "PASS: a stalled or dead rank ends h5tokenize, easyctx_train and easyctx_eval_ppl within the timeout"
