#!/usr/bin/env bash
# Run on a lent GPU host the binaries built on the development machine (Debian 12, gcc 12,
# CUDA 13.0 toolkit, sm_80 + sm_90), instead of configuring and building there: a device
# call then spends its minutes on the GPU, not on the compiler.
#
#   here:   bash bench/prebuilt.sh pack [BUILD_DIR] [binary ...]
#           copies the binaries (default: easyctx_train and the gpu test and bench programs)
#           into .deps/gpubin and the libraries the GPU host's image lacks or has in another
#           version (Boost.Program_options 1.74, yaml-cpp 0.7, HDF5 1.10 with libsz/libaec)
#           into .deps/gpulibs; both are git-ignored: name them (and .deps/demo_data) in the
#           device call's carry.
#   there:  source bench/prebuilt.sh env
#           sets LD_LIBRARY_PATH (those libraries, then cuDNN >= 9.19 from torch's wheel:
#           the image's system cuDNN is 9.14), NCCL_NVLS_ENABLE=0, EASYCTX_SOURCE_DIR and
#           EASYCTX_BIN_DIR for the tests, and B=.deps/gpubin.
# CUDA, cuBLASLt, NCCL, Open MPI (libmpi.so.40) and glibc come from the GPU host (same
# sonames, newer or equal versions). Used for every device call of 2026-11-30's stop 11
# (bench/RESULTS.md).
case "${1:-}" in
  pack)
    set -uo pipefail
    build=${2:-build-cuda}
    shift $(( $# >= 2 ? 2 : 1 ))
    bins=("$@")
    [ ${#bins[@]} -gt 0 ] || bins=(easyctx_train easyctx_eval_ppl test_cuda_ops test_cuda_attention test_cuda_attention_sm90 test_cuda_trainer
                                   test_cuda_sp test_collectives_nccl bench_attention bench_ring bench_collectives)
    # Only the binaries named now (a device call carries at most 64 MiB), stripped.
    rm -rf .deps/gpubin
    mkdir -p .deps/gpubin .deps/gpulibs
    for b in "${bins[@]}"; do
      [ -x "$build/bin/$b" ] || { echo "prebuilt.sh: $build/bin/$b missing (build it first)" >&2; exit 2; }
      cp "$build/bin/$b" .deps/gpubin/
      strip ".deps/gpubin/$b" 2>/dev/null || true
    done
    for l in libboost_program_options.so.1.74.0 libyaml-cpp.so.0.7 libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do
      src=$(ls /lib/x86_64-linux-gnu/$l /usr/lib/x86_64-linux-gnu/$l 2>/dev/null | head -n 1)
      [ -n "$src" ] || { echo "prebuilt.sh: $l not found here" >&2; exit 2; }
      cp -L "$src" .deps/gpulibs/
    done
    du -sh .deps/gpubin .deps/gpulibs
    ;;
  env)
    cudnn=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cudnn", "lib"))' 2>/dev/null)
    export LD_LIBRARY_PATH=$PWD/.deps/gpulibs${cudnn:+:$cudnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export NCCL_NVLS_ENABLE=0 EASYCTX_SOURCE_DIR=$PWD EASYCTX_BIN_DIR=$PWD/.deps/gpubin PYTHONUNBUFFERED=1
    export B=$PWD/.deps/gpubin
    missing=$(ldd "$B/easyctx_train" 2>/dev/null | grep "not found" || true)
    [ -z "$missing" ] || echo "prebuilt.sh: unresolved libraries: $missing" >&2
    ;;
  *)
    echo "usage: bash bench/prebuilt.sh pack [BUILD_DIR] [binary ...]  |  source bench/prebuilt.sh env" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
