#!/usr/bin/env bash
# The test suite: set up, build, run every ctest test (labels unit, mpi, gpu, slurm, e2e).
# GPU tests skip with a message where there is no GPU. Extra arguments go to ctest
# (e.g. scripts/test.sh -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
