#!/usr/bin/env bash
# Starts a private one-node Slurm cluster, submits slurm/stage.sbatch from another folder with
# EASYCTX_ROOT and EASYCTX_BIN set (a checkout and a build elsewhere), a tiny stage on 2 tasks,
# sends the job SIGUSR1 mid-run (what --signal=B:USR1@300 does before a time limit), and
# checks: the ranks commit a checkpoint and exit 0, the job requeues itself, the second run
# resumes from the checkpoint (--resume auto), the stage finishes (DONE) and every step
# appears exactly once in metrics.jsonl.
set -euo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-slurm.XXXXXX)
source "$src/tests/slurm/slurm_cluster.sh"
slurm_cluster_start

data=$work/data
slurm_tiny_data "$data"
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
out="$work/job-$job.out"
# Wait until training is under way, then send what Slurm sends before a time limit.
slurm_wait_line "$out" "^step 10/60" 120
scancel --signal=USR1 --batch "$job"
echo "sent SIGUSR1"
slurm_wait_line "$out" "requeueing job $job" 60
slurm_release_requeued "$job"
slurm_wait_state "$job" "COMPLETED FAILED CANCELLED" 120
[ "$(slurm_job_field "$job" JobState)" = COMPLETED ] || slurm_fail "job $job ended $(slurm_job_field "$job" JobState)"
[ -f "$work/run/DONE" ] || slurm_fail "the stage never finished"
grep -q "stop requested" "$out" || slurm_fail "no checkpoint-on-signal message"
grep -q "resuming from" "$out" || slurm_fail "the second run did not resume"
steps=$(grep -o '"step":[0-9]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
expect=$(seq -s ' ' 1 60)
[ "$steps" = "$expect " ] || slurm_fail "metrics.jsonl steps are '$steps', expected 1..60 once each"
echo "PASS: checkpoint on SIGUSR1, requeue, resume, DONE; metrics hold steps 1..60 once each"
