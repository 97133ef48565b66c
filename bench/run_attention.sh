#!/usr/bin/env bash
# On a GPU host: build the CUDA backend, run the GPU tests (label gpu), then the attention
# benchmark beside torch's SDPA (cuDNN / flash) in the same call. Logs and tables go to $OUT
# (or out/bench). Extra CMake flags: EXTRA_CMAKE (e.g. -DEASYCTX_DATA_TOOLS=OFF ...).
# Skip parts with SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_TORCH=1; SEQS overrides the lengths.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/bench}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
SEQS=${SEQS:-8192 32768 131072}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
cmake -S . -B "$BUILD_DIR" -G Ninja -DEASYCTX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${ARCH:-90} ${EXTRA_CMAKE:-} \
  >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C "$BUILD_DIR" -j "$(nproc)" test_cuda_ops test_cuda_attention bench_attention >"$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
if [ -z "${SKIP_TESTS:-}" ]; then
  "$BUILD_DIR/bin/test_cuda_ops" >"$OUT/test_cuda_ops.log" 2>&1; echo "test_cuda_ops rc=$?"
  "$BUILD_DIR/bin/test_cuda_attention" >"$OUT/test_cuda_attention.log" 2>&1; echo "test_cuda_attention rc=$?"
  grep -hE "FAILED|Failure|Expected|Which is|rel_error|error" "$OUT"/test_cuda_*.log | head -40
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) " "$OUT"/test_cuda_*.log
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  "$BUILD_DIR/bin/bench_attention" --seq $SEQS ${BENCH_ARGS:-} >"$OUT/bench_attention.md" 2>&1; echo "bench rc=$?"
fi
if [ -z "${SKIP_TORCH:-}" ]; then
  PYTHONUNBUFFERED=1 python3 bench/attention_torch.py --seq $SEQS >"$OUT/bench_attention_torch.md" 2>&1
  echo "torch rc=$?"
fi
cat "$OUT"/bench_attention*.md 2>/dev/null
