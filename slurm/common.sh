# Shared by the sbatch scripts (stage.sbatch, export.sbatch, train_1m_16xA100.sh, train_700k_8xA100.sh) and the
# recipe chains (recipe_llama2_7b_1m.sh, recipe_llama3_8b_1m.sh). docs/recipes.md, "Slurm".
#
# run_stage STAGE.yaml [--set key=value ...]   (inside an sbatch script)
#   Finds the programs (or builds them), checks the stage for this job's world on one process
#   (easyctx_train --print-config with the job's nodes and tasks: output folder, device, a layout
#   that fits the ranks), prints the stage's memory plan to the log, then runs
#   it with mpirun, one process per task (per GPU), --resume auto. It stops with a checkpoint
#   instead of being killed:
#   - the time limit: Slurm sends SIGUSR1 (--signal=B:USR1@300) to this shell, which forwards it
#     to mpirun (Open MPI relays SIGUSR1 to every rank); the ranks commit a checkpoint at the
#     next step boundary and exit 0, and the job requeues itself unless the stage wrote DONE;
#     the next run resumes from the newest committed checkpoint (--resume auto);
#   - SIGTERM to this shell (`scancel --batch --signal=TERM JOB`): forwarded as SIGUSR1 too
#     (mpirun would kill the ranks 1 s after a SIGTERM of its own), checkpoint, no requeue.
#   A plain `scancel JOB` or a preemption signals every process of the job at once, mpirun
#   included, which then kills the ranks within 2 s: stop with `scancel --batch --signal=USR1`
#   (requeues) or `--signal=TERM` (stops) instead (docs/training.md, "Stopping a run").
#   A stage that fails says so in the job's log and exits non-zero: jobs submitted after it
#   with afterok (the chain's later stages) never start.
#
# submit_chain "RECIPE_DIR ..." [--gpus N] [--recipe DIR] [--final-rope-theta X] [sbatch flags]
#              [-- --set key=value ...]   (on the submit node)
#   Picks the recipe folder sized for the chain's world (each folder's recipe.conf: nodes x
#   gpus_per_node): the world is --gpus N, else EASYCTX_NODES x EASYCTX_TASKS_PER_NODE, else the
#   Slurm allocation the script runs in, else 2 x 8. --recipe DIR picks one by name instead. A
#   world no folder is sized for is refused: the stages' tokens per optimizer step assume their
#   folder's world (only --set flags that size them, data.seq_length, train.batch_size,
#   train.grad_accum or parallel.sequence.size, let --recipe run on another).
#   Submits the folder's s*.yaml as a chain of stage.sbatch jobs (afterok), each stage starting
#   from the previous one's last checkpoint (model.init: ckpt:<its output.dir>). Run again, it
#   skips the stages that finished (DONE) and those with a job still queued or running (your
#   jobs whose --comment is easyctx:<the stage's output.dir>, which every chain job carries):
#   the stages after them wait for that job, so nothing is trained twice.
#   --final-rope-theta X: EasyContext's last step, one more job after the last stage
#   (slurm/export.sbatch, export_final): its last checkpoint exported as a Hugging Face model
#   with rope_theta X in config.json, into <the last stage's output folder>-rope-theta-X.
#
# export_final RUN_DIR OUT_DIR THETA   (inside an sbatch script)
#   easyctx_convert --from ckpt:RUN_DIR --to hf:OUT_DIR --rope-theta THETA, written beside
#   OUT_DIR first and renamed when config.json reads THETA back; an existing OUT_DIR is kept.
#
# Environment (all optional):
#   EASYCTX_ROOT   the checkout (default: the one this file is in)
#   EASYCTX_BIN    the programs (default: $EASYCTX_ROOT/build/bin)
#   EASYCTX_BUILD  auto (default): no programs -> bash scripts/build.sh (CUDA required unless
#                  EASYCTX_DEVICE=cpu); no: stop with a message saying how to build
#   EASYCTX_BUILD_FLAGS  extra CMake flags for that build
#   EASYCTX_DEVICE cpu: run on the CPU backend (train.device=cpu, ZeRO's host offloads off: on
#                  the CPU the optimizer is in host memory already), the scale-down for tests;
#                  cuda: train.device=cuda. Default: the stage file's (cuda in the recipes).
#   chains only: EASYCTX_NODES (2), EASYCTX_TASKS_PER_NODE (8: one rank per GPU; with --gpus N:
#   N up to 8, else 8),
#   EASYCTX_CPUS_PER_TASK (8), EASYCTX_STAGES (all; e.g. s1,s2,s3), EASYCTX_OUT (a folder for
#   the stages' output folders; default the stage files' output.dir), EASYCTX_INIT (the first
#   stage's model.init), EASYCTX_LENGTHS (pow2, default; easycontext: 256000 and 512000
#   instead of 262144 and 524288), EASYCTX_DRY_RUN=1 (check every stage and print the sbatch
#   commands instead of submitting them).
set -euo pipefail

