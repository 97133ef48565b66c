#!/usr/bin/env bash
# Every CUDA correctness suite of the GPU tests in one device call, for a commit whose CUDA code
# changed and has not met a GPU yet: each test binary against the CPU reference, with a gtest
# filter and a share of the deadline, then a summary (passed, failed, not run per binary). No
# timing here: speed is bench/run_speed_families.sh's. Everything the call needs is carried in
# .deps/gpucheck (git-ignored), made here by `prepare`; run from the repository root.
#
#   here:    bash bench/run_gpu_checks.sh prepare [BUILD_DIR]
#            .deps/gpucheck: the test binaries of CHECKS that exist in BUILD_DIR/bin (stripped,
#            xz) and the host libraries the GPU image lacks (device_pack.sh); about 23 MB
#   there:   [DEADLINE_S=540] [CHECKS="..."] bash bench/run_gpu_checks.sh run   (carry .deps/gpucheck)
#            -> $OUT/summary.txt, $OUT/logs.tar.gz (NN-<binary>.txt of each check that ended; a call
#            brings back at most 8 files of $OUT, and there are 10 binaries), and $OUT/<binary>.txt
#            of the one running when the call was cut short
#   CHECKS: space-separated BINARY[%FILTER[%SECONDS]] (a gtest filter holds colons; default
#   below: the suites the kernels, the optimizer split and offload, LoRA, sliding windows and the
#   evaluations' forward (forward_score, dynamic RoPE per item) touch).
set -uo pipefail
set -f  # (the checks hold gtest patterns: never globbed)
source "$(dirname "${BASH_SOURCE[0]}")/device_pack.sh"
D=.deps/gpucheck
# In the order of what most runs depend on (the deadline cuts the tail): the Hopper attention
# kernels' own suites (every variant; the path of every causal head-dim-128 call on sm_90), the
# routed attention, the windows, the ops (RMSNorm lane groups, LM head), then whole models.
DEFAULT_CHECKS="test_cuda_attention_sm90%*%60 test_cuda_attention_sm90_bwd%*%60 test_cuda_attention%*%90 \
test_cuda_windows%*%60 test_cuda_ops%*%50 test_cuda_trainer%*%150 test_cuda_lora%*%80 test_cuda_documents%*%50 \
test_cuda_eval%CudaEval.*%40 test_cuda_sp%*%40"
CHECKS=${CHECKS:-$DEFAULT_CHECKS}
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    bins=()
    for c in $CHECKS; do
      b=${c%%\%*}
      if [ -x "$build/bin/$b" ]; then bins+=("$b"); else echo "not built, left out: $b"; fi
    done
    set +f  # (device_pack.sh globs)
    pack_device_dir $D "$build" "${bins[@]}"
    git log -1 --format='%H %s' > $D/commit.txt
    du -sh $D
    ;;
  run)
    T0=$(date +%s)
    DEADLINE_S=${DEADLINE_S:-540}
    unpack_device_dir $D
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    echo "binaries built at: $(cat $D/commit.txt 2>/dev/null)"
    : > "$OUT/summary.txt"
    logs=/tmp/gpucheck-logs
    rm -rf "$logs" && mkdir -p "$logs" && n=0
    for c in $CHECKS; do
      IFS=% read -r b filter secs <<< "$c"
      filter=${filter:-*}
      secs=${secs:-120}
      left=$((T0 + DEADLINE_S - $(date +%s)))
      if [ ! -x "$D/bin/$b" ]; then
        printf '%-24s not carried\n' "$b" | tee -a "$OUT/summary.txt"
        continue
      fi
      if [ "$left" -lt 15 ]; then
        printf '%-24s not run (deadline)\n' "$b" | tee -a "$OUT/summary.txt"
        continue
      fi
      [ "$secs" -gt "$left" ] && secs=$left
      echo "== [$(($(date +%s) - T0)) s] $b --gtest_filter=$filter (at most $secs s)"
      timeout "$secs" "$D/bin/$b" --gtest_filter="$filter" > "$OUT/$b.txt" 2>&1
      rc=$?
      passed=$(grep -c '^\[       OK \]' "$OUT/$b.txt")
      failed=$(grep -c '^\[  FAILED  \] .*(' "$OUT/$b.txt")
      skipped=$(grep -c '^\[  SKIPPED \] .*(' "$OUT/$b.txt")
      printf '%-24s rc %-3s passed %-3s failed %-3s skipped %-3s %s\n' "$b" "$rc" "$passed" "$failed" "$skipped" \
        "$( [ "$rc" = 124 ] && echo '(timed out)')" | tee -a "$OUT/summary.txt"
      grep '^\[  FAILED  \] .*(' "$OUT/$b.txt" | head -n 10
      n=$((n + 1))  # (numbered: CHECKS may name a binary twice, with two filters)
      mv "$OUT/$b.txt" "$logs/$(printf %02d $n)-$b.txt" && tar -C "$logs" -czf "$OUT/logs.tar.gz" .
    done
    echo "== [$(($(date +%s) - T0)) s] summary"
    cat "$OUT/summary.txt"
    ;;
  *)
    echo "usage: bash bench/run_gpu_checks.sh prepare [BUILD_DIR] | run" >&2
    exit 2
    ;;
esac
