#!/usr/bin/env bash
# Starts a private one-node Slurm cluster, submits slurm/stage.sbatch with a tiny stage on 2
# tasks, sends the job SIGUSR1 mid-run (what --signal=B:USR1@300 does before a time limit),
# and checks: the ranks commit a checkpoint and exit 0, the job requeues itself, the second
# run resumes from the checkpoint (--resume auto), the stage finishes (DONE) and every step
# appears exactly once in metrics.jsonl.
set -euo pipefail
src=$1
bin=$2
for t in slurmctld slurmd munged sbatch scontrol scancel; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not installed (apt-get install slurm-wlm)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the private Slurm cluster needs root"; exit 77; }
work=$(mktemp -d /tmp/easyctx-slurm.XXXXXX)
conf=$work/slurm.conf
export SLURM_CONF=$conf
pids=()
cleanup() {
  scancel --full --quiet -u root >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" >/dev/null 2>&1 || true; done
  [ -f "$work/slurmctld.pid" ] && kill "$(cat "$work/slurmctld.pid")" >/dev/null 2>&1 || true
  [ -f "$work/slurmd.pid" ] && kill "$(cat "$work/slurmd.pid")" >/dev/null 2>&1 || true
  sleep 1
  if [ "${keep:-0}" != 1 ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; keep=1; echo "--- job output:"; cat "$work"/job-*.out 2>/dev/null | tail -60; exit 1; }

host=$(hostname)
cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it follows OMP_NUM_THREADS
[ "$cpus" -ge 2 ] || { echo "SKIP: the 2-task job needs 2 CPUs, this machine has $cpus"; exit 77; }
cat > "$conf" <<CONF
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
slurmctld -f "$conf"
slurmd -f "$conf"
for i in $(seq 1 30); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 1
done
sinfo -h -o %T | grep -q idle || fail "the private Slurm node never became idle"

# A tiny stage: the demo model on a KJV slice tokenized with the demo tokenizer.
data=$work/data
bash "$src/scripts/make_kjv_corpus.sh" "$work/corpus" >/dev/null
tok=$(bash "$src/scripts/make_demo_tokenizer.sh" "$work/tok")
zstd -q -d -f -o "$work/chapters.jsonl" "$work/corpus/kjv_chapters.jsonl.zst"
head -n 300 "$work/chapters.jsonl" > "$work/train.jsonl"
"$bin/h5tokenize" --tokenizer "$tok" --output "$data" "$work/train.jsonl" >/dev/null
cat > "$work/stage.yaml" <<YAML
model:
  config: demo
data:
  path: $data
  seq_length: 128
train:
  steps: 60
  batch_size: 2
  lr: 3e-3
  warmup_steps: 5
output:
  dir: $work/run
logging:
  every: 5
YAML

export EASYCTX_ROOT=$src EASYCTX_BIN=$bin
job=$(cd "$work" && sbatch --parsable --ntasks=2 --cpus-per-task=1 --job-name=easyctx-test --output="$work/job-%j.out" \
        "$src/slurm/stage.sbatch" "$work/stage.yaml")
echo "submitted job $job"
# Wait until training is under way, then send what Slurm sends before a time limit.
for i in $(seq 1 240); do
  grep -q "step 10/60" "$work/job-$job.out" 2>/dev/null && break
  sleep 0.5
done
grep -q "step 10/60" "$work/job-$job.out" || fail "training never reached step 10"
scancel --signal=USR1 --batch "$job"
echo "sent SIGUSR1"
state=""
for i in $(seq 1 400); do
  state=$(scontrol show job "$job" 2>/dev/null | sed -nE 's/.*JobState=([A-Z_]+).*/\1/p' | head -1)
  [ -f "$work/run/DONE" ] && [ "$state" = COMPLETED ] && break
  sleep 0.5
done
out="$work/job-$job.out"
[ -f "$work/run/DONE" ] || fail "the stage never finished (state $state)"
grep -q "stop requested" "$out" || fail "no checkpoint-on-signal message"
grep -q "requeueing job $job" "$out" || fail "the job did not requeue itself"
grep -q "resuming from" "$out" || fail "the second run did not resume"
steps=$(grep -o '"step":[0-9]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
expect=$(seq -s ' ' 1 60)
[ "$steps" = "$expect " ] || fail "metrics.jsonl steps are '$steps', expected 1..60 once each"
echo "PASS: checkpoint on SIGUSR1, requeue, resume, DONE; metrics hold steps 1..60 once each"
