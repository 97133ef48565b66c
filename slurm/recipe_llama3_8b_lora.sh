#!/usr/bin/env bash
# Submits the Llama-3-8B LoRA recipe (LongLoRA's: rank 8 on q/k/v/o, embeddings and norms
# trained, the base frozen in bf16; docs/recipes.md) as a chain of Slurm jobs (slurm/stage.sbatch),
# each stage starting from the previous one's checkpoint (its adapters; the base the checkpoint
# names). The folder is the one sized for the job's world: configs/recipes/llama3-8b-1m-lora-8gpu
# (one node of 8 GPUs, 64K -> 1M) or configs/recipes/llama3-8b-lora-1gpu (one GPU, 64K -> 512K).
#   bash slurm/recipe_llama3_8b_lora.sh [--gpus N] [sbatch flags] [-- --set key=value ...]
# Environment and flags: slurm/common.sh and docs/recipes.md, "Slurm".
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
submit_chain "configs/recipes/llama3-8b-1m-lora-8gpu configs/recipes/llama3-8b-lora-1gpu" "$@"
