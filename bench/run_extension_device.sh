#!/usr/bin/env bash
# One seed of the GPU context-extension proof in one device call (docs/results.md): the
# prebuilt programs, the corpus and the tokenizer carried in .deps/extension (made here by
# `prepare`), bench/run_extension.sh gpu under a time limit, its results packed into $OUT.
#
#   here:   bash bench/run_extension_device.sh prepare [BUILD_DIR]
#           .deps/extension: the programs (stripped, xz), the host libraries the GPU image
#           lacks (bench/device_pack.sh's list and SentencePiece), the corpus
#           (scripts/make_text_corpus.py, tar.xz) and its tokenizer
#           (scripts/make_text_tokenizer.sh); carry .deps/extension (its size is printed)
#   there:  bash bench/run_extension_device.sh run SEED [full|ablation|pilot] [LIMIT_S]
#           full (default): the base and the three stages, every evaluation; ablation: the
#           same and the ablation arm (the stages at the base's RoPE theta); pilot: the base
#           and the 8K stage, a few timed steps of the 32K and 64K stages, the evaluation to
#           8K and the projected minutes of a full seed. Runs under `timeout LIMIT_S`
#           (default 540; optional phases are skipped when they would end after LIMIT_S - 45),
#           then writes the tables of whatever finished and packs them into
#           $OUT/seed-SEED[-MODE].tar.gz, the log into $OUT/seed-SEED[-MODE].log, also when the
#           run failed or ran out of time; prints the tables and the targets
#   here:   bash bench/run_extension_device.sh collect FILES_AT [DEST]
#           the packs and logs into DEST (default bench/extension/<today>) and
#           bench/extension_seeds.sh collect's seeds.md over every seed there
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_pack.sh
D=.deps/extension
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    pack_device_dir $D "$build" easyctx_train easyctx_eval_needle easyctx_eval_ppl h5tokenize h5recall h5inspect
    cp -L /usr/lib/x86_64-linux-gnu/libsentencepiece.so.0 $D/gpulibs/  # the GPU image has none
    rm -rf /tmp/extension-corpus && mkdir -p /tmp/extension-corpus
    python3 scripts/make_text_corpus.py /tmp/extension-corpus/corpus
    bash scripts/make_text_tokenizer.sh /tmp/extension-corpus/corpus $D/tok 4096 > /dev/null
    tar -C /tmp/extension-corpus -cf - corpus | xz -T2 -6 > $D/corpus.tar.xz
    du -sh $D $D/*
    ;;
  run)
    [ -n "${2:-}" ] || { echo "usage: run_extension_device.sh run SEED [full|ablation|pilot] [LIMIT_S]" >&2; exit 2; }
    seed=$2 what=${3:-full} limit=${4:-540}
    dest=${OUT:?run_extension_device.sh run: OUT (the folder a device call sends back) is not set}
    case "$what" in
      full) env=(MODE=full ABLATION=0) tag=$seed ;;
      ablation) env=(MODE=full ABLATION=1) tag=$seed-ablation ;;
      pilot) env=(MODE=pilot ABLATION=0) tag=$seed-pilot ;;
      *) echo "run_extension_device.sh: '$what' (full, ablation or pilot)" >&2; exit 2 ;;
    esac
    unpack_device_dir $D
    for b in $D/bin/*; do
      ldd "$b" | grep -q "not found" && { echo "run_extension_device.sh: $b: $(ldd "$b" | grep 'not found' | tr -s ' \t' ' ')" >&2; exit 1; }
    done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    rm -rf /tmp/extension-corpus && mkdir -p /tmp/extension-corpus && tar -C /tmp/extension-corpus -xJf $D/corpus.tar.xz
    work=/tmp/extension-seed-$tag
    rm -rf "$work"
    env "${env[@]}" B=$D/bin CORPUS=/tmp/extension-corpus/corpus TOKENIZER=$D/tok/text_bpe4096.model SEED="$seed" \
      DEADLINE_S=$((limit - 45)) THREADS=16 timeout "$limit" bash bench/run_extension.sh gpu "$work" \
      > "$dest/seed-$tag.log" 2>&1
    rc=$?
    echo "run_extension.sh gpu seed $seed ($what): exit $rc" >> "$dest/seed-$tag.log"
    # A run cut short has no tables yet: make them from what it evaluated.
    [ $rc -ne 0 ] && [ -d "$work/eval" ] && bash bench/extension_seeds.sh tables "$work" >> "$dest/seed-$tag.log" 2>&1
    bash bench/extension_seeds.sh pack "$work" "$dest/seed-$tag.tar.gz" >> "$dest/seed-$tag.log" 2>&1
    grep -E '^(phase |s[0-9]|abl-|eval |isolation|projected|run_extension)' "$dest/seed-$tag.log" | cut -c1-200
    cat "$work/accuracy.md" "$work/targets.txt" 2> /dev/null
    exit "$rc"
    ;;
  collect)
    at=${2:?usage: run_extension_device.sh collect FILES_AT [DEST]}
    to=${3:-bench/extension/$(date -u +%Y-%m-%d)}
    mkdir -p "$to"
    cp "$at"/seed-*.tar.gz "$at"/seed-*.log "$to"/ 2> /dev/null
    packs=("$to"/seed-*.tar.gz)
    [ -e "${packs[0]}" ] || { echo "run_extension_device.sh: no seed-*.tar.gz in $at" >&2; exit 2; }
    bash bench/extension_seeds.sh collect "$to/seeds.md" "${packs[@]}"
    cat "$to/seeds.md"
    ;;
  *) echo "usage: run_extension_device.sh prepare [BUILD_DIR] | run SEED [full|ablation|pilot] [LIMIT_S] | collect FILES_AT [DEST]" >&2; exit 2 ;;
esac
