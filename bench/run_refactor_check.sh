#!/usr/bin/env bash
# A change that must not alter results or speed, checked on one GPU against the build before it,
# in one device call. From the repository root, after `source bench/prebuilt.sh env`:
#
#   A=DIR_BEFORE B=DIR_AFTER WHAT="tests bits kernels" bash bench/run_refactor_check.sh
#   A=DIR_BEFORE B=DIR_AFTER WHAT=steps RUNS="7b:65536 7b:131072" STEPS=2 bash bench/run_refactor_check.sh
#
# A and B hold the two builds' binaries (easyctx_train, bench_attention and, in B, the gpu test
# programs). WHAT picks the parts:
#   tests    B's GPU tests: the ops, the routed attention, both Hopper kernels against the CPU
#            reference, the trainer (resume, offload and ZeRO-3 bit for bit) and the evaluations
#   bits     bench/run_same_bits.sh: the same training run by A and B, every step's loss and
#            gradient norm equal to the last bit, over the activation and parameter placements
#   kernels  bench_attention's Hopper forward and backward, A then B on the same GPU
#   steps    bench/run_before_after.sh: whole training steps of A and B alternated (RUNS, STEPS,
#            REPEAT), tokens/s and the trainer's memory line (plan against measurement)
# Exits non-zero if a test fails or a bit differs; the speed parts only print.
set -uo pipefail
cd "$(dirname "$0")/.."
A=${A:?the directory of the build before}
B=${B:?the directory of the build after}
WHAT=${WHAT:-tests bits kernels}
status=0
part() { echo "=== $* ($(date +%T))"; }
for w in $WHAT; do
  case $w in
    tests)
      for t in test_cuda_ops test_cuda_attention test_cuda_attention_sm90 test_cuda_attention_sm90_bwd test_cuda_trainer \
               test_cuda_eval; do
        [ -x "$B/$t" ] || continue
        part "$t"
        "$B/$t" 2>&1 | grep -E "^\[  (PASSED|FAILED) |^\[  SKIPPED|FAILED TEST|rel err|bit" | tail -n 12
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done
      ;;
    bits)
      part "same bits"
      BIN_A=$A/easyctx_train BIN_B=$B/easyctx_train bash bench/run_same_bits.sh || status=1
      ;;
    kernels)
      # (only the variants the router runs: the build before had more, kept for benches)
      for args in "--sm90-only --sm90-variant persistent wide" "--sm90-bwd-only --sm90-variant atomic-split deterministic-split"; do
        for build in A B; do
          dir=$A
          [ $build = B ] && dir=$B
          part "bench_attention $args ($build)"
          "$dir/bench_attention" $args 2>&1 | tail -n 40
        done
      done
      ;;
    steps)
      part "training steps ${RUNS:-}"
      BIN_A=$A/easyctx_train BIN_B=$B/easyctx_train RUNS=${RUNS:-"7b:65536"} REPEAT=${REPEAT:-1} \
        bash bench/run_before_after.sh
      ;;
    *) echo "run_refactor_check.sh: unknown part '$w' (tests, bits, kernels, steps)" >&2; exit 2 ;;
  esac
done
exit $status
