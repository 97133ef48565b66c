#!/usr/bin/env bash
# EasyContext's headline run, 700K tokens of Llama-2-7B on 8 A100-80GB (one node): the 1M
# stage config with seq_length 700000 (any length works: the zigzag split pads to 2W and
# masks the pad out of the loss) and 8-way sequence parallelism, ZeRO-3 over the 8 ranks with
# the optimizer shards in host memory. It starts from the last checkpoint of the 8-GPU chain's
# s7 (bash slurm/recipe_llama2_7b_1m.sh --gpus 8: EasyContext's stages up to 512K on the same
# node; --set model.init=ckpt:DIR or hf:DIR for another). Check the plan for your node first:
#   build/bin/easyctx_train configs/recipes/llama2-7b-1m/s8-1m.yaml --plan --set data.seq_length=700000 \
#     --set parallel.sequence.size=8 --set target.gpu=A100-80GB --set target.gpus_per_node=8 --set target.nodes=1
# From the checkout:  sbatch slurm/train_700k_8xA100.sh [--set key=value ...]
# (programs, environment and scale-down: docs/recipes.md, "Slurm").
#SBATCH --job-name=easyctx-700k
#SBATCH --nodes=1
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
run_stage "$EASYCTX_ROOT/configs/recipes/llama2-7b-1m/s8-1m.yaml" \
  --set data.seq_length=700000 --set parallel.sequence.size=8 \
  --set model.init=ckpt:out/llama2-7b-1m-8gpu/s7-512k/checkpoints --set output.dir=out/llama2-7b-700k "$@"
