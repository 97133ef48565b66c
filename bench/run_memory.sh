#!/usr/bin/env bash
# The long-context memory runs of bench/RESULTS.md (issue 7): llama2-7b with fp32 master weights
# and Adam moments in host memory (configs/bench/llama2-7b-1gpu.yaml: whole-layer recompute, MLP in
# 16K-token tiles), one full training step each, after its memory plan. From the repository root:
#   bash bench/run_memory.sh plans     # no GPU needed: the plans of the runs below (H200 targets)
#                                      # and of the whole 7B at 1M tokens on 2 H200s
#   bash bench/run_memory.sh 256k      # 1 GPU: 256K tokens, 8 of the 31 layer inputs in host memory
#                                      # (planned against a 128 GiB host)
#   bash bench/run_memory.sh 256k-kept # 1 GPU: 256K, 17 layer inputs in host memory, attention
#                                      # outputs kept in the last 21 layers (the default atomic
#                                      # backward; STEPS=3 for a step between the first and the
#                                      # last: 45.7% MFU, bench/RESULTS.md session 27)
#   bash bench/run_memory.sh 512k      # 2 GPUs: 512K, zigzag ring in 4 head groups, 12 inputs
#                                      # offloaded, atomic dQ
#   bash bench/run_memory.sh 512k-zero3  # 2 GPUs: 512K, ZeRO-3 with the optimizer shards in host
#                                      # memory, 4 head groups, no activation offload, atomic dQ
#   bash bench/run_memory.sh 512k-params # the same with the bf16 parameter shards in host memory
#                                      # too (parallel.zero.offload_params)
#   bash bench/run_memory.sh 1m-slice  # 2 GPUs: a 4-layer slice of the 7B at 1M tokens, 4 head
#                                      # groups, every checkpoint offloaded, atomic dQ
#   LAYERS=1|2 bash bench/run_memory.sh 1.5m-slice
#   CHECKPOINT=attention_output LAYERS=1|2 bash bench/run_memory.sh 1.5m-slice
#                                      # 1 GPU: a 1- or 2-layer slice of the 7B at 1,572,864 tokens
#                                      # with the knobs of docs/memory-model.md's "Context per GPU"
#                                      # (ZeRO-3 over one GPU, optimizer, parameters and gradients
#                                      # in host memory, 8 head groups, checkpoints offloaded,
#                                      # atomic dQ; CHECKPOINT: layer, the default, or
#                                      # attention_output: its outputs streamed per head group to
#                                      # host memory): the GPU bytes do not grow with layers, the host
#                                      # bytes per layer are the 2-layer run's minus the 1-layer's;
#                                      # its data (DATA, default .deps/long_data): one document of
#                                      # 1.57M tokens, e.g. build/bin/h5synth -t TOKENIZER.model
#                                      # -o .deps/long_data --haystack-dir .deps/haystack/kjv.txt
#                                      # --length 1572880 --documents 1 --mix text=1
# BIN: easyctx_train (default build-gpu/bin/easyctx_train, or $B/easyctx_train after
# `source bench/prebuilt.sh env`); LAUNCH: the 2-GPU launcher (default mpirun -np 2 ...);
# STEPS (default 1). The runs go through bench/run_train.sh (one JSON line each, with the
# trainer's "memory: predicted ... measured ..." line).
set -euo pipefail
what=${1:-plans}
BIN=${BIN:-${B:+$B/easyctx_train}}
BIN=${BIN:-build-gpu/bin/easyctx_train}
[ -x "$BIN" ] || BIN=build/bin/easyctx_train  # plans only need a CPU build
LAUNCH=${LAUNCH:-"mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS"}
STEPS=${STEPS:-1}
CFG=configs/bench/llama2-7b-1gpu.yaml
# The optimizer in host memory in every run, as bench/RESULTS.md measured them: the whole 7B
# needs it there at these lengths anyway, and a layer slice stands for the whole model (the
# config's offload_optimizer auto would keep a slice's small optimizer on the GPU).
host_opt=(--set parallel.zero.offload_optimizer=true)
s256=("${host_opt[@]}" --set activation.offload=cpu --set activation.offload_layers=8 --set target.host_memory_gib=128 --set train.deterministic=true)
s256k=("${host_opt[@]}" --set activation.offload=cpu --set activation.offload_layers=17 --set target.host_memory_gib=128
       --set activation.checkpoint=attention_output --set activation.attention_output_layers=21)
