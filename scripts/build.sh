#!/usr/bin/env bash
# Configures and builds easyctx into build/ (programs in build/bin/). The CUDA backend is
# built when nvcc is found (EASYCTX_CUDA=AUTO); pass -DEASYCTX_CUDA=OFF to skip it, or any
# other CMake flags, as arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
