# Shared by the sbatch scripts: runs one easyctx stage under Slurm with mpirun, one process
# per GPU, and stops with a checkpoint instead of being killed:
# - the time limit: Slurm sends SIGUSR1 (--signal=B:USR1@300) to this shell, which forwards it
#   to mpirun (Open MPI relays SIGUSR1 to every rank); the ranks commit a checkpoint at the
#   next step boundary and exit 0, and the job requeues itself unless the stage wrote DONE;
#   the next run resumes from the newest committed checkpoint (--resume auto);
# - SIGTERM to this shell (`scancel --batch --signal=TERM JOB`): forwarded as SIGUSR1 too
#   (mpirun would kill the ranks 1 s after a SIGTERM of its own), checkpoint, no requeue.
# A plain `scancel JOB` or a preemption signals every process of the job at once, mpirun
# included, which then kills the ranks within 2 s: stop with `scancel --batch --signal=USR1`
# (requeues) or `--signal=TERM` (stops) instead (docs/training.md, "Stopping a run").
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
  # A session of its own (setsid): signals meant for this shell's process group stay here.
  local launch=()
  command -v setsid >/dev/null && launch=(setsid)
  "${launch[@]}" mpirun "${flags[@]}" "$EASYCTX_BIN/easyctx_train" "$stage" "$@" --resume auto </dev/null &
  local pid=$!
  stop_by=""
  trap 'stop_by=USR1; echo "easyctx: SIGUSR1 (time limit near): checkpointing, then requeueing"; kill -USR1 $pid' USR1
  trap 'stop_by=TERM; echo "easyctx: SIGTERM: checkpointing, then stopping"; kill -USR1 $pid' TERM
  # A trapped signal interrupts `wait`: wait again until mpirun itself has exited.
  local rc=0
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid" || true
  done
  wait "$pid" && rc=0 || rc=$?
  trap - USR1 TERM
  if [ -f "$out_dir/DONE" ]; then
    echo "easyctx: stage finished ($out_dir/DONE)"
    return 0
  fi
  if [ "$stop_by" = TERM ]; then
    echo "easyctx: stopped by SIGTERM (exit $rc); resubmit to continue from the checkpoint"
    return "$rc"
  fi
  if [ "$rc" -eq 0 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "easyctx: checkpoint written, requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    return 0
  fi
  return "$rc"
}
