#!/usr/bin/env bash
# EasyContext's headline run, 700K tokens of Llama-2-7B on 8 A100-80GB (one node): the 1M
# stage config with seq_length 700000 (any length works: the zigzag split pads to 2W and
# masks the pad out of the loss) and 8-way sequence parallelism. The memory plan puts this at
# 85.3 GiB per A100-80GB: the trainer refuses it there, naming among others --set
# activation.attention_head_groups=8 (76.7 GiB per GPU) or --set parallel.zero.stage=3 (55.5 GiB
# per GPU, the optimizer shards in host memory: 286 GiB per node); pass one as extra arguments.
# On H200 nodes it fits as is (docs/recipes.md).
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
source "${EASYCTX_ROOT:-$SLURM_SUBMIT_DIR}/slurm/common.sh"
run_stage "$EASYCTX_ROOT/configs/recipes/llama2-7b-1m/s8-1m.yaml" \
  --set data.seq_length=700000 --set parallel.sequence.size=8 \
  --set output.dir=out/llama2-7b-700k "$@"
