#!/usr/bin/env bash
# On a GPU host: build the CUDA backend and run the NCCL collective tests and bandwidth
# benchmark on every visible GPU. Writes logs to $OUT (or out/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/bench}
mkdir -p "$OUT"
ngpu=$(nvidia-smi -L | wc -l)
BUILD_DIR=${BUILD_DIR:-build-gpu}
cmake -S . -B "$BUILD_DIR" -G Ninja -DEASYCTX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEASYCTX_DATA_TOOLS=${DATA_TOOLS:-ON} ${EXTRA_CMAKE:-} >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C "$BUILD_DIR" -j "$(nproc)" test_collectives_nccl bench_collectives >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
flags=(--allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0)
mpirun -np "$ngpu" "${flags[@]}" "$BUILD_DIR/bin/test_collectives_nccl" 2>&1 | tee "$OUT/test_collectives_nccl.log" | tail -12
mpirun -np "$ngpu" "${flags[@]}" "$BUILD_DIR/bin/bench_collectives" 2>&1 | tee "$OUT/bench_collectives.md"
