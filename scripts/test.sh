#!/usr/bin/env bash
# The test suite: set up, build, run every ctest test (labels unit, mpi, gpu, slurm, e2e).
# GPU tests skip with a message where there is no GPU. Extra arguments go to ctest
# (e.g. scripts/test.sh -L unit).
set -euo pipefail
# Spin-waiting OpenMP threads starve MPI ranks that share cores; results do not depend on it.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
