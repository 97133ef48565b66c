#!/usr/bin/env bash
# The README demo (configs/demo.yaml, 300 steps) trained twice from the same random init on
# the same data: once on the CPU backend (fp32) and once on one GPU (CUDA backend: bf16
# parameters, fp32 gradients/master/Adam), then both loss curves side by side every 25 steps
# and the tokens/s of each (mean over the steps after the first 10).
#
# The CUDA attention takes head dims 64 and 128 and the demo model has 32, so BOTH runs use
# configs/models/demo-hd64.yaml (same size: 2 query heads of 64 on 1 KV head) by default.
#
# Data: the demo's h5tokenize output. A GPU host usually has no data tools (no PCRE2), so
# tokenize on a CPU host first (scripts/demo.sh, or make_kjv_corpus.sh +
# make_demo_tokenizer.sh + h5tokenize) and carry the folder, e.g. .deps/demo_data.
#
# Environment: DATA (default .deps/demo_data, else out/demo/data), OUT (default
# out/demo_gpu_vs_cpu), STEPS (300), MODEL (demo-hd64), EASYCTX_TRAIN (a built easyctx_train
# with CUDA; default: build BUILD_DIR=build-gpu, target app_easyctx_train, with
# EXTRA_CMAKE flags), SKIP_CPU=1 / SKIP_GPU=1. Extra arguments go to both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OUT=${OUT:-out/demo_gpu_vs_cpu}
STEPS=${STEPS:-300}
MODEL=${MODEL:-demo-hd64}
if [ -z "${DATA:-}" ]; then
  if [ -d .deps/demo_data ]; then DATA=.deps/demo_data; else DATA=out/demo/data; fi
fi
[ -e "$DATA" ] || { echo "demo_gpu_vs_cpu: no token data at $DATA (see the header)" >&2; exit 1; }
mkdir -p "$OUT"
if [ -z "${EASYCTX_TRAIN:-}" ]; then
  BUILD_DIR=${BUILD_DIR:-build-gpu}
  cmake -S . -B "$BUILD_DIR" -G Ninja -DEASYCTX_CUDA=ON ${EXTRA_CMAKE:-} >"$OUT/cmake.log" 2>&1 \
    || { tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C "$BUILD_DIR" -j "$(nproc)" app_easyctx_train >"$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  EASYCTX_TRAIN=$BUILD_DIR/bin/easyctx_train
fi

run() {  # run NAME DEVICE
  local name=$1 dev=$2
  shift 2
  rm -rf "$OUT/$name"
  local t0=$SECONDS
  "$EASYCTX_TRAIN" configs/demo.yaml --resume none --set train.device="$dev" --set model.config="$MODEL" \
    --set data.path="$DATA" --set output.dir="$OUT/$name" --set train.steps="$STEPS" --set logging.every=25 \
    "$@" >"$OUT/$name.log" 2>&1 || { echo "$name run failed:"; tail -20 "$OUT/$name.log"; return 1; }
  echo "$name: $((SECONDS - t0)) s wall (log $OUT/$name.log)"
}
shift_args=("$@")
[ -n "${SKIP_CPU:-}" ] || run cpu cpu "${shift_args[@]}"
[ -n "${SKIP_GPU:-}" ] || run gpu cuda "${shift_args[@]}"

python3 - "$OUT" "$STEPS" <<'EOF'
import json, os, sys
out, steps = sys.argv[1], int(sys.argv[2])
def load(name):
    p = os.path.join(out, name, "metrics.jsonl")
    if not os.path.exists(p):
        return {}
    return {r["step"]: r for r in map(json.loads, open(p))}
cpu, gpu = load("cpu"), load("gpu")
print(f"{'step':>5} | {'loss cpu (fp32)':>15} | {'loss gpu (bf16)':>15} | {'diff':>8}")
for s in [1] + list(range(25, steps + 1, 25)):
    a, b = cpu.get(s, {}).get("loss"), gpu.get(s, {}).get("loss")
    fa = f"{a:15.4f}" if a is not None else f"{'-':>15}"
    fb = f"{b:15.4f}" if b is not None else f"{'-':>15}"
    d = f"{b - a:+8.4f}" if a is not None and b is not None else f"{'':>8}"
    print(f"{s:5d} | {fa} | {fb} | {d}")
def tps(m):
    v = [r["tokens_per_s"] for s, r in m.items() if s > 10]
    return sum(v) / len(v) if v else float("nan")
for name, m in (("cpu", cpu), ("gpu", gpu)):
    if not m:
        continue
    last = m[max(m)]
    extra = ""
    if "mfu" in last:
        extra += f", MFU {100 * last['mfu']:.3f}%"
    if "peak_mem_gib" in last:
        extra += f", peak mem {last['peak_mem_gib']:.2f} GiB"
    print(f"{name}: {tps(m):,.0f} tokens/s (mean of steps > 10), final loss {last['loss']:.4f}, "
          f"{last['elapsed']:.1f} s{extra}")
EOF
