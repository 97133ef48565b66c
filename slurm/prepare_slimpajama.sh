#!/usr/bin/env bash
# Tokenizes a SlimPajama-format corpus (*.jsonl.zst files whose records carry
# meta.redpajama_set_name) into the HDF5 shards the recipes train on, on as many nodes as the
# job has: h5tokenize under mpirun, work units spread over the ranks, --threads inside each
# (docs/data.md). Per-source upsampling (Fu et al. 2024, EasyContext's data) is on by default.
# Resumable: a requeued or re-submitted job skips the finished work units and continues the
# unfinished ones (h5tokenize's own resume); the output is the same at any rank count.
#
#   sbatch --nodes=4 slurm/prepare_slimpajama.sh TOKENIZER INPUT_DIR OUTPUT_DIR [h5tokenize flags]
#   e.g. sbatch --nodes=4 slurm/prepare_slimpajama.sh models/Llama-2-7b-hf/tokenizer.model \
#          /data/SlimPajama-627B/train data/slimpajama-llama2 --total-tokens 5000000000
#
# Environment: UPSAMPLE (default per_source; none to keep every document), EASYCTX_BIN (the
# programs; default build/bin of this checkout). Extra arguments go to h5tokenize.
#SBATCH --job-name=easyctx-tokenize
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
root=${EASYCTX_ROOT:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")/.." && pwd)}}
bin=${EASYCTX_BIN:-$root/build/bin}
[ $# -ge 3 ] || { echo "usage: sbatch [--nodes=N] slurm/prepare_slimpajama.sh TOKENIZER INPUT_DIR OUTPUT_DIR [h5tokenize flags]" >&2; exit 2; }
tokenizer=$1 input=$2 output=$3
shift 3
[ -x "$bin/h5tokenize" ] || { echo "prepare_slimpajama: $bin/h5tokenize not found: build first (bash scripts/build.sh) or set EASYCTX_BIN" >&2; exit 2; }
[ -f "$tokenizer" ] || { echo "prepare_slimpajama: tokenizer $tokenizer not found" >&2; exit 2; }
[ -e "$input" ] || { echo "prepare_slimpajama: input $input not found" >&2; exit 2; }
ntasks=${SLURM_NTASKS:-1}
threads=${SLURM_CPUS_PER_TASK:-$(nproc)}
flags=(-np "$ntasks" --bind-to none)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root --oversubscribe)
upsample=(--upsample "${UPSAMPLE:-per_source}")
echo "prepare_slimpajama: $input -> $output on $ntasks rank(s) x $threads thread(s), upsampling ${UPSAMPLE:-per_source}"
# --progress 1: periodic progress lines in the job's log (stderr is not a terminal there).
mpirun "${flags[@]}" "$bin/h5tokenize" --tokenizer "$tokenizer" --output "$output" --threads "$threads" \
  "${upsample[@]}" --progress 1 "$@" "$input"
echo "prepare_slimpajama: done; summary in $output/h5tokenize_summary.json"
