#!/usr/bin/env bash
# Stop signals, every way they arrive (docs/training.md, "Stopping a run"): SIGTERM, SIGINT,
# SIGUSR1 or SIGUSR2 to one rank of `mpirun -np 2 easyctx_train`, SIGUSR2 to mpirun, SIGTERM and
# SIGINT to scripts/mpirun.sh, `timeout --preserve-status` around it, SIGUSR1 and SIGTERM to
# slurm/common.sh's batch shell, SIGTERM to a run without mpirun. Each must commit a checkpoint and exit 0 (130 after SIGINT), and every rank's log
# must name the signal and the rank that received it. Prints the time from the signal to the
# exit for each case.
set -euo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-stop.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
last_log=""
fail() {
  echo "FAIL: $*"
  [ -n "$last_log" ] && { echo "--- $last_log"; tail -30 "$last_log"; }
  exit 1
}

source "$src/tests/tiny_data.sh"
tiny_mpirun
tok=$(tiny_data "$bin" "$work" 100)
{
  tiny_stage "$work/data" 64 100000
  cat <<YAML
  batch_size: 1
logging:
  every: 1
  per_rank: true
output:
  save_every: 0
YAML
} > "$work/stage.yaml"

# Waits until the run logged step 3, so the signal arrives mid-training.
wait_for_steps() {
  local log=$1
  for _ in $(seq 1 900); do
    grep -q "^step 3/" "$log" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$log: the run never reached step 3"
}
# The pid of world rank R among mpirun's children.
rank_pid() {
  local parent=$1 r=$2 c
  for c in $(pgrep -P "$parent"); do
    if tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$r"; then
      echo "$c"
      return 0
    fi
  done
  fail "no rank $r under pid $parent"
}
# check NAME RC EXPECTED_RC "SIG on rank R" OUT_DIR RANKS T0
check() {
  local name=$1 rc=$2 want=$3 what=$4 out=$5 ranks=$6 t0=$7
  local t1
  t1=$(date +%s.%N)
  last_log=$log
  [ "$rc" -eq "$want" ] || fail "$name: exit $rc, expected $want"
  ls "$out/checkpoints" 2>/dev/null | grep -q '^step-' || fail "$name: no committed checkpoint"
  [ ! -f "$out/DONE" ] || fail "$name: a stopped run must not write DONE"
  # Every rank names the same signal and rank ($what is a grep pattern: a signal that mpirun
  # forwards reaches the ranks at slightly different times, so the rank that had it first when
  # they agreed may be any of them).
  local r line first=""
  for r in $(seq 0 $((ranks - 1))); do
    line=$(grep -o "stop requested ($what): checkpoint of step [0-9]* committed" "$out/logs/rank$r.log" || true)
    [ -n "$line" ] || { last_log=$out/logs/rank$r.log; fail "$name: rank $r's log does not say 'stop requested ($what)'"; }
    [ -z "$first" ] || [ "$line" = "$first" ] || fail "$name: the ranks disagree: '$first' / '$line'"
    first=$line
  done
  what=${first#stop requested (}
  what=${what%%)*}
  printf 'PASS %-44s exit %3d, %s, %.1f s from the signal to the exit\n' "$name" "$rc" "$what" \
    "$(awk -v a="$t1" -v b="$t0" 'BEGIN{printf "%.3f", a - b}')"
}

# Signals to one rank, and SIGUSR2 to mpirun.
for c in "TERM 1 0" "INT 0 130" "USR1 1 0" "USR2 mpirun 0"; do
  read -r sig target want <<<"$c"
  out=$work/run-$sig
  log=$work/$sig.log
  mpirun "${mpi_args[@]}" "$bin/easyctx_train" "$work/stage.yaml" --set output.dir="$out" --resume none >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_for_steps "$log"
  t0=$(date +%s.%N)
  if [ "$target" = mpirun ]; then kill -"$sig" "$pid"; what="SIG$sig on rank [01]"
  else kill -"$sig" "$(rank_pid "$pid" "$target")"; what="SIG$sig on rank $target"; fi
  rc=0
  wait "$pid" || rc=$?
  check "SIG$sig to $( [ "$target" = mpirun ] && echo mpirun || echo "rank $target")" "$rc" "$want" "$what" "$out" 2 "$t0"
done

# scripts/mpirun.sh: SIGTERM and SIGINT (Ctrl-C) become SIGUSR1 for mpirun.
for c in "TERM 0" "INT 130"; do
  read -r sig want <<<"$c"
  out=$work/wrap-$sig
  log=$work/wrap-$sig.log
  # (a background job of a script starts with SIGINT ignored: restore it, as in a terminal)
  env --default-signal=INT bash "$src/scripts/mpirun.sh" "${mpi_args[@]}" "$bin/easyctx_train" "$work/stage.yaml" \
    --set output.dir="$out" --resume none >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_for_steps "$log"
  t0=$(date +%s.%N)
  kill -"$sig" "$pid"
  rc=0
  wait "$pid" || rc=$?
  check "SIG$sig to scripts/mpirun.sh" "$rc" "$want" "SIGUSR1 on rank [01]" "$out" 2 "$t0"
done

# timeout --preserve-status around scripts/mpirun.sh: its SIGTERM to the process group.
out=$work/timeout
log=$work/timeout.log
t0=$(date +%s.%N)
rc=0
timeout --preserve-status 12 bash "$src/scripts/mpirun.sh" "${mpi_args[@]}" "$bin/easyctx_train" "$work/stage.yaml" \
  --set output.dir="$out" --resume none >"$log" 2>&1 || rc=$?
grep -q "^step 3/" "$log" || fail "timeout: the run did not reach step 3 in 12 s"
check "timeout --preserve-status 12 scripts/mpirun.sh" "$rc" 0 "SIGUSR1 on rank [01]" "$out" 2 "$(awk -v a="$t0" 'BEGIN{printf "%.3f", a + 12}')"

# slurm/common.sh's run_stage as the batch shell of a job (no Slurm needed): SIGUSR1 (the time
# limit) and SIGTERM (scancel --batch --signal=TERM) become SIGUSR1 for mpirun.
for sig in USR1 TERM; do
  out=$work/slurm-$sig
  log=$work/slurm-$sig.log
  env --default-signal=INT SLURM_NTASKS=2 SLURM_JOB_NUM_NODES=1 EASYCTX_ROOT="$src" EASYCTX_BIN="$bin" \
    bash -c 'source "$EASYCTX_ROOT/slurm/common.sh"; run_stage "$@"' run_stage "$work/stage.yaml" \
    --set output.dir="$out" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_for_steps "$log"
  t0=$(date +%s.%N)
  kill -"$sig" "$pid"
  rc=0
  wait "$pid" || rc=$?
  check "SIG$sig to slurm/common.sh's batch shell" "$rc" 0 "SIGUSR1 on rank [01]" "$out" 2 "$t0"
done

# One process, no mpirun.
out=$work/single
log=$work/single.log
"$bin/easyctx_train" "$work/stage.yaml" --set output.dir="$out" --resume none >"$log" 2>&1 &
pid=$!
pids+=("$pid")
wait_for_steps "$log"
t0=$(date +%s.%N)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
check "SIGTERM to easyctx_train (no mpirun)" "$rc" 0 "SIGTERM on rank 0" "$out" 1 "$t0"
echo "PASS: every stop signal commits a checkpoint and exits 0 (130 after SIGINT), naming the signal on every rank"
