#!/usr/bin/env bash
# Submits the progressive Llama-2-7B recipe as a chain of Slurm jobs (slurm/stage.sbatch): each
# stage starts when the previous one has finished (afterok) from its last checkpoint
# (model.init: ckpt:<its output.dir>), with the stage's own seq_length and RoPE theta. A stage
# stopped by its time limit checkpoints, requeues and resumes; one that fails stops the chain
# (the later jobs are cancelled). Run again after a failure: finished stages (DONE), and those
# with a job still queued or running, are not submitted again. From anywhere:
#   bash slurm/recipe_llama2_7b_1m.sh [--gpus N] [--recipe DIR] [--final-rope-theta X]
#                                     [sbatch flags] [-- --set key=value ...]
# The world picks the recipe, each sized for its GPUs with EasyContext's ~1M tokens per step:
#   16 GPUs (2 nodes x 8, the default): configs/recipes/llama2-7b-1m/, s1..s8, 32K -> 1M;
#   8 GPUs (--gpus 8, one node): configs/recipes/llama2-7b-1m-8gpu/, EasyContext's own 8-GPU
#     stages s1..s7, 32K -> 512K (A100-80GB or H200);
# any other world is refused. --final-rope-theta 1e9 adds EasyContext's last step: the final
# model exported (Hugging Face format) with rope_theta 1e9 in its config.json. The programs are
# found (EASYCTX_BIN, build/bin) or built here first. Environment (EASYCTX_NODES,
# EASYCTX_STAGES, EASYCTX_LENGTHS=easycontext, EASYCTX_DEVICE=cpu, ...): slurm/common.sh and
# docs/recipes.md, "Slurm".
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
submit_chain "configs/recipes/llama2-7b-1m configs/recipes/llama2-7b-1m-8gpu" "$@"
