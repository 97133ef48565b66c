#!/usr/bin/env bash
# A two-stage context-extension chain on one GPU, run the way the recipes run (stage 2 starts
# from stage 1's last checkpoint with model.init: ckpt:..., a longer sequence and a larger
# RoPE theta), then the run report page of the chain (easyctx_report). It shows the recipe
# machinery and the report on real hardware; the model (TinyLlama-1.1B shape, random init)
# is too small and the run too short to learn anything. From the repository root:
#   B=build-gpu/bin DATA=DIR bash bench/run_chain_gpu.sh [OUT_DIR]
# B: the binaries (easyctx_train, easyctx_report); DATA: an h5tokenize folder with
# Llama-2-vocabulary tokens (default .deps/demo_data, bench/tokenize.sh makes one); STEPS
# (default 8) steps per stage; S1/S2 the two sequence lengths (default 8192 / 16384); MODEL
# and DEVICE (default tinyllama-1b, cuda) for a CPU try with a small shape. Each stage keeps
# its last checkpoint (17.6 GB for 1.1B parameters with Adam) and an HF export: ~45 GB of disk.
set -euo pipefail
B=${B:-build-gpu/bin}
DATA=${DATA:-.deps/demo_data}
STEPS=${STEPS:-8}
S1=${S1:-8192}
S2=${S2:-16384}
out=${1:-out/chain_gpu}
mkdir -p "$out"
common=(--set model.config=${MODEL:-tinyllama-1b} --set model.init=random --set data.path="$DATA"
        --set train.device=${DEVICE:-cuda} --set train.steps="$STEPS" --set train.batch_size=1
        --set train.warmup_steps=5 --set train.lr=2e-4 --set train.min_lr=2e-5
        --set activation.checkpoint=layer --set logging.every=1 --set output.save_every=0)
"$B/easyctx_train" configs/demo.yaml "${common[@]}" --set data.seq_length="$S1" \
  --set model.rope_theta=10000 --set output.dir="$out/s1" --resume none
"$B/easyctx_train" configs/demo.yaml "${common[@]}" --set data.seq_length="$S2" \
  --set model.init="ckpt:$out/s1" --set model.rope_theta=40000 --set output.dir="$out/s2" --resume none
"$B/easyctx_report" "$out/s1" "$out/s2" --title "easyctx on one H200: TinyLlama-1.1B shape, ${S1} -> ${S2} tokens" \
  --output "$out/report.html"
