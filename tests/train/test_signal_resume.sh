#!/usr/bin/env bash
# SIGUSR1 to a running `mpirun -np 2 easyctx_train`: every rank commits a checkpoint and the
# job exits 0; `--resume auto` then continues the same loss curve as an uninterrupted run
# (metrics.jsonl identical, bit for bit, step by step).
set -euo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-signal.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; tail -30 "$work"/*.log 2>/dev/null; trap - EXIT; exit 1; }

source "$src/tests/tiny_data.sh"
tiny_mpirun
tok=$(tiny_data "$bin" "$work" 200)
{
  tiny_stage "$work/data" 96 40
  cat <<YAML
  batch_size: 2
  lr: 3e-3
  warmup_steps: 4
  schedule: cosine
logging:
  every: 1
YAML
} > "$work/stage.yaml"
# Uninterrupted reference.
"${mpi[@]}" "$bin/easyctx_train" "$work/stage.yaml" --set output.dir="$work/straight" > "$work/straight.log" 2>&1 \
  || fail "the reference run failed"
# Interrupted run: SIGUSR1 once step 8 is logged.
"${mpi[@]}" "$bin/easyctx_train" "$work/stage.yaml" --set output.dir="$work/run" > "$work/run1.log" 2>&1 &
pid=$!
for i in $(seq 1 600); do
  grep -q "^step 8/40" "$work/run1.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "^step 8/40" "$work/run1.log" || fail "the run never reached step 8"
t0=$(date +%s)
kill -USR1 $pid
rc=0
wait $pid || rc=$?
t1=$(date +%s)
[ "$rc" -eq 0 ] || fail "the signalled run exited $rc, expected 0"
grep -q "stop requested" "$work/run1.log" || fail "no checkpoint on SIGUSR1"
[ ! -f "$work/run/DONE" ] || fail "a stopped run must not write DONE"
echo "stopped within $((t1 - t0)) s of SIGUSR1"
"${mpi[@]}" "$bin/easyctx_train" "$work/stage.yaml" --set output.dir="$work/run" --resume auto > "$work/run2.log" 2>&1 \
  || fail "the resumed run failed"
grep -q "resuming from" "$work/run2.log" || fail "the second run did not resume"
[ -f "$work/run/DONE" ] || fail "no DONE after the resumed run"
# Same curve: drop wall-clock fields, compare step/loss/lr/grad_norm/tokens exactly.
strip() { sed -E 's/,"(tokens_per_s|fwd_bwd_s|elapsed|mfu|peak_mem_gib|host_peak_gib)":[^,}]*//g' "$1"; }
diff <(strip "$work/straight/metrics.jsonl") <(strip "$work/run/metrics.jsonl") > "$work/diff.log" \
  || fail "the resumed loss curve differs from the uninterrupted one: $(head -4 "$work/diff.log")"
echo "PASS: SIGUSR1 -> checkpoint + exit 0; --resume auto continues the same 40-step curve bit for bit"
