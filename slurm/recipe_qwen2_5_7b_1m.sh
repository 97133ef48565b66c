#!/usr/bin/env bash
# Submits the progressive Qwen2.5-7B recipe (configs/recipes/qwen2.5-7b-1m/s1..s5, 64K -> 1M
# tokens) as a chain of Slurm jobs (slurm/stage.sbatch): each stage starts when the previous
# one has finished (afterok) from its last checkpoint (model.init: ckpt:<its output.dir>), with
# the stage's own seq_length and RoPE theta. A stage stopped by its time limit checkpoints,
# requeues and resumes; one that fails stops the chain (the later jobs are cancelled). Run
# again after a failure: finished stages (DONE), and those with a job still queued or running,
# are not submitted again. From anywhere:
#   bash slurm/recipe_qwen2_5_7b_1m.sh [--gpus N] [--final-rope-theta X] [sbatch flags] [-- --set key=value ...]
# Sized for 16 GPUs (2 nodes x 8, the default; recipe.conf): another world is refused, as it
# would change every stage's tokens per optimizer step. The programs
# are found (EASYCTX_BIN, build/bin) or built here first. Environment (EASYCTX_NODES,
# EASYCTX_STAGES, EASYCTX_LENGTHS=easycontext, EASYCTX_DEVICE=cpu, ...): slurm/common.sh and
# docs/recipes.md, "Slurm".
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
submit_chain configs/recipes/qwen2.5-7b-1m "$@"