EASYCTX_ROOT=${EASYCTX_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}

# Open MPI's session directory, one per job: MPI programs of one user on a node share
# /tmp/ompi.<host>.<uid>, and one that finishes may remove it while another job's starts
# ("orte_init failed ... orte_session_dir failed", seen when a chain's next stage began as
# another MPI program ended). A base of the job's own (Open MPI 4: orte_tmpdir_base; 5:
# prte_tmpdir_base) takes the jobs out of each other's way. One you set is kept.
if [ -n "${SLURM_JOB_ID:-}" ] && [ -z "${OMPI_MCA_orte_tmpdir_base:-}" ]; then
  export OMPI_MCA_orte_tmpdir_base="${TMPDIR:-/tmp}/easyctx-ompi-$SLURM_JOB_ID"
  export PRTE_MCA_prte_tmpdir_base=$OMPI_MCA_orte_tmpdir_base
  mkdir -p "$OMPI_MCA_orte_tmpdir_base"
fi

# An error: one line in the log, and in a job, what it means for the jobs after it.
easyctx_die() {
  echo "easyctx: error: $*" >&2
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "easyctx: job $SLURM_JOB_ID stops here; jobs that wait for it with afterok (the recipe chain's later stages) will not start" >&2
  fi
  exit 2
}

# The --set flags EASYCTX_DEVICE stands for.
easyctx_device_sets() {
  EASYCTX_DEVICE_SETS=()
  case ${EASYCTX_DEVICE:-} in
    "") ;;
    cpu) EASYCTX_DEVICE_SETS=(--set train.device=cpu --set parallel.zero.offload_optimizer=false
                              --set parallel.zero.offload_params=false) ;;
    cuda) EASYCTX_DEVICE_SETS=(--set train.device=cuda) ;;
    *) easyctx_die "EASYCTX_DEVICE=$EASYCTX_DEVICE: expected cpu or cuda (or unset: the stage file's train.device)" ;;
  esac
}

