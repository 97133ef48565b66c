# Sourced by the tests/slurm tests: a private one-node Slurm cluster (slurmctld + slurmd of
# Debian's slurm-wlm, munge), a tiny tokenized corpus, a copy of the checkout laid out as a
# fresh clone, and waits on jobs with deadlines. Nothing of Slurm is stubbed: the tests submit
# with sbatch and signal with scancel/scontrol.
#
#   source slurm_cluster.sh; slurm_cluster_start   (needs $work; skips with 77 without Slurm/root)
#
# Slurm holds a requeued job for 120 s before it may start again (hard-coded in slurmctld);
# slurm_release_requeued lets it start at once (scontrol update StartTime=now), so a test does
# not wait two minutes per requeue.

slurm_fail() {
  echo "FAIL: $*"
  keep=1
  local f
  for f in "$work"/job-*.out "$work"/clone*/slurm-*.out; do
    [ -f "$f" ] || continue
    echo "--- $f (last 40 lines)"
    tail -n 40 "$f"
  done
  exit 1
}

slurm_cleanup() {
  scancel --full --quiet -u "$(id -un)" >/dev/null 2>&1 || true
  sleep 1
  [ -f "$work/slurmctld.pid" ] && kill "$(cat "$work/slurmctld.pid")" >/dev/null 2>&1 || true
  [ -f "$work/slurmd.pid" ] && kill "$(cat "$work/slurmd.pid")" >/dev/null 2>&1 || true
  sleep 1
  if [ "${keep:-0}" = 1 ] || [ -n "${EASYCTX_SLURM_KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}

slurm_cluster_start() {
  local t
  for t in slurmctld slurmd munged sbatch scontrol scancel squeue; do
    command -v "$t" >/dev/null || { echo "SKIP: $t not installed (apt-get install slurm-wlm)"; exit 77; }
  done
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: the private Slurm cluster needs root"; exit 77; }
  local cpus
  cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it follows OMP_NUM_THREADS
  [ "$cpus" -ge 2 ] || { echo "SKIP: the 2-task jobs need 2 CPUs, this machine has $cpus"; exit 77; }
  export SLURM_CONF=$work/slurm.conf
  trap slurm_cleanup EXIT
  local host
  host=$(hostname)
  cat > "$SLURM_CONF" <<CONF
ClusterName=easyctx-test
SlurmctldHost=$host
SlurmctldPort=$((20000 + RANDOM % 10000))
SlurmdPort=$((30000 + RANDOM % 10000))
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmUser=root
SlurmdUser=root
ReturnToService=2
MpiDefault=none
JobRequeue=1
MinJobAge=600
NodeName=$host CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  mkdir -p "$work/state" "$work/spool"
  # munge: the key and the daemon (reused if one already runs).
  if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || create-munge-key -f
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    munged --force 2>/dev/null || su -s /bin/sh munge -c "munged --force"
  fi
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  local i
  for i in $(seq 1 60); do
    sinfo -h -o %T 2>/dev/null | grep -q idle && return 0
    sleep 0.5
  done
  slurm_fail "the private Slurm node never became idle (see $work/slurmctld.log, $work/slurmd.log)"
}

# The demo tokenizer and 3,000 KJV verses tokenized with it into DIR (about 2 s).
# (tests/tiny_data.sh: the tokenizer and the shard as the other shell tests make them)
slurm_tiny_data() {
  local dir=$1 tok
  source "$src/tests/tiny_data.sh"
  tok=$(tiny_tokenizer "$work") || slurm_fail "the demo tokenizer (scripts/make_demo_tokenizer.sh) failed"
  head -n 3000 "$work/tok/kjv.txt" > "$work/kjv3000.txt"
  tiny_shard "$bin" "$tok" "$work/kjv3000.txt" "$dir" || slurm_fail "h5tokenize of the test corpus failed"
}

# A copy of the checkout's tracked (and new, not ignored) files at DST, as a fresh clone
# looks, with build/ pointing at this build when WITH_BUILD is 1 (after scripts/build.sh).
slurm_fresh_clone() {
  local dst=$1 with_build=$2
  mkdir -p "$dst"
  if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar cf -) | tar xf - -C "$dst"
  else
    (cd "$src" && tar cf - --exclude=./build --exclude=./.git .) | tar xf - -C "$dst"
  fi
  [ -f "$dst/slurm/common.sh" ] || slurm_fail "the copy of the checkout at $dst has no slurm/common.sh"
  rm -rf "$dst/build" "$dst/out"
  [ "$with_build" = 1 ] && ln -s "$(cd "$bin/.." && pwd)" "$dst/build"
  return 0
}

slurm_job_field() {  # JOB FIELD: e.g. JobState, Reason, Restarts, ExitCode
  scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# Waits (up to SECONDS) until JOB is in one of STATES (e.g. "COMPLETED FAILED").
slurm_wait_state() {
  local job=$1 states=$2 secs=$3 i st=""
  for i in $(seq 1 $((secs * 5))); do
    st=$(slurm_job_field "$job" JobState)
    case " $states " in *" $st "*) return 0 ;; esac
    sleep 0.2
  done
  slurm_fail "job $job is $st after $secs s, expected one of: $states"
}

# Waits (up to SECONDS) until FILE has a line matching the extended regex.
slurm_wait_line() {
  local file=$1 re=$2 secs=$3 i
  for i in $(seq 1 $((secs * 10))); do
    grep -qE "$re" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  slurm_fail "no line matching '$re' in $file within $secs s"
}

# After JOB requeued itself: let it start again in 2 s instead of 120. Not at once: slurmd
# refuses a new start whose credential is from the same second as the requeue ("Job credential
# revoked"), which is what Slurm's hold guards against; so first the node must be idle again.
slurm_release_requeued() {
  local job=$1 i
  for i in $(seq 1 300); do
    if [ "$(slurm_job_field "$job" JobState)" = PENDING ] && sinfo -h -o %T | grep -qx idle; then
      sleep 2
      scontrol update JobId="$job" StartTime=now && return 0
    fi
    sleep 0.2
  done
  slurm_fail "job $job never went back to PENDING on an idle node after its requeue (state $(slurm_job_field "$job" JobState))"
}
