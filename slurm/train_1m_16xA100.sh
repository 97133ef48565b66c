#!/usr/bin/env bash
# Llama-2-7B at 1M tokens on 16 A100-80GB (2 nodes x 8): the last stage of the recipe
# (configs/recipes/llama2-7b-1m/s8-1m.yaml: 16-way zigzag ring, fp32 optimizer state in host
# memory, MLP tiles, layer checkpoints: 75.3 GiB per GPU and ~612 GiB of host memory per node
# by the memory plan). Check the plan for your nodes first:
# build/bin/easyctx_train configs/recipes/llama2-7b-1m/s8-1m.yaml --plan --set target.gpu=A100-80GB \
#   --set target.gpus_per_node=8 --set target.nodes=2 --set target.host_memory_gib=1024
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
