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
source "$(dirname "${BASH_SOURCE[0]}")/device_pack.sh"
D=.deps/families
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    pack_device_dir $D "$build" easyctx_train test_cuda_trainer test_golden
    tok=$(bash scripts/make_demo_tokenizer.sh .deps/tok)
    python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' .deps/tok/kjv.txt > $D/kjv.jsonl
    "$build/bin/h5tokenize" -t "$tok" -o $D/kjv --deflate 6 $D/kjv.jsonl > /dev/null && rm $D/kjv.jsonl
    cp tests/golden/make_golden.py tests/golden/make_golden_families.py tests/golden/check_export.py bench/device_pack.sh $D/
    cp ../shared/bench/peer_hf_llama.py $D/ 2>/dev/null || echo "no ../shared/bench/peer_hf_llama.py: no peer" >&2
    du -sh $D
    ;;
  run)
    T0=$(date +%s)
    t() { echo "== [$(($(date +%s) - T0)) s] $*"; }
    unpack_device_dir $D
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
      LAUNCH="timeout -s KILL $((left / 2))" timeout $((left - 5)) bash bench/run_train.sh --set data.path=$D/kjv
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
