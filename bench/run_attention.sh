#!/usr/bin/env bash
# On a GPU host: build the CUDA backend, run the attention GPU tests, then the attention
# benchmark (the backend's routes, our kernels and, on sm_90, the Hopper forward beside
# cuDNN's on the same inputs) beside torch's SDPA (cuDNN / flash) in the same call. Logs and
# tables go to $OUT (or out/bench). Extra CMake flags: EXTRA_CMAKE (e.g.
# -DEASYCTX_DATA_TOOLS=OFF ...). With prebuilt binaries (`source bench/prebuilt.sh env`, which
# sets B) nothing is built: BIN_DIR=$B. Skip parts with SKIP_TESTS=1 / SKIP_BENCH=1 /
# SKIP_TORCH=1; SEQS overrides the lengths.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/bench}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
SEQS=${SEQS:-8192 32768 131072}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
TESTS="test_cuda_ops test_cuda_attention test_cuda_attention_sm90"
if [ -z "${BIN_DIR:-}" ]; then
  BIN_DIR=$BUILD_DIR/bin
  cmake -S . -B "$BUILD_DIR" -G Ninja -DEASYCTX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${ARCH:-90} ${EXTRA_CMAKE:-} \
    >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C "$BUILD_DIR" -j "$(nproc)" $TESTS bench_attention >"$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  for t in $TESTS; do
    [ -x "$BIN_DIR/$t" ] || { echo "$t: not in $BIN_DIR"; continue; }
    "$BIN_DIR/$t" >"$OUT/$t.log" 2>&1; echo "$t rc=$?"
  done
  grep -hE "FAILED|Failure|Expected|Which is|rel_error|error" "$OUT"/test_cuda_*.log | head -40
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) " "$OUT"/test_cuda_*.log
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  "$BIN_DIR/bench_attention" --seq $SEQS ${BENCH_ARGS:-} >"$OUT/bench_attention.md" 2>&1; echo "bench rc=$?"
fi
if [ -z "${SKIP_TORCH:-}" ]; then
  PYTHONUNBUFFERED=1 python3 bench/attention_torch.py --seq $SEQS >"$OUT/bench_attention_torch.md" 2>&1
  echo "torch rc=$?"
fi
cat "$OUT"/bench_attention*.md 2>/dev/null
