#!/usr/bin/env bash
# One seed of the H200 context-extension experiment in one device call (docs/results.md):
# the prebuilt programs and inputs carried in .deps (made here by `prepare`), the run, and its
# results packed into $OUT for the trip back. Collect the seeds with
# `bash bench/extension_seeds.sh collect OUT.md seed-*.tar.gz`.
#
#   here:    bash bench/run_extension_device.sh prepare [BUILD_DIR]
#            .deps/gpubin, .deps/gpulibs (bench/prebuilt.sh pack), .deps/tok (the demo
#            tokenizer and the KJV's verses it was trained on) and .deps/text (the stages'
#            other text: scripts/make_text_corpus.sh); carry the four (about 55 MB)
#   there:   bash bench/run_extension_device.sh run SEED[,SEED...] [LIMIT_S]
#            runs bench/run_extension.sh h200 for SEED under `timeout LIMIT_S` (default 540),
#            then packs what it wrote into $OUT/seed-SEED.tar.gz and its log into
#            $OUT/seed-SEED.log, even when it failed or ran out of time; several seeds run
#            side by side on the one GPU
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    bash bench/prebuilt.sh pack "$build" easyctx_train easyctx_eval_needle easyctx_eval_ppl easyctx_report h5synth
    # The tokenizer programs' SentencePiece, which the GPU host's image may lack.
    cp -L /usr/lib/x86_64-linux-gnu/libsentencepiece.so.0 .deps/gpulibs/
    bash scripts/make_demo_tokenizer.sh .deps/tok > /dev/null
    bash scripts/make_text_corpus.sh .deps/text > /dev/null
    du -sh .deps/gpubin .deps/gpulibs .deps/tok .deps/text
    ;;
  run)
    [ -n "${2:-}" ] || { echo "usage: run_extension_device.sh run SEED[,SEED...] [LIMIT_S]" >&2; exit 2; }
    IFS=, read -r -a seeds <<< "$2"
    limit=${3:-540}
    dest=${OUT:?run_extension_device.sh run: OUT (the folder a device call sends back) is not set}
    # shellcheck disable=SC1091
    source bench/prebuilt.sh env
    for b in "$B"/*; do
      ldd "$b" | grep -q "not found" && { echo "run_extension_device.sh: $b: $(ldd "$b" | grep 'not found' | tr -s ' \t' ' ')" >&2; exit 1; }
    done
    # Several seeds run side by side on the one GPU (each run is deterministic, so sharing the
    # GPU changes its wall time, not its numbers).
    pids=()
    for seed in "${seeds[@]}"; do
      (
        work=/tmp/extension-seed-$seed
        rm -rf "$work"
        B=.deps/gpubin TOKENIZER=.deps/tok/kjv_bpe2000.model KJV=.deps/tok/kjv.txt TEXT_DIR=.deps/text SEED=$seed \
          timeout "$limit" bash bench/run_extension.sh h200 "$work" > "$dest/seed-$seed.log" 2>&1
        rc=$?
        echo "run_extension.sh h200 seed $seed: exit $rc" >> "$dest/seed-$seed.log"
        bash bench/extension_seeds.sh pack "$work" "$dest/seed-$seed.tar.gz" >> "$dest/seed-$seed.log" 2>&1
        exit "$rc"
      ) &
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    for seed in "${seeds[@]}"; do echo "== seed $seed"; tail -n 30 "$dest/seed-$seed.log"; done
    exit "$rc"
    ;;
  *) echo "usage: run_extension_device.sh prepare [BUILD_DIR] | run SEED[,SEED...] [LIMIT_S]" >&2; exit 2 ;;
esac
