#!/usr/bin/env bash
# The families' speed on one GPU in one device call (issue 52): the host's memory bandwidth
# beside the host AdamW's (bench_host_stream), then easyctx out of the box on each RUNS pair
# (bench/run_train.sh: STEPS steps, medians over those after the first; PROFILE=1 adds
# logging.profile, whose synchronisations cost a little: leave it off for reported tok/s),
# then the peer on each PEER_RUNS pair, all on the same GPU. Everything the call needs is
# carried in .deps/speed (git-ignored), made here by `prepare`; run from the repository root.
#
#   here:    bash bench/run_speed_families.sh prepare [BUILD_DIR]
#            .deps/speed: easyctx_train and bench_host_stream (stripped, xz), the host libraries
#            the GPU image lacks, a KJV token shard (the demo tokenizer: vocabulary 2000, below
#            every preset's) and the peer (about 6 MB)
#   there:   RUNS="qwen2.5-7b:32768 ..." PEER_RUNS="qwen3-4b:32768 ..." PROFILE=1 \
#              bash bench/run_speed_families.sh run          (carry .deps/speed)
#            $OUT/train_results.jsonl (one JSON line per run: easyctx's, then the peers'),
#            $OUT/host_stream.txt, $OUT/logs.tar.xz (each run's log, metrics.jsonl and
#            profile.json)
#   here:    bash bench/run_speed_families.sh collect FILES_AT   (the summary again, logs unpacked
#            into bench/logs/speed-<date>/)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_pack.sh"
D=.deps/speed
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    pack_device_dir $D "$build" easyctx_train bench_host_stream
    tok=$(bash scripts/make_demo_tokenizer.sh .deps/tok)
    python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' .deps/tok/kjv.txt > $D/kjv.jsonl
    "$build/bin/h5tokenize" -t "$tok" -o $D/kjv --deflate 6 $D/kjv.jsonl > /dev/null && rm $D/kjv.jsonl
    cp ../shared/bench/peer_hf_llama.py $D/
    du -sh $D
    ;;
  run)
    T0=$(date +%s)
    DEADLINE_S=${DEADLINE_S:-570}
    t() { echo "== [$(($(date +%s) - T0)) s] $*"; }
    left() { echo $((T0 + DEADLINE_S - $(date +%s))); }
    unpack_device_dir $D
    nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv,noheader
    echo "host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    git log -1 --format='commit %h %s' 2>/dev/null
    t host bandwidth
    OMP_NUM_THREADS=$(nproc) timeout 60 $D/bin/bench_host_stream --gib-per-array ${STREAM_GIB:-2} | tee "$OUT/host_stream.txt"
    extra=()
    [ "${PROFILE:-0}" = 1 ] && extra+=(--set logging.profile=true)
    rm -rf /tmp/easyctx-bench
    for run in ${RUNS:-qwen2.5-7b:32768}; do
      l=$(left)
      [ "$l" -gt 60 ] || { t "skip $run: ${l} s left"; continue; }
      t "easyctx $run (${l} s left)"
      RUNS=$run STEPS=${STEPS:-5} BIN=$D/bin/easyctx_train RESULTS=$OUT/train_results.jsonl \
        LAUNCH="timeout $((l - 20))" bash bench/run_train.sh --set data.path=$D/kjv "${extra[@]}" \
        | python3 -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l); print({k: r.get(k) for k in ("model", "seq", "rc", "tokens_per_s", "step_s", "fwd_bwd_s", "mfu", "peak_mem_gib")})'
    done
    for run in ${PEER_RUNS:-}; do
      l=$(left)
      [ "$l" -gt 60 ] || { t "skip peer $run: ${l} s left"; continue; }
      t "peer $run (${l} s left)"
      PEER_ONLY=1 RUNS=$run STEPS=${STEPS:-5} PEER_SCRIPT=$D/peer_hf_llama.py RESULTS=$OUT/train_results.jsonl \
        timeout $((l - 10)) bash bench/run_train.sh > /dev/null
    done
    (cd /tmp/easyctx-bench 2>/dev/null && tar -cJf "$OUT/logs.tar.xz" --exclude='*.h5' --exclude='checkpoints' .)
    t done
    bash bench/run_speed_families.sh summary "$OUT/train_results.jsonl"
    ;;
  summary)
    python3 - "${2:?usage: run_speed_families.sh summary RESULTS_JSONL}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
peer = {(r["model"], r["seq"]): r for r in rows if r.get("system") == "peer_hf_llama"}
print(f"{'model':14} {'seq':>7} {'tok/s':>7} {'step s':>7} {'fb s':>6} {'MFU':>6} {'GiB':>6} | {'peer tok/s':>10} {'fb s':>6} {'GiB':>6} | {'step x':>6} {'fb x':>5}")
for r in rows:
    if r.get("system") != "easyctx":
        continue
    p = peer.get((r["model"], r["seq"]), {})
    pt, pfb = p.get("tokens_per_s"), p.get("fwd_bwd_s")
    x = f"{r['tokens_per_s'] / pt:.3f}" if pt and r.get("tokens_per_s") else "-"
    fx = f"{pfb / r['fwd_bwd_s']:.3f}" if pfb and r.get("fwd_bwd_s", -1) > 0 else "-"
    print(f"{r['model']:14} {r['seq']:>7} {r.get('tokens_per_s', r.get('rc')):>7} {r.get('step_s', '-'):>7} "
          f"{r.get('fwd_bwd_s', '-'):>6} {r.get('mfu', '-'):>6} {r.get('peak_mem_gib', '-'):>6} | "
          f"{pt or p.get('error', '-') if p else '-':>10} {pfb or '-':>6} {p.get('peak_gib', '-'):>6} | {x:>6} {fx:>5}")
PY
    ;;
  collect)
    at=${2:?usage: run_speed_families.sh collect FILES_AT}
    dest=bench/logs/speed-$(date +%Y-%m-%d)
    mkdir -p "$dest"
    [ -f "$at/logs.tar.xz" ] && tar -C "$dest" -xJf "$at/logs.tar.xz"
    for f in host_stream.txt train_results.jsonl; do [ -f "$at/$f" ] && cp "$at/$f" "$dest/"; done
    cat "$dest/host_stream.txt" 2>/dev/null
    [ -f "$dest/train_results.jsonl" ] && bash bench/run_speed_families.sh summary "$dest/train_results.jsonl"
    echo "logs in $dest"
    ;;
  *) echo "usage: run_speed_families.sh prepare [BUILD_DIR] | run | summary RESULTS_JSONL | collect FILES_AT" >&2; exit 2 ;;
esac
