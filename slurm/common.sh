# Shared by the sbatch scripts: runs one easyctx stage under Slurm with mpirun, one process
# per GPU, and survives the time limit: Slurm sends SIGUSR1 (--signal=B:USR1@300) to this
# shell, which forwards it to mpirun (Open MPI relays it to every rank); the ranks write a
# checkpoint and exit 0, and the job requeues itself unless the stage wrote DONE. The next
# run resumes from the newest committed checkpoint (--resume auto).
#
# usage (inside an sbatch script): run_stage STAGE.yaml [--set key=value ...]
set -euo pipefail

EASYCTX_ROOT=${EASYCTX_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
EASYCTX_BIN=${EASYCTX_BIN:-$EASYCTX_ROOT/build/bin}

run_stage() {
  local stage=$1
  shift
  local ntasks=${SLURM_NTASKS:-1}
  local out_dir
  out_dir=$("$EASYCTX_BIN/easyctx_train" "$stage" "$@" --print-config | awk '/^output:/{o=1} o && /^  dir:/{print $2; exit}')
  out_dir=${out_dir//\"/}
  mkdir -p "$out_dir"
  echo "easyctx: stage $stage on $ntasks ranks ($SLURM_JOB_NUM_NODES nodes), output $out_dir"
  local flags=(-np "$ntasks" --bind-to none)
  [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
  local v
  for v in PATH LD_LIBRARY_PATH OMP_NUM_THREADS OMP_WAIT_POLICY NCCL_DEBUG NCCL_IB_HCA NCCL_SOCKET_IFNAME; do
    [ -n "${!v:-}" ] && flags+=(-x "$v")
  done
  mpirun "${flags[@]}" "$EASYCTX_BIN/easyctx_train" "$stage" "$@" --resume auto &
  local pid=$!
  trap 'echo "easyctx: time limit near, checkpointing"; kill -USR1 $pid' USR1
  trap 'kill -TERM $pid' TERM
  # A trapped signal interrupts `wait`: wait again until mpirun itself has exited.
  local rc=0
  while :; do
    wait "$pid" && rc=0 || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - USR1 TERM
  if [ -f "$out_dir/DONE" ]; then
    echo "easyctx: stage finished ($out_dir/DONE)"
    return 0
  fi
  if [ "$rc" -eq 0 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "easyctx: checkpoint written, requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    return 0
  fi
  return "$rc"
}
