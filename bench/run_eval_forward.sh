#!/usr/bin/env bash
# Forward-only evaluation on one GPU (issue 23), from the repository root of a GPU host after
# building build-gpu (bench/gpu_host_env.sh) or with `source bench/prebuilt.sh env`:
#   bash bench/run_eval_forward.sh plans  # no GPU needed: the plans of the runs below (H200)
#   bash bench/run_eval_forward.sh speed  # llama2-7b and the 1B shape at 32K and 128K (every
#                                         # prediction scored, as the peer's loss), then
#                                         # ../shared/bench/peer_hf_forward.py in the same call
#   bash bench/run_eval_forward.sh 1m     # llama2-7b at 1M tokens, one forward (the warm-up
#                                         # pass is the measurement), the plan beside the peak;
#                                         # attention in HG (default 4) head groups: 8 heads per
#                                         # call keep q/o under 2^31 elements (HG=1: one call)
# Random weights (random:PRESET): speed and memory do not depend on them. One JSON line per
# run (bench_forward: s per forward, tokens_per_s, peak_gib = the backend's allocation peak,
# plan_peak_gib, device_used_gib), the plan-vs-measured line, and the peer's lines.
# B: the binaries' folder (default build-gpu/bin, or .deps/gpubin from prebuilt.sh);
# PEER_SCRIPT: the peer (default ../shared/bench/peer_hf_forward.py, else .deps/).
set -euo pipefail
what=${1:-speed}
B=${B:-build-gpu/bin}
[ -x "$B/bench_forward" ] || B=build/bin  # plans only need a CPU build
PEER_SCRIPT=${PEER_SCRIPT:-../shared/bench/peer_hf_forward.py}
[ -f "$PEER_SCRIPT" ] || PEER_SCRIPT=.deps/peer_hf_forward.py
plan() {  # model tokens [flags]
  local model=$1 seq=$2
  shift 2
  echo "== $model at $seq tokens on one H200 $*"
  set +e
  "$B/easyctx_eval_ppl" --model "random:$model" --device cuda --set target.gpu=H200 --plan --tokenized none \
    --min-tokens 2 --max-tokens "$seq" --tokens-step 1 --output-file /dev/null "$@" | grep -E "GPU   peak|^does not fit"
  set -e
}
case "$what" in
  plans)
    plan llama2-7b 32768; plan llama2-7b 131072; plan tinyllama-1b 131072; plan llama2-7b 1048576
    plan llama2-7b 1048576 --attention-head-groups "${HG:-4}" ;;
  speed)
    "$B/bench_forward" --model random:llama2-7b --tokens 32768,131072 --reps 2 --device cuda
    "$B/bench_forward" --model random:tinyllama-1b --tokens 32768,131072 --reps 2 --device cuda
    python3 "$PEER_SCRIPT" ;;
  1m)
    "$B/bench_forward" --model random:llama2-7b --tokens 1048576 --reps 0 --device cuda \
      --attention-head-groups "${HG:-4}" ;;
  *) echo "usage: bash bench/run_eval_forward.sh plans|speed|1m" >&2; exit 2 ;;
esac
