#!/usr/bin/env bash
# Llama-2-7B at 1M tokens on 16 A100-80GB (2 nodes x 8): the last stage of the recipe alone
# (configs/recipes/llama2-7b-1m/s8-1m.yaml: a 16-way zigzag ring, ZeRO-3 with the optimizer
# shards in host memory, layer checkpoints). It starts from stage s7's last checkpoint (the
# stage file's model.init; --set model.init=ckpt:DIR or hf:DIR for another). From the checkout:
#   sbatch slurm/train_1m_16xA100.sh [--set key=value ...]
# The programs are found (EASYCTX_BIN, build/bin) or built in the job (scripts/build.sh, CUDA
# required). Check the plan for your nodes first (docs/recipes.md has it for A100 and H200 nodes):
#   build/bin/easyctx_train configs/recipes/llama2-7b-1m/s8-1m.yaml --plan --set target.gpu=A100-80GB \
#     --set target.gpus_per_node=8 --set target.nodes=2 --set target.host_memory_gib=1024
# Scaled down (tests): sbatch flags for the allocation, EASYCTX_DEVICE=cpu and --set flags
# (docs/recipes.md, "Slurm").
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
# The checkout: EASYCTX_ROOT, else the folder sbatch ran in, else the script's own (from the job record).
root=${EASYCTX_ROOT:-${SLURM_SUBMIT_DIR:-.}}
[ -f "$root/slurm/common.sh" ] || root=$(dirname "$(dirname "$(scontrol show job "${SLURM_JOB_ID:-0}" 2>/dev/null |
  sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")")
[ -f "$root/slurm/common.sh" ] || { echo "easyctx: error: no easyctx checkout (slurm/common.sh) in ${EASYCTX_ROOT:-${SLURM_SUBMIT_DIR:-.}}: submit from the checkout's root or set EASYCTX_ROOT" >&2; exit 2; }
EASYCTX_ROOT=$(cd "$root" && pwd)
source "$EASYCTX_ROOT/slurm/common.sh"
run_stage "$EASYCTX_ROOT/configs/recipes/llama2-7b-1m/s8-1m.yaml" "$@"
