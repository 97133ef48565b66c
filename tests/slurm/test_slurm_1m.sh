#!/usr/bin/env bash
# `sbatch slurm/train_1m_16xA100.sh` as a user submits it, on a private one-node Slurm cluster,
# from a copy of the checkout laid out as a fresh clone (no EASYCTX_ROOT or EASYCTX_BIN):
#   1. as written, on this machine's build without a GPU in the job: the job stops before
#      mpirun with one message (a CPU-only build: "built without the CUDA backend"; a CUDA
#      build: "no CUDA device is visible");
#   2. from a clone without a build and EASYCTX_BUILD=no: one message saying how to build,
#      in the job's log and from the recipe script on the submit node (nothing submitted);
#   3. scaled down through sbatch's own flags (1 node, 2 tasks, no GPUs), EASYCTX_DEVICE=cpu
#      and --set flags (demo model, sequence parallel 2, 20 steps): it runs to the end in the
#      stage file's output folder.
set -euo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-slurm-1m.XXXXXX)
source "$src/tests/slurm/slurm_cluster.sh"
slurm_cluster_start
t0=$(date +%s)
slurm_tiny_data "$work/data"
clone=$work/clone
slurm_fresh_clone "$clone" 1
unset EASYCTX_ROOT EASYCTX_BIN EASYCTX_BUILD EASYCTX_DEVICE
alloc=(--nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0)
small=(--set model.config=demo --set model.init=random --set data.path="$work/data" --set data.seq_length=128
       --set train.steps=20 --set parallel.sequence.size=2 --set train.lr=2e-3)

# 1. The GPU stage as written, in a job without GPUs (not where a GPU is visible: there it would run).
build=$("$bin/easyctx_train" "$clone/configs/recipes/llama2-7b-1m/s8-1m.yaml" --print-config | grep '^# this build: ')
case $build in
  *"CPU only"*) want="s8-1m.yaml runs on GPUs \(train.device: cuda\), but .*easyctx_train was built without the CUDA backend" ;;
  *" 0 CUDA device(s)"*) want="s8-1m.yaml runs on GPUs \(train.device: cuda\), but no CUDA device is visible in job" ;;
  *) want="" ;;
esac
if [ -n "$want" ]; then
  j1=$(cd "$clone" && sbatch --parsable "${alloc[@]}" slurm/train_1m_16xA100.sh "${small[@]}")
  slurm_wait_state "$j1" "COMPLETED FAILED CANCELLED" 120
  log1=$clone/slurm-easyctx-1m-$j1.out
  [ "$(slurm_job_field "$j1" JobState)" = FAILED ] ||
    slurm_fail "the GPU stage without GPUs ended $(slurm_job_field "$j1" JobState), expected FAILED"
  grep -qE "^easyctx: error: .*$want" "$log1" || slurm_fail "job $j1: no message matching '$want'"
  ! grep -q "starts in" "$log1" || slurm_fail "job $j1 launched the trainer on a build or job that cannot run it"
  [ "$(grep -c '^easyctx: error:' "$log1")" = 1 ] || slurm_fail "job $j1: expected one error line"
  echo "ok: the 1M stage as written, no GPU in the job: $(grep -oE 'built without the CUDA backend|no CUDA device is visible' "$log1" | head -1)"
else
  echo "ok: ($build: the GPU stage would run here, so there is no refusal to check)"
fi

# 2. No build.
bare=$work/bare
slurm_fresh_clone "$bare" 0
j2=$(cd "$bare" && EASYCTX_BUILD=no sbatch --parsable "${alloc[@]}" slurm/train_1m_16xA100.sh "${small[@]}")
slurm_wait_state "$j2" "COMPLETED FAILED CANCELLED" 120
log2=$bare/slurm-easyctx-1m-$j2.out
[ "$(slurm_job_field "$j2" JobState)" = FAILED ] || slurm_fail "job $j2 without a build ended $(slurm_job_field "$j2" JobState)"
grep -q "^easyctx: error: no easyctx programs: $bare/build/bin/easyctx_train does not exist (EASYCTX_BUILD=no). Build them: cd $bare && bash scripts/build.sh" "$log2" ||
  slurm_fail "job $j2: no message saying how to build"
rc=0
(cd "$bare" && EASYCTX_BUILD=no EASYCTX_DEVICE=cpu bash slurm/recipe_llama2_7b_1m.sh) > "$work/bare-chain.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "^easyctx: error: no easyctx programs: .* Build them: cd $bare && bash scripts/build.sh" "$work/bare-chain.log" ||
  { cat "$work/bare-chain.log"; slurm_fail "the recipe script without a build: exit $rc, expected 2 with how to build"; }
[ "$(squeue -h | wc -l)" = 0 ] || slurm_fail "the recipe script without a build submitted jobs"
echo "ok: no build: the job and the recipe script say how to build"

# 3. Scaled down: runs to the end.
j3=$(cd "$clone" && EASYCTX_DEVICE=cpu sbatch --parsable "${alloc[@]}" slurm/train_1m_16xA100.sh "${small[@]}")
slurm_wait_state "$j3" "COMPLETED FAILED CANCELLED" 240
log3=$clone/slurm-easyctx-1m-$j3.out
[ "$(slurm_job_field "$j3" JobState)" = COMPLETED ] || slurm_fail "the scaled-down 1M job ended $(slurm_job_field "$j3" JobState)"
out=$clone/out/llama2-7b-1m/s8-1m
for f in DONE final/model.safetensors plan.json metrics.jsonl; do
  [ -s "$out/$f" ] || slurm_fail "the 1M stage left no $out/$f"
done
grep -q "^easyctx: stage $clone/configs/recipes/llama2-7b-1m/s8-1m.yaml on 2 rank(s), 1 node(s), train.device cpu, output $out " "$log3" ||
  slurm_fail "job $j3: no start line naming the stage, ranks and output"
grep -q "2 rank(s): data-parallel 1 x sequence-parallel 2 (zigzag_ring)" "$log3" || slurm_fail "job $j3 did not run sequence parallel 2"
grep -q "rope_theta 5e+08" "$log3" || slurm_fail "job $j3 did not keep the stage's rope_theta"
steps=$(grep -o '"step":[0-9]*' "$out/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$steps" = "$(seq -s ' ' 1 20) " ] || slurm_fail "metrics.jsonl steps are '$steps', expected 1..20"
echo "PASS: sbatch slurm/train_1m_16xA100.sh from a fresh clone: refusals, how to build, a scaled-down run ($(( $(date +%s) - t0 )) s)"
