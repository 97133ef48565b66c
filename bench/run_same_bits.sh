#!/usr/bin/env bash
# The same training run made by two builds of easyctx_train (a refactor must not change a
# bit): the demo model with head_dim 64 (configs/models/demo-hd64.yaml) on one GPU, several
# layouts of the parameters and activations, each run by BIN_A and BIN_B from the same random
# init on the same data; every step's loss and gradient norm must be equal to the last bit
# (`train.deterministic: true`, set below). Also ZeRO-3 over one rank against stage 0 (the gather,
# reduce-scatter and fence path of lib/zero on NCCL, which must give stage 0's bits).
#
#   BIN_A=old/easyctx_train BIN_B=new/easyctx_train DATA=.deps/demo_data bash bench/run_same_bits.sh
#
# Prints one line per comparison and exits 1 if any differs. STEPS (default 20).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN_A=${BIN_A:?the first easyctx_train}
BIN_B=${BIN_B:?the second easyctx_train}
DATA=${DATA:-.deps/demo_data}
STEPS=${STEPS:-20}
DEVICE=${DEVICE:-cuda}
work=$(mktemp -d /tmp/same-bits.XXXXXX)
variants=(
  "stage0:"
  "zero3:--set parallel.zero.stage=3"
  "offload:--set parallel.zero.offload_optimizer=true"
  "zero3-offload-params:--set parallel.zero.stage=3 --set parallel.zero.offload_optimizer=true --set parallel.zero.offload_params=true"
  "act-offload-groups:--set activation.checkpoint=attention_output --set activation.offload=cpu --set activation.attention_head_groups=1 --set activation.mlp_tile=512"
  "act-partial:--set activation.checkpoint=attention_output --set activation.offload=cpu --set activation.offload_layers=2 --set activation.attention_output_layers=2"
  "act-none:--set activation.checkpoint=none"
)
run() {  # run BIN NAME ARGS...: prints the metrics path
  local bin=$1 name=$2
  shift 2
  local dir=$work/$name
  "$bin" configs/demo.yaml --set model.config=demo-hd64 --set train.device="$DEVICE" --set data.path="$DATA" \
    --set train.steps="$STEPS" --set train.warmup_steps=2 --set output.dir="$dir" --set output.save_final=false --set output.export_hf=false \
    --set activation.checkpoint=layer --set train.deterministic=true --resume none "$@" > "$dir.log" 2>&1 || { echo "FAIL $name: $(tail -n 3 "$dir.log")"; return 1; }
  echo "$dir/metrics.jsonl"
}
compare() {  # compare LABEL A B
  python3 - "$@" <<'PY'
import json, sys
label, a, b = sys.argv[1:]
ra = [json.loads(l) for l in open(a)]
rb = [json.loads(l) for l in open(b)]
same = len(ra) == len(rb) and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(ra, rb))
worst = max((abs(x["loss"] - y["loss"]) for x, y in zip(ra, rb)), default=float("nan"))
print(("SAME " if same else "DIFF ") + label + f": {len(ra)} vs {len(rb)} steps, loss {ra[-1]['loss']:.6f} vs "
      f"{rb[-1]['loss']:.6f}, max |loss diff| {worst:.3g}")
sys.exit(0 if same else 1)
PY
}
status=0
for v in "${variants[@]}"; do
  name=${v%%:*}
  read -r -a args <<< "${v#*:}"
  a=$(run "$BIN_A" "$name-a" "${args[@]}") || { echo "$a"; status=1; continue; }
  b=$(run "$BIN_B" "$name-b" "${args[@]}") || { echo "$b"; status=1; continue; }
  compare "$name: A vs B" "$a" "$b" || status=1
done
compare "B: zero3 (one rank) vs stage0" "$work/zero3-b/metrics.jsonl" "$work/stage0-b/metrics.jsonl" || true
compare "B: zero3 + offloads vs offload" "$work/zero3-offload-params-b/metrics.jsonl" "$work/offload-b/metrics.jsonl" || true
rm -rf "$work"
exit $status
