#!/usr/bin/env bash
# The test suite: set up, build, run every ctest test (labels unit, mpi, gpu, slurm, e2e).
# Every GoogleTest case is its own ctest entry (BINARY[_npN]:Suite.Case); GPU tests skip with
# a message where there is no GPU, and a skip shows as "Skipped", not "Passed". Extra
# arguments go to ctest (e.g. scripts/test.sh -L unit). Ends with tests/test_report.sh: the
# skipped entries with their reasons and the GoogleTest case counts. With
# EASYCTX_ALLOWED_SKIPS=FILE (.ci/run) a skip that FILE does not allow fails the run.
set -euo pipefail
# Spin-waiting OpenMP threads starve MPI ranks that share cores; results do not depend on it.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
bash scripts/setup.sh
bash scripts/build.sh
rm -rf "$build/test-results"  # the report covers this run only
rc=0
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --output-junit test-results/ctest-junit.xml "$@" || rc=$?
bash tests/test_report.sh "$build" ${EASYCTX_ALLOWED_SKIPS:+--allowed-skips "$EASYCTX_ALLOWED_SKIPS"} || rc=1
exit "$rc"
