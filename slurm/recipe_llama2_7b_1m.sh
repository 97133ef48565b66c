#!/usr/bin/env bash
# Submits the whole progressive recipe (configs/recipes/llama2-7b-1m/s1..s8) as a chain of
# Slurm jobs: each stage starts when the previous one has finished (afterok) and begins
# from its last checkpoint (model.init: ckpt:...), with the stage's new seq_length and RoPE
# theta. Run from the repository root:  bash slurm/recipe_llama2_7b_1m.sh [sbatch flags]
# Default allocation: 2 nodes x 8 GPUs, as the stage files are sized.
set -euo pipefail
cd "$(dirname "$0")/.."
dep=()
for stage in configs/recipes/llama2-7b-1m/s*.yaml; do
  id=$(sbatch --parsable "${dep[@]}" --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 \
         --job-name="easyctx-$(basename "$stage" .yaml)" "$@" slurm/stage.sbatch "$stage")
  echo "submitted $stage as job $id"
  dep=(--dependency=afterok:"$id")
done
