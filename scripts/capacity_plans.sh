#!/usr/bin/env bash
# Context per GPU by the memory plan: the longest sequence (a multiple of 64K tokens) that a
# full fine-tune (fp32 master weights and Adam, batch 1) of llama2-7b and llama3-8b fits on
# 1 and 8 H200s of one node, with the knobs that save GPU memory, each set added in turn.
# No GPU needed (easyctx_train STAGE --plan with a target); what docs/memory-model.md's
# "Context per GPU" table shows.
#
#   bash scripts/capacity_plans.sh            # Markdown table on stdout
#
# BIN: the folder of easyctx_train (default build/bin). HOST_GIB: host memory per node the
# plans assume (default 2048: ALST's and the issue's figures assume host memory is not the
# limit; the table states the host memory each fit needs).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
HOST_GIB=${HOST_GIB:-2048}
[ -x "$BIN/easyctx_train" ] || { echo "capacity_plans.sh: $BIN/easyctx_train not found (bash scripts/build.sh, or set BIN)" >&2; exit 2; }
STAGE=configs/recipes/llama3-8b-1m/s5-1m.yaml  # (its model, init, data and sizes are overridden below)

# The knob sets, each a superset of the one before (the last swaps the checkpoint policy).
declare -a NAMES SETS
NAMES+=("attention_output (recipe)")
SETS+=("activation.checkpoint=attention_output parallel.zero.stage=3 parallel.zero.offload_optimizer=true")
NAMES+=("+ layer checkpoints in host memory, 8 head groups")
SETS+=("${SETS[0]} activation.checkpoint=layer activation.offload=cpu activation.attention_head_groups=8")
NAMES+=("+ offload_params")
SETS+=("${SETS[1]} parallel.zero.offload_params=true")
NAMES+=("+ offload_grads")
SETS+=("${SETS[2]} parallel.zero.offload_grads=true")
# The same with attention_output instead of layer: each group's attention output streamed to
# host memory (one attention forward per layer and step instead of three; more host memory).
NAMES+=("the same with attention_output (streamed)")
SETS+=("${SETS[3]} activation.checkpoint=attention_output")

# plan MODEL GPUS TOKENS KNOBS -> prints "fits|no GPU_GIB HOST_GIB"
plan() {
  local args=(--set "model.config=$1" --set model.init=random --set "data.seq_length=$3" --set "parallel.sequence.size=$2"
              --set target.gpu=H200 --set "target.gpus_per_node=$2" --set target.nodes=1 --set "target.host_memory_gib=$HOST_GIB"
              --set output.export_hf=false)
  local s
  for s in $4; do args+=(--set "$s"); done
  local out rc=0
  out=$("$BIN/easyctx_train" "$STAGE" --plan-json "${args[@]}" 2>&1 | tail -n 1) || rc=$?
  local gpu host
  gpu=$(grep -o '"device_total_bytes":[0-9]*' <<<"$out" | head -n 1 | cut -d: -f2)
  host=$(grep -o '"per_node_peak_bytes":[0-9]*' <<<"$out" | head -n 1 | cut -d: -f2)
  [ -n "$gpu" ] || { echo "capacity_plans.sh: no plan for $1 on $2 GPUs at $3 tokens: $out" >&2; exit 1; }
  awk -v f="$([ "$rc" = 0 ] && echo fits || echo no)" -v g="$gpu" -v h="$host" \
    'BEGIN { printf "%s %.1f %.0f\n", f, g / 2^30, h / 2^30 }'
}

echo "| model | GPUs | knobs | longest that fits | GPU GiB (plan) | host GiB per node |"
echo "|---|---|---|---|---|---|"
for model in llama2-7b llama3-8b; do
  for gpus in 1 8; do
    for i in "${!SETS[@]}"; do
      lo=0 hi=$(( 48 * gpus ))  # in units of 65536 tokens
      while [ $(( hi - lo )) -gt 1 ]; do
        mid=$(( (lo + hi) / 2 ))
        if [ "$(plan "$model" "$gpus" $(( mid * 65536 )) "${SETS[$i]}" | cut -d' ' -f1)" = fits ]; then lo=$mid; else hi=$mid; fi
      done
      if [ "$lo" = 0 ]; then
        echo "| $model | $gpus | ${NAMES[$i]} | below 64K | | |"
        continue
      fi
      read -r _ g h < <(plan "$model" "$gpus" $(( lo * 65536 )) "${SETS[$i]}")
      printf '| %s | %d | %s | %s | %s | %s |\n' "$model" "$gpus" "${NAMES[$i]}" "$(( lo * 65536 ))" "$g" "$h"
    done
  done
done