ring=("${host_opt[@]}" --set parallel.sequence.size=2 --set parallel.sequence.mode=zigzag_ring --set activation.attention_head_groups=4
      --set activation.offload=cpu --set train.deterministic=false)
s512=("${ring[@]}" --set activation.offload_layers=12)
z512=("${host_opt[@]}" --set parallel.sequence.size=2 --set parallel.sequence.mode=zigzag_ring --set activation.attention_head_groups=4
      --set train.deterministic=false --set parallel.zero.stage=3)
p512=("${z512[@]}" --set parallel.zero.offload_params=true)
slice=("${ring[@]}" --set model.config=configs/models/llama2-7b-4layers.yaml)
LAYERS=${LAYERS:-2}
[ "$LAYERS" = 1 ] && slice15=(--set model.config=configs/models/llama2-7b-1layer.yaml) ||
  slice15=(--set model.config=configs/models/llama2-7b-${LAYERS}layers.yaml)
slice15+=(--set activation.checkpoint=${CHECKPOINT:-layer} --set parallel.zero.stage=3 --set parallel.zero.offload_params=true --set parallel.zero.offload_grads=true
          --set activation.offload=cpu --set activation.attention_head_groups=8 --set train.deterministic=false
          --set target.host_memory_gib=128 --set data.path=${DATA:-.deps/long_data})
plan() {  # tokens, GPUs, host GiB, --sets...
  local seq=$1 gpus=$2 host=$3
  shift 3
  echo "== llama2-7b $seq tokens on $gpus x H200 ($host GiB host): $*"
  set +e
  "$BIN" "$CFG" --plan --set data.seq_length="$seq" --set target.gpu=H200 --set target.gpus_per_node="$gpus" \
    --set target.host_memory_gib="$host" "$@" | grep -E "GPU   peak|host  peak|^does not fit"
  set -e
}
case "$what" in
  plans)
    plan 262144 1 128 "${s256[@]}"
    plan 262144 1 128 "${s256k[@]}"
    plan 524288 2 251 "${s512[@]}"
    plan 524288 2 251 "${z512[@]}"
    plan 524288 2 251 "${p512[@]}"
    plan 1048576 2 251 "${slice[@]}"
    plan 1048576 2 2048 "${ring[@]}"  # the whole 7B: its host side needs a node with >= 410 GiB
    plan 1572864 1 128 "${slice15[@]}"
    ;;
  256k) RUNS="7b:262144" STEPS=$STEPS BIN=$BIN bash bench/run_train.sh "${s256[@]}" ;;
  256k-kept) RUNS="7b:262144" STEPS=$STEPS BIN=$BIN bash bench/run_train.sh "${s256k[@]}" ;;
  512k) LAUNCH="$LAUNCH" RUNS="7b:524288" STEPS=$STEPS BIN=$BIN bash bench/run_train.sh "${s512[@]}" ;;
  512k-zero3) LAUNCH="$LAUNCH" RUNS="7b:524288" STEPS=$STEPS BIN=$BIN bash bench/run_train.sh "${z512[@]}" ;;
  512k-params) LAUNCH="$LAUNCH" RUNS="7b:524288" STEPS=$STEPS BIN=$BIN bash bench/run_train.sh "${p512[@]}" ;;
  1.5m-slice) RUNS="7b:1572864" STEPS=$STEPS BIN=$BIN bash bench/run_train.sh "${slice15[@]}" ;;
  1m-slice) LAUNCH="$LAUNCH" RUNS="7b:1048576" STEPS=$STEPS BIN=$BIN bash bench/run_train.sh "${slice[@]}" ;;
  *) echo "usage: bash bench/run_memory.sh plans|256k|512k|512k-zero3|512k-params|1m-slice|1.5m-slice" >&2; exit 2 ;;
esac