# Sets EASYCTX_BIN to a folder holding easyctx_train: EASYCTX_BIN, else $EASYCTX_ROOT/build/bin,
# else builds it there (EASYCTX_BUILD=auto) or stops saying how to build.
easyctx_find_programs() {
  if [ -n "${EASYCTX_BIN:-}" ]; then
    [ -x "$EASYCTX_BIN/easyctx_train" ] || easyctx_die "EASYCTX_BIN=$EASYCTX_BIN holds no easyctx_train: set it to" \
      "the bin folder of a build, or unset it to use (or build) $EASYCTX_ROOT/build/bin"
    return 0
  fi
  EASYCTX_BIN=$EASYCTX_ROOT/build/bin
  [ -x "$EASYCTX_BIN/easyctx_train" ] && return 0
  local flags=(-DEASYCTX_CUDA=ON) extra=()
  [ "${EASYCTX_DEVICE:-}" = cpu ] && flags=()
  read -r -a extra <<< "${EASYCTX_BUILD_FLAGS:-}"
  local cmd="bash scripts/build.sh"
  [ ${#flags[@]} -eq 0 ] || cmd+=" ${flags[*]}"
  [ ${#extra[@]} -eq 0 ] || cmd+=" ${extra[*]}"
  local how="cd $EASYCTX_ROOT && $cmd (with the CUDA toolkit, cuDNN, NCCL"
  how+=" and MPI in the environment, e.g. after your cluster's module load; the programs land in build/bin),"
  how+=" or set EASYCTX_BIN to the bin folder of a build"
  case ${EASYCTX_BUILD:-auto} in
    auto) ;;
    no) easyctx_die "no easyctx programs: $EASYCTX_BIN/easyctx_train does not exist (EASYCTX_BUILD=no). Build them: $how" ;;
    *) easyctx_die "EASYCTX_BUILD=$EASYCTX_BUILD: expected auto or no" ;;
  esac
  mkdir -p "$EASYCTX_ROOT/build"
  local log=$EASYCTX_ROOT/build/easyctx-build.log
  echo "easyctx: no programs in $EASYCTX_BIN: building them on $(hostname) ($cmd; log $log)"
  # One build at a time (two jobs of a chain, or a job and the submit node, may both try).
  if ! (
    flock 9
    [ -x "$EASYCTX_BIN/easyctx_train" ] || BUILD_DIR=build bash "$EASYCTX_ROOT/scripts/build.sh" "${flags[@]}" "${extra[@]}" > "$log" 2>&1
  ) 9> "$EASYCTX_ROOT/build/.easyctx-build.lock"; then
    tail -n 15 "$log" >&2
    easyctx_die "the build failed (the end of $log is above). Build by hand: $how"
  fi
  [ -x "$EASYCTX_BIN/easyctx_train" ] || easyctx_die "the build finished without $EASYCTX_BIN/easyctx_train (see $log)"
  echo "easyctx: built $EASYCTX_BIN"
}

# cfg_value SECTION KEY: the value of SECTION.KEY in --print-config's output on stdin.
easyctx_cfg_value() {
  awk -v s="$1:" -v k="  $2: " '$0 == s { o = 1; next } /^[^ ]/ { o = 0 }
    o && index($0, k) == 1 { v = substr($0, length(k) + 1); gsub(/"/, "", v); print v; exit }'
}

# easyctx_check_stage NODES TASKS STAGE.yaml [--set ...]: the stage as it will run on NODES
# nodes with TASKS ranks, on one process. Sets EASYCTX_STAGE_CFG (the resolved config and
# layout), EASYCTX_STAGE_OUT (output.dir, absolute) and EASYCTX_STAGE_DEVICE; stops with the
# trainer's error when the config is refused, or when a GPU stage meets a CPU-only build.
easyctx_check_stage() {
  local nodes=$1 tasks=$2 stage=$3
  shift 2
  local per_node=$((tasks / nodes))
  # (an uneven spread: one node of all the ranks; only the layout's node split differs)
  [ $((per_node * nodes)) -eq "$tasks" ] || { nodes=1; per_node=$tasks; }
  local err
  err=$(mktemp)
  if ! EASYCTX_STAGE_CFG=$("$EASYCTX_BIN/easyctx_train" "$@" --print-config --set target.nodes="$nodes" \
        --set target.gpus_per_node="$per_node" 2>"$err"); then
    cat "$err" >&2
    rm -f "$err"
    easyctx_die "$stage is refused for $tasks rank(s) on $nodes node(s) (the trainer's message is above)"
  fi
  rm -f "$err"
  EASYCTX_STAGE_OUT=$(easyctx_cfg_value output dir <<< "$EASYCTX_STAGE_CFG")
  EASYCTX_STAGE_DEVICE=$(easyctx_cfg_value train device <<< "$EASYCTX_STAGE_CFG")
  [ -n "$EASYCTX_STAGE_OUT" ] || easyctx_die "$stage: no output.dir in easyctx_train --print-config's output"
  [[ $EASYCTX_STAGE_OUT = /* ]] || EASYCTX_STAGE_OUT=$(pwd)/$EASYCTX_STAGE_OUT
  local build
  build=$(grep '^# this build: ' <<< "$EASYCTX_STAGE_CFG" || true)
  if [ "$EASYCTX_STAGE_DEVICE" = cuda ]; then
    case $build in
      *"CPU only"*)
        easyctx_die "$stage runs on GPUs (train.device: cuda), but $EASYCTX_BIN/easyctx_train was built without the" \
          "CUDA backend (the CUDA toolkit, cuDNN or NCCL was not found when it was configured). Rebuild where they" \
          "are: cd $EASYCTX_ROOT && rm -rf build && bash scripts/build.sh -DEASYCTX_CUDA=ON, or set EASYCTX_BIN to" \
          "a CUDA build. A scaled-down run on the CPU sets EASYCTX_DEVICE=cpu." ;;
      *" 0 CUDA device(s)"*)
        # Only a job needs its GPUs here; the submit node need not have any.
        [ -z "${SLURM_JOB_ID:-}" ] || [ "${EASYCTX_SUBMIT_SIDE:-0}" = 1 ] ||
          easyctx_die "$stage runs on GPUs (train.device: cuda), but no CUDA device is visible in job" \
            "$SLURM_JOB_ID on $(hostname): ask for them (--gpus-per-node=8, as the recipe scripts do), or run on" \
            "the CPU with EASYCTX_DEVICE=cpu" ;;
    esac
  fi
}

run_stage() {
  local stage=${1:?usage: run_stage STAGE.yaml [--set key=value ...]}
  shift
  [ -f "$stage" ] || easyctx_die "stage file $stage not found (relative paths start in $(pwd))"
  # A stop signal while the programs build or the stage is checked: acted on once that is done.
  stop_by=""
  trap 'stop_by=USR1' USR1
  trap 'stop_by=TERM' TERM
  easyctx_device_sets
  easyctx_find_programs
  local ntasks=${SLURM_NTASKS:-${SLURM_JOB_NUM_NODES:-1}} nodes=${SLURM_JOB_NUM_NODES:-1}
  # EASYCTX_DEVICE first: --set flags given to the script win.
  local args=("$stage" "${EASYCTX_DEVICE_SETS[@]}" "$@")
  easyctx_check_stage "$nodes" "$ntasks" "${args[@]}"
  local out_dir=$EASYCTX_STAGE_OUT
  mkdir -p "$out_dir"
  echo "easyctx: stage $stage on $ntasks rank(s), $nodes node(s), train.device $EASYCTX_STAGE_DEVICE," \
       "output $out_dir (job ${SLURM_JOB_ID:-none}, start $((${SLURM_RESTART_COUNT:-0} + 1)), programs $EASYCTX_BIN)"
  # The memory plan of this layout, for the job's log (the trainer itself writes it to
  # <output.dir>/plan.json for easyctx_report when the run starts).
  local per_node=$((ntasks / nodes)) plan rc=0
  [ $((per_node * nodes)) -eq "$ntasks" ] || { nodes=1; per_node=$ntasks; }
  plan=$("$EASYCTX_BIN/easyctx_train" "${args[@]}" --plan --set target.nodes="$nodes" \
         --set target.gpus_per_node="$per_node" 2>&1) || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ]; then
    grep -E ' peak .*(fits|does not fit)' <<< "$plan" | sed 's/^ */easyctx: memory plan: /' || true
  else
    echo "easyctx: no memory plan (easyctx_train --plan exit $rc: $(tail -n 1 <<< "$plan"))"
  fi
  case $stop_by in
    USR1) echo "easyctx: SIGUSR1 before the stage started: requeueing job ${SLURM_JOB_ID:-}"
          [ -z "${SLURM_JOB_ID:-}" ] || scontrol requeue "$SLURM_JOB_ID"
          return 0 ;;
    TERM) echo "easyctx: SIGTERM before the stage started: stopping"
          return 143 ;;
  esac
  local flags=(-np "$ntasks" --bind-to none)
  [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
  local v
  for v in PATH LD_LIBRARY_PATH OMP_NUM_THREADS OMP_WAIT_POLICY NCCL_DEBUG NCCL_IB_HCA NCCL_SOCKET_IFNAME; do
    [ -n "${!v:-}" ] && flags+=(-x "$v")
  done
  # A session of its own (setsid): signals meant for this shell's process group stay here.
  local launch=()
  command -v setsid >/dev/null && launch=(setsid)
  "${launch[@]}" mpirun "${flags[@]}" "$EASYCTX_BIN/easyctx_train" "${args[@]}" --resume auto </dev/null &
  local pid=$!
  trap 'stop_by=USR1; echo "easyctx: SIGUSR1 (time limit near): checkpointing, then requeueing"; kill -USR1 $pid' USR1
  trap 'stop_by=TERM; echo "easyctx: SIGTERM: checkpointing, then stopping"; kill -USR1 $pid' TERM
  # A trapped signal interrupts `wait`: wait again until mpirun itself has exited.
  rc=0
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
    echo "easyctx: stopped by SIGTERM (exit $rc), not requeued; resubmit to continue from the checkpoint"
    return "$rc"
  fi
  if [ "$rc" -eq 0 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "easyctx: checkpoint written, requeueing job $SLURM_JOB_ID (it resumes from the checkpoint)"
    scontrol requeue "$SLURM_JOB_ID"
    return 0
  fi
  echo "easyctx: error: stage $stage failed (mpirun exit $rc; the trainer's message is above). Jobs that wait" \
       "for job ${SLURM_JOB_ID:-?} with afterok (the recipe chain's later stages) will not start. Fix the cause and" \
       "submit again: the stage resumes from its last checkpoint, and the chain scripts skip finished stages." >&2
  return "$rc"
}

# export_final RUN_DIR OUT_DIR THETA: see the top of this file.
export_final() {
  local run=${1:?usage: export_final RUN_DIR OUT_DIR THETA} out=${2:?usage: export_final RUN_DIR OUT_DIR THETA}
  local theta=${3:?usage: export_final RUN_DIR OUT_DIR THETA}
  easyctx_find_programs
  [ -x "$EASYCTX_BIN/easyctx_convert" ] || easyctx_die "$EASYCTX_BIN holds no easyctx_convert: rebuild (scripts/build.sh)"
  [ -f "$run/DONE" ] || easyctx_die "$run/DONE not found: the last stage has not finished, nothing to export"
  if [ -e "$out" ]; then
    [ -f "$out/config.json" ] || easyctx_die "$out exists but holds no config.json: not overwritten (remove it to export again)"
    echo "easyctx: $out exists already: kept, not exported again"
    return 0
  fi
  # Written beside the output first: an interrupted export leaves no folder that looks finished.
  local tmp=$out.partial-${SLURM_JOB_ID:-$$}
  rm -rf "$tmp"
  echo "easyctx: exporting $run with rope_theta $theta to $out (job ${SLURM_JOB_ID:-none}, programs $EASYCTX_BIN)"
  "$EASYCTX_BIN/easyctx_convert" --from "ckpt:$run" --to "hf:$tmp" --rope-theta "$theta" ||
    easyctx_die "easyctx_convert --from ckpt:$run --to hf:$tmp --rope-theta $theta failed (its message is above)"
  local got
  got=$(sed -nE 's/.*"rope_theta":[[:space:]]*([0-9.eE+-]+).*/\1/p' "$tmp/config.json" | head -n 1)
  awk -v a="$got" -v b="$theta" 'BEGIN { exit !(a != "" && a + 0 == b + 0) }' ||
    easyctx_die "$tmp/config.json: rope_theta is '$got', expected $theta"
  mv "$tmp" "$out"
  echo "easyctx: exported: $out (config.json rope_theta $got)"
}

# The id of your queued or running job for a stage's output folder (its --comment), if any.
easyctx_queued_job() {
  command -v squeue >/dev/null 2>&1 || return 0
  # (no answer from slurmctld, e.g. a dry run off the cluster: no job, not an error)
  { squeue --me -h -o '%i|%k' 2>/dev/null || true; } | awk -F'|' -v c="easyctx:$1" '$2 == c { print $1; exit }'
}

# easyctx_conf_value FILE KEY: sets EASYCTX_CONF_VALUE to the positive whole number after "KEY:"
# in a recipe.conf (not printed: an error must stop the script, not a command substitution).
easyctx_conf_value() {
  local v
  [ -f "$1" ] || easyctx_die "$1 not found: a recipe folder says the world its stages are sized for there" \
    "(nodes: N and gpus_per_node: G, one per line)"
  v=$(sed -nE "s/^$2:[[:space:]]*([^[:space:]#]*).*/\1/p" "$1" | head -n 1)
  [[ $v =~ ^[1-9][0-9]*$ ]] || easyctx_die "$1: $2: expected a positive whole number, got '$v'"
  EASYCTX_CONF_VALUE=$v
}

# easyctx_recipe_world DIR: sets EASYCTX_RECIPE_NODES, EASYCTX_RECIPE_GPN from DIR/recipe.conf.
easyctx_recipe_world() {
  easyctx_conf_value "$1/recipe.conf" nodes
  EASYCTX_RECIPE_NODES=$EASYCTX_CONF_VALUE
  easyctx_conf_value "$1/recipe.conf" gpus_per_node
  EASYCTX_RECIPE_GPN=$EASYCTX_CONF_VALUE
}

# easyctx_chain_world GPUS: sets EASYCTX_CHAIN_NODES, EASYCTX_CHAIN_TPN (tasks = GPUs per node)
# and EASYCTX_CHAIN_FROM (where they came from): --gpus, EASYCTX_NODES x EASYCTX_TASKS_PER_NODE,
# the allocation this script runs in, or the default 2 x 8.
easyctx_chain_world() {
  local gpus=$1 v nodes tpn
  for v in EASYCTX_NODES EASYCTX_TASKS_PER_NODE EASYCTX_CPUS_PER_TASK; do
    [ -z "${!v:-}" ] || [[ ${!v} =~ ^[1-9][0-9]*$ ]] || easyctx_die "$v=${!v}: expected a positive whole number"
  done
  if [ -n "$gpus" ]; then
    [[ $gpus =~ ^[1-9][0-9]*$ ]] || easyctx_die "--gpus $gpus: expected the chain's number of GPUs, a positive whole number (8, 16)"
    tpn=${EASYCTX_TASKS_PER_NODE:-$((gpus < 8 ? gpus : 8))}
    [ $((gpus % tpn)) -eq 0 ] || easyctx_die "--gpus $gpus: not a whole number of nodes of $tpn GPUs" \
      "(EASYCTX_TASKS_PER_NODE, default 8): ask for a multiple of $tpn"
    nodes=$((gpus / tpn))
    [ -z "${EASYCTX_NODES:-}" ] || [ "$EASYCTX_NODES" = "$nodes" ] ||
      easyctx_die "--gpus $gpus is $nodes node(s) x $tpn, but EASYCTX_NODES=$EASYCTX_NODES: give one or the other"
    EASYCTX_CHAIN_FROM="--gpus $gpus"
  elif [ -n "${EASYCTX_NODES:-}${EASYCTX_TASKS_PER_NODE:-}" ]; then
    nodes=${EASYCTX_NODES:-2} tpn=${EASYCTX_TASKS_PER_NODE:-8}
    EASYCTX_CHAIN_FROM="EASYCTX_NODES x EASYCTX_TASKS_PER_NODE"
  else
    nodes=2 tpn=8 EASYCTX_CHAIN_FROM="the default 2 nodes x 8"
    # Inside an allocation (salloc -N1 --ntasks-per-node=8 --gpus-per-node=8 bash slurm/...):
    # the stages get its shape.
    if [ -n "${SLURM_JOB_ID:-}" ] && [[ ${SLURM_JOB_NUM_NODES:-} =~ ^[1-9][0-9]*$ ]]; then
      local per=${SLURM_NTASKS_PER_NODE:-}
      per=${per%%(*}
      [[ $per =~ ^[1-9][0-9]*$ ]] || per=${SLURM_GPUS_ON_NODE:-}
      if [[ $per =~ ^[1-9][0-9]*$ ]]; then
        nodes=$SLURM_JOB_NUM_NODES tpn=$per
        EASYCTX_CHAIN_FROM="the allocation of job $SLURM_JOB_ID"
      fi
    fi
  fi
  EASYCTX_CHAIN_NODES=$nodes EASYCTX_CHAIN_TPN=$tpn
}

# submit_chain "RECIPE_DIR ..." [--gpus N] [--recipe DIR] [--final-rope-theta X] [sbatch flags]
#   [-- --set key=value ...]: see the top of this file.
submit_chain() {
  local recipes=${1:?usage: submit_chain \"RECIPE_DIR ...\" [--gpus N] [--recipe DIR] [--final-rope-theta X] [sbatch flags] [-- --set key=value ...]}
  shift
  local sb=() user=() a after=0 gpus="" pick="" theta=""
  while [ $# -gt 0 ]; do
    a=$1
    shift
    if [ "$after" = 1 ]; then user+=("$a"); continue; fi
    case $a in
      --) after=1 ;;
      --gpus=*) gpus=${a#*=} ;;
      --recipe=*) pick=${a#*=} ;;
      --final-rope-theta=*) theta=${a#*=} ;;
      --gpus|--recipe|--final-rope-theta)
        if [ $# -eq 0 ] || [ "$1" = -- ]; then
          case $a in
            --gpus) easyctx_die "--gpus: expected the chain's number of GPUs (--gpus 8)" ;;
            --recipe) easyctx_die "--recipe: expected a recipe folder (--recipe llama2-7b-1m-8gpu)" ;;
            *) easyctx_die "--final-rope-theta: expected a positive number (--final-rope-theta 1e9)" ;;
          esac
        fi
        case $a in --gpus) gpus=$1 ;; --recipe) pick=$1 ;; *) theta=$1 ;; esac
        shift ;;
      *) sb+=("$a") ;;
    esac
  done
  cd "$EASYCTX_ROOT"
  easyctx_device_sets
  easyctx_chain_world "$gpus"
  local nodes=$EASYCTX_CHAIN_NODES tpn=$EASYCTX_CHAIN_TPN cpt=${EASYCTX_CPUS_PER_TASK:-8}
  local world=$((nodes * tpn))
  if [ -n "$theta" ]; then
    [[ $theta =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+]?[0-9]+)?$ ]] && awk -v t="$theta" 'BEGIN { exit !(t + 0 > 0) }' ||
      easyctx_die "--final-rope-theta $theta: expected a positive number (EasyContext's: 1e9)"
  fi
  # The recipe: --recipe, else the folder sized for this world.
  local cands=() c recipe="" sizes="" rw
  read -r -a cands <<< "$recipes"
  for c in "${cands[@]}"; do
    [ -d "$c" ] || easyctx_die "recipe folder $c not found in $EASYCTX_ROOT"
    easyctx_recipe_world "$c"
    rw=$((EASYCTX_RECIPE_NODES * EASYCTX_RECIPE_GPN))
    sizes+="${sizes:+, }$c for $rw GPUs"
    if [ -n "$pick" ]; then
      case $pick in "$c"|"$c/"|"$(basename "$c")"|"$EASYCTX_ROOT/$c"|"$EASYCTX_ROOT/$c/") recipe=$c ;; esac
    elif [ -z "$recipe" ] && [ "$rw" = "$world" ]; then
      recipe=$c
    fi
  done
  if [ -n "$pick" ] && [ -z "$recipe" ]; then
    easyctx_die "--recipe $pick: expected one of this chain's recipe folders: $sizes"
  fi
  [ -n "$recipe" ] || easyctx_die "no recipe of this chain is sized for $world GPUs ($nodes node(s) x $tpn, from" \
    "$EASYCTX_CHAIN_FROM); its recipes: $sizes. On $world GPUs every stage's tokens per optimizer step would change: run on one of those (--gpus N)," \
    "or pick one with --recipe DIR and size its stages yourself (-- --set train.grad_accum=... or parallel.sequence.size=...)"
  easyctx_recipe_world "$recipe"
  local rn=$EASYCTX_RECIPE_NODES rg=$EASYCTX_RECIPE_GPN
  if [ $((rn * rg)) != "$world" ]; then
    local resized=""
    for a in "${user[@]}"; do
      if [[ $a =~ ^(--set=)?(data\.seq_length|train\.batch_size|train\.grad_accum|parallel\.sequence\.size)= ]]; then
        resized+=" ${a#--set=}"
      fi
    done
    [ -n "$resized" ] || easyctx_die "$recipe is sized for $((rn * rg)) GPUs ($rn x $rg), this chain has $world" \
      "($nodes node(s) x $tpn, from $EASYCTX_CHAIN_FROM): every stage's tokens per optimizer step would change." \
      "Run it on $((rn * rg)) GPUs (--gpus $((rn * rg))), or size its stages for $world yourself (-- --set train.grad_accum=..." \
      "or parallel.sequence.size=...)"
    echo "easyctx: $recipe is sized for $((rn * rg)) GPUs; on $world, sized by --set$resized (each stage's tokens per step below)"
  fi
  case ${EASYCTX_LENGTHS:-pow2} in
    pow2|easycontext) ;;
    *) easyctx_die "EASYCTX_LENGTHS=$EASYCTX_LENGTHS: expected pow2 (262144, 524288) or easycontext (256000, 512000)" ;;
  esac
  local alloc=(--nodes="$nodes" --ntasks-per-node="$tpn" --cpus-per-task="$cpt")
  [ "${EASYCTX_DEVICE:-}" = cpu ] || alloc+=(--gpus-per-node="$tpn")
  # The stages, in recipe order; EASYCTX_STAGES picks some (s3 or s3-256k; commas or spaces).
  local all=() stages=() s t found
  mapfile -t all < <(find "$recipe" -maxdepth 1 -name 's*.yaml' | sort -V)
  [ ${#all[@]} -gt 0 ] || easyctx_die "no stage files (s*.yaml) in $recipe"
  if [ -n "${EASYCTX_STAGES:-}" ]; then
    for t in ${EASYCTX_STAGES//,/ }; do
      found=0
      for s in "${all[@]}"; do
        case $(basename "$s" .yaml) in "${t%.yaml}"|"${t%.yaml}"-*) found=1 ;; esac
      done
      [ "$found" = 1 ] || easyctx_die "EASYCTX_STAGES: no stage $t in $recipe (its stages: $(for s in "${all[@]}"; do basename "$s" .yaml; done | tr '\n' ' '))"
    done
    for s in "${all[@]}"; do
      for t in ${EASYCTX_STAGES//,/ }; do
        case $(basename "$s" .yaml) in "${t%.yaml}"|"${t%.yaml}"-*) stages+=("$s"); break ;; esac
      done
    done
  else
    stages=("${all[@]}")
  fi
  if [ -n "$theta" ] && [ "${stages[-1]}" != "${all[-1]}" ]; then
    easyctx_die "--final-rope-theta $theta exports the recipe's last stage, $(basename "${all[-1]}" .yaml), but" \
      "EASYCTX_STAGES=$EASYCTX_STAGES ends at $(basename "${stages[-1]}" .yaml): add it, or leave --final-rope-theta out"
  fi
  easyctx_find_programs  # before anything is submitted: jobs must not all build at once
  echo "easyctx: chain of ${#stages[@]} stage(s) from $recipe on $nodes node(s) x $tpn task(s)," \
       "programs $EASYCTX_BIN"
  local prev="" dep=() id name sets seq first=1 ids=() outs=() kept=() queued=""
  for s in "${stages[@]}"; do
    name=$(basename "$s" .yaml)
    sets=("${EASYCTX_DEVICE_SETS[@]}")
    [ -n "${EASYCTX_OUT:-}" ] && sets+=(--set output.dir="$EASYCTX_OUT/$name")
    [ "$first" = 1 ] && [ -n "${EASYCTX_INIT:-}" ] && sets+=(--set model.init="$EASYCTX_INIT")
    sets+=("${user[@]}")
    # Later stages start from the previous stage's last checkpoint, wherever its output went.
    [ "$first" = 1 ] || sets+=(--set model.init="ckpt:$prev")
    EASYCTX_SUBMIT_SIDE=1 easyctx_check_stage "$nodes" $((nodes * tpn)) "$EASYCTX_ROOT/$s" "${sets[@]}"
    seq=$(easyctx_cfg_value data seq_length <<< "$EASYCTX_STAGE_CFG")
    # What must exist before the chain starts: the data, and the first stage's weights.
    local data init
    data=$(easyctx_cfg_value data path <<< "$EASYCTX_STAGE_CFG")
    compgen -G "$data" >/dev/null || easyctx_die "$name: data.path $data does not exist (in $(pwd)): tokenize the corpus first" \
      "(slurm/prepare_slimpajama.sh, docs/data.md), or pass -- --set data.path=DIR"
    init=$(easyctx_cfg_value model init <<< "$EASYCTX_STAGE_CFG")
    if [ "$first" = 1 ]; then
      case $init in
        hf:*) [ -f "${init#hf:}/config.json" ] || easyctx_die "$name: model.init $init: no ${init#hf:}/config.json (in" \
                "$(pwd)): put the Hugging Face model there, or set EASYCTX_INIT=hf:DIR (or ckpt:DIR, random)" ;;
        ckpt:*) [ -e "${init#ckpt:}" ] || easyctx_die "$name: model.init $init: ${init#ckpt:} does not exist (in" \
                "$(pwd)): set EASYCTX_INIT=ckpt:DIR (or hf:DIR, random), or EASYCTX_STAGES to start at an earlier stage" ;;
      esac
    fi
    if [ "${EASYCTX_LENGTHS:-pow2}" = easycontext ]; then
      case $seq in
        262144) seq=256000; sets+=(--set data.seq_length=256000) ;;
        524288) seq=512000; sets+=(--set data.seq_length=512000) ;;
      esac
    fi
    # The tokens per optimizer step as this stage will run (its folder's recipe.conf sized it).
    local batch accum dp
    batch=$(easyctx_cfg_value train batch_size <<< "$EASYCTX_STAGE_CFG")
    accum=$(easyctx_cfg_value train grad_accum <<< "$EASYCTX_STAGE_CFG")
    dp=$(sed -nE 's/^process groups: world [0-9]+ = ([0-9]+) data-parallel .*/\1/p' <<< "$EASYCTX_STAGE_CFG")
    [[ $dp =~ ^[0-9]+$ ]] || easyctx_die "$name: no data-parallel size in easyctx_train --print-config's output"
    echo "easyctx: $name: $((seq * batch * accum * dp)) tokens per optimizer step (seq_length $seq x batch_size" \
         "$batch x grad_accum $accum x $dp data-parallel)"
    # An absolute output folder: the next stage's model.init names it.
    sets+=(--set output.dir="$EASYCTX_STAGE_OUT")
    first=0
    outs+=("$EASYCTX_STAGE_OUT")
    if [ -f "$EASYCTX_STAGE_OUT/DONE" ]; then
      echo "easyctx: $name finished already ($EASYCTX_STAGE_OUT/DONE): not submitted (remove the folder, or set" \
           "EASYCTX_OUT, to train it again)"
      prev=$EASYCTX_STAGE_OUT
      continue
    fi
    local queued
    queued=$(easyctx_queued_job "$EASYCTX_STAGE_OUT")
    if [ -n "$queued" ]; then
      echo "easyctx: $name: job $queued is queued or running for $EASYCTX_STAGE_OUT already: not submitted again" \
           "(the next stage waits for it)"
      kept+=("$queued")
      dep=(--dependency=afterok:"$queued")
      prev=$EASYCTX_STAGE_OUT
      continue
    fi
    local cmd=(sbatch --parsable "${dep[@]}" --kill-on-invalid-dep=yes "${alloc[@]}" --job-name="easyctx-$name"
               --comment="easyctx:$EASYCTX_STAGE_OUT" "${sb[@]}" "$EASYCTX_ROOT/slurm/stage.sbatch" "$EASYCTX_ROOT/$s"
               "${sets[@]}")
    if [ "${EASYCTX_DRY_RUN:-0}" = 1 ]; then
      echo "easyctx: $name: dry run, seq_length $seq, output $EASYCTX_STAGE_OUT:$(printf ' %q' "${cmd[@]}")"
      dep=(--dependency=afterok:"<job of $name>")
      prev=$EASYCTX_STAGE_OUT
      continue
    fi
    id=$("${cmd[@]}") ||
      easyctx_die "sbatch refused stage $name${ids[*]:+ (jobs ${ids[*]} of this chain are submitted: scancel them)}"
    id=${id%%;*}
    echo "easyctx: $name: job $id${dep[*]:+ (after ${dep[0]#--dependency=afterok:})}, seq_length $seq, output $EASYCTX_STAGE_OUT"
    ids+=("$id")
    dep=(--dependency=afterok:"$id")
    prev=$EASYCTX_STAGE_OUT
  done
  # EasyContext's last step: the final model exported with a larger rope_theta, no training.
  if [ -n "$theta" ]; then
    local fin=$prev-rope-theta-$theta
    if [ -f "$fin/config.json" ]; then
      echo "easyctx: final rope theta: $fin exists already: not exported again (remove it to export again)"
    elif queued=$(easyctx_queued_job "$fin") && [ -n "$queued" ]; then
      echo "easyctx: final rope theta: job $queued is queued or running for $fin already: not submitted again"
      kept+=("$queued")
    else
      local cmd=(sbatch --parsable "${dep[@]}" --kill-on-invalid-dep=yes --nodes=1 --ntasks=1 --cpus-per-task="$cpt"
                 --job-name=easyctx-final-rope-theta --comment="easyctx:$fin" "${sb[@]}"
                 "$EASYCTX_ROOT/slurm/export.sbatch" "$prev" "$fin" "$theta")
      if [ "${EASYCTX_DRY_RUN:-0}" = 1 ]; then
        echo "easyctx: final rope theta: dry run, rope_theta $theta, output $fin:$(printf ' %q' "${cmd[@]}")"
      else
        id=$("${cmd[@]}") ||
          easyctx_die "sbatch refused the final rope theta export${ids[*]:+ (jobs ${ids[*]} of this chain are submitted: scancel them)}"
        id=${id%%;*}
        echo "easyctx: final rope theta: job $id${dep[*]:+ (after ${dep[0]#--dependency=afterok:})}, rope_theta $theta, output $fin"
        ids+=("$id")
      fi
    fi
  fi
  if [ "${EASYCTX_DRY_RUN:-0}" = 1 ]; then
    echo "easyctx: dry run (EASYCTX_DRY_RUN=1): nothing submitted"
    return 0
  fi
  echo "easyctx: submitted ${#ids[@]} job(s): ${ids[*]:-none}${kept[*]:+ (and kept ${#kept[@]} queued or running: ${kept[*]})};" \
       "logs slurm-easyctx-<stage>-<job>.out in $EASYCTX_ROOT"
  echo "easyctx: when it has finished: $EASYCTX_BIN/easyctx_report ${outs[*]} --output report.html"
}
