#!/usr/bin/env bash
# The GPU side of the model families (issue 43) in one device call: the transformers float64
# fixtures qwen2, qwen3 and yarn (tests/golden/make_golden_families.py) and test_golden on them,
# easyctx's exports of them loaded by transformers (check_export.py), the CUDA family test
# (test_cuda_trainer Families/*: qwen2, qwen3, yarn bf16 against the fp32 CPU model), and
# qwen2.5-7b at 64K tokens beside the peer (bench/run_train.sh). Everything the call needs is
# carried in .deps/families (git-ignored), made here by `prepare`; run from the repository root.
#
#   here:    bash bench/run_families.sh prepare [BUILD_DIR]
#            .deps/families: easyctx_train, test_cuda_trainer, test_golden (stripped, xz), the
#            host libraries the GPU image lacks (bench/prebuilt.sh's list), a token shard of the
#            KJV (the demo tokenizer; the bench's data, vocabulary 2000 < every preset's), the
#            generators and the peer (about 10 MB)
#   there:   bash bench/run_families.sh run 2>&1 | tee $OUT/log.txt    (carry .deps/families)
#            $OUT/families.tar (the fixtures), golden_cpu.txt, families_cuda.txt,
#            train_results.jsonl (easyctx, then the peer)
#   here:    bash bench/run_families.sh collect FILES_AT
#            the fixtures into tests/golden/data/{qwen2,qwen3,yarn}; then add them to
#            test_golden.cpp's lists and commit them
set -uo pipefail
D=.deps/families
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    rm -rf $D && mkdir -p $D/stage $D/gpulibs
    cp "$build/bin/easyctx_train" "$build/bin/test_cuda_trainer" "$build/bin/test_golden" $D/stage/ && strip $D/stage/*
    tar -C $D/stage -cf - . | xz -T2 -6 > $D/bins.tar.xz && rm -rf $D/stage
    for l in libboost_program_options.so.1.74.0 libyaml-cpp.so.0.7 libhdf5_serial.so.103 libsz.so.2 libaec.so.0; do
      cp -L "$(ls /lib/x86_64-linux-gnu/$l /usr/lib/x86_64-linux-gnu/$l 2>/dev/null | head -n 1)" $D/gpulibs/
    done
    tok=$(bash scripts/make_demo_tokenizer.sh .deps/tok)
    python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' .deps/tok/kjv.txt > $D/kjv.jsonl
    "$build/bin/h5tokenize" -t "$tok" -o $D/kjv --deflate 6 $D/kjv.jsonl > /dev/null && rm $D/kjv.jsonl
    cp tests/golden/make_golden.py tests/golden/make_golden_families.py tests/golden/check_export.py $D/
    cp ../shared/bench/peer_hf_llama.py $D/ 2>/dev/null || echo "no ../shared/bench/peer_hf_llama.py: no peer" >&2
    du -sh $D
    ;;
  run)
    T0=$(date +%s)
    t() { echo "== [$(($(date +%s) - T0)) s] $*"; }
    mkdir -p $D/bin && tar -C $D/bin -xJf $D/bins.tar.xz
    cudnn=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cudnn", "lib"))' 2>/dev/null)
    export LD_LIBRARY_PATH=$PWD/$D/gpulibs${cudnn:+:$cudnn}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export NCCL_NVLS_ENABLE=0 EASYCTX_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=16
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    t fixtures
    rm -rf /tmp/gf && timeout 120 python3 $D/make_golden_families.py --out /tmp/gf 2>&1 | grep -v -i warn | tail -6
    (cd /tmp/gf && tar -cf "$OUT/families.tar" .) && tar -C tests/golden/data -xf "$OUT/families.tar"
    t test_golden and the exports in transformers
    timeout 120 $D/bin/test_golden > "$OUT/golden_cpu.txt" 2>&1
    echo "test_golden rc $?"; grep -E "^\[ +(FAILED|PASSED) +\]|Failure" "$OUT/golden_cpu.txt" | head -20
    rm -rf /tmp/ex && EASYCTX_GOLDEN_EXPORT=/tmp/ex timeout 60 $D/bin/test_golden --gtest_filter='GoldenExport*' > /dev/null 2>&1
    timeout 120 python3 $D/check_export.py /tmp/ex tests/golden/data 2>&1 | grep -v -i warn | tail -8
    t CUDA families
    timeout 180 $D/bin/test_cuda_trainer --gtest_filter='Families/*' > "$OUT/families_cuda.txt" 2>&1
    echo "test_cuda_trainer rc $?"; grep -E "^\[ +(FAILED|PASSED) +\]|\[accuracy\]|Failure" "$OUT/families_cuda.txt" | head -30
    left=$((T0 + ${DEADLINE_S:-585} - $(date +%s)))
    t "qwen2.5-7b at 64K and the peer (${left} s left)"
    [ $left -gt 150 ] && RUNS=qwen2.5-7b:65536 STEPS=3 PEER=1 BIN=$D/bin/easyctx_train PEER_SCRIPT=$D/peer_hf_llama.py \
      LAUNCH="timeout $((left / 2))" timeout $((left - 5)) bash bench/run_train.sh --set data.path=$D/kjv
    t done
    ;;
  collect)
    at=${2:?usage: run_families.sh collect FILES_AT}
    [ -f "$at/families.tar" ] && tar -C tests/golden/data -xf "$at/families.tar" && ls -la tests/golden/data/{qwen2,qwen3,yarn}
    for f in golden_cpu.txt families_cuda.txt; do [ -f "$at/$f" ] && grep -E "PASSED|FAILED|accuracy" "$at/$f"; done
    [ -f "$at/train_results.jsonl" ] && cat "$at/train_results.jsonl"
    ;;
  *) echo "usage: run_families.sh prepare [BUILD_DIR] | run | collect FILES_AT" >&2; exit 2 ;;
esac
