#!/usr/bin/env bash
# Llama-2-7B at 1M tokens on 16 A100-80GB (2 nodes x 8): the last stage of the recipe
# (configs/recipes/llama2-7b-1m/s8-1m.yaml: 16-way zigzag ring, ZeRO-3 with optimizer
# offload, attention-output checkpoints offloaded to host memory). Check the memory plan for
# your nodes first: build/bin/easyctx_train configs/recipes/llama2-7b-1m/s8-1m.yaml --plan
#SBATCH --job-name=easyctx-1m
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
source "${EASYCTX_ROOT:-$SLURM_SUBMIT_DIR}/slurm/common.sh"
run_stage "$EASYCTX_ROOT/configs/recipes/llama2-7b-1m/s8-1m.yaml" "$@"
