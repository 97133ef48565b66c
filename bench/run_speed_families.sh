#!/usr/bin/env bash
# The families' speed on one GPU in one device call (issue 52): the host's memory bandwidth
# beside the host AdamW's (bench_host_stream), optionally the GPU checks of this work (TESTS=1:
# test_cuda_trainer's optimizer split and offload, bit for bit against the GPU AdamW, and the
# families against the CPU model; test_cuda_ops' RMSNorm), then the peer on every PEER_RUNS
# pair in one python process (first: the baseline must not be the part that runs out of time),
# then easyctx out of the box on each RUNS entry (bench/run_train.sh: STEPS steps, medians over
# those after the first; an entry model:tokens:auto adds --set activation.checkpoint=auto, a
# variant, not the out-of-the-box figure; PROFILE=1 adds logging.profile, whose
# synchronisations cost a little and which runs the host AdamW undeferred: leave it off for
# reported figures), all on the same GPU, and a summary table. Everything the call needs is
# carried in .deps/speed (git-ignored), made here by `prepare`; run from the repository root.
#
#   here:    bash bench/run_speed_families.sh prepare [BUILD_DIR]
#            .deps/speed: easyctx_train, bench_host_stream, test_cuda_trainer and test_cuda_ops
#            (stripped, xz), the host libraries the GPU image lacks, a KJV token shard (the demo
#            tokenizer: vocabulary 2000, below every preset's) and the peer (about 15 MB)
#   there:   RUNS="qwen2.5-7b:32768 qwen3-4b:32768:auto ..." PEER_RUNS="qwen2.5-7b:32768 ..." \
#              [TESTS=1] [PROFILE=1] [STEPS=5] [DEADLINE_S=560] bash bench/run_speed_families.sh run
#            (carry .deps/speed) -> $OUT/train_results.jsonl (one JSON line per run), host_stream.txt,
#            tests.txt (TESTS=1), logs.tar.xz (each run's log, metrics.jsonl, profile.json, plan.json),
#            summary.txt
#   here:    bash bench/run_speed_families.sh collect FILES_AT   (the summary again, logs unpacked
#            into bench/logs/speed-<date>/)
#            bash bench/run_speed_families.sh summary RESULTS_JSONL [HOST_STREAM_TXT]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_pack.sh"
D=.deps/speed
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    pack_device_dir $D "$build" easyctx_train bench_host_stream test_cuda_trainer test_cuda_ops
    tok=$(bash scripts/make_demo_tokenizer.sh .deps/tok)
    python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' .deps/tok/kjv.txt > $D/kjv.jsonl
    "$build/bin/h5tokenize" -t "$tok" -o $D/kjv --deflate 6 $D/kjv.jsonl > /dev/null && rm $D/kjv.jsonl
    cp ../shared/bench/peer_hf_llama.py $D/
    git log -1 --format='%H %s' > $D/commit.txt
    du -sh $D
    ;;
  run)
    T0=$(date +%s)
    DEADLINE_S=${DEADLINE_S:-560}
    t() { echo "== [$(($(date +%s) - T0)) s] $*"; }
    left() { echo $((T0 + DEADLINE_S - $(date +%s))); }
    unpack_device_dir $D
    nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv,noheader
    echo "host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null) defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)"
    echo "binaries built at: $(cat $D/commit.txt 2>/dev/null)"
    t host bandwidth
    OMP_NUM_THREADS=$(nproc) timeout 90 $D/bin/bench_host_stream --gib-per-array ${STREAM_GIB:-1} --repeats 3 \
      | tee "$OUT/host_stream.txt"
    if [ "${TESTS:-0}" = 1 ]; then
      t "GPU checks: the optimizer split and offload, the families, RMSNorm"
      timeout 150 $D/bin/test_cuda_trainer --gtest_filter='CudaTrainer.SplitOptimizerMatchesGpuAdamW:CudaTrainer.OffloadedOptimizerMatchesGpuAdamW:Families/*' \
        > "$OUT/tests.txt" 2>&1
      timeout 60 $D/bin/test_cuda_ops --gtest_filter='CudaOpsTest.RmsNorm:CudaOpsTest.LmHead*' >> "$OUT/tests.txt" 2>&1
      grep -E '^\[(split|offload)|PASSED|FAILED|OK \]' "$OUT/tests.txt" | tail -n 30
    fi
    peers=$(echo ${PEER_RUNS:-} | tr ' ' ',')
    l=$(left)
    if [ -n "$peers" ] && [ "$l" -gt 60 ]; then  # one process: torch's import once
      t "peer $peers (${l} s left)"
      timeout $((l - 40)) python3 $D/peer_hf_llama.py --runs "$peers" --steps $((${STEPS:-5} - 1)) --sdpa cudnn \
        2> "$OUT/peer_stderr.txt" | grep '^{' | python3 -c 'import json, sys
for l in sys.stdin:
    r = dict(system="peer_hf_llama", **json.loads(l))
    if r.get("fwd_bwd_s"): r["fwd_bwd_tokens_per_s"] = round(r["seq"] / r["fwd_bwd_s"])
    print(json.dumps(r), flush=True)' | tee -a "$OUT/train_results.jsonl"
    elif [ -n "$peers" ]; then
      t "skip peer $peers: ${l} s left"
    fi
    extra=()
    [ "${PROFILE:-0}" = 1 ] && extra+=(--set logging.profile=true)
    rm -rf /tmp/easyctx-bench
    for run in ${RUNS:-qwen2.5-7b:32768}; do
      l=$(left)
      [ "$l" -gt 75 ] || { t "skip $run: ${l} s left"; continue; }
      variant=()
      case "$run" in *:auto) variant=(--set activation.checkpoint=auto); run=${run%:auto} ;; esac
      t "easyctx $run ${variant[*]} (${l} s left)"
      RUNS=$run STEPS=${STEPS:-5} BIN=$D/bin/easyctx_train RESULTS=$OUT/train_results.jsonl \
        LAUNCH="timeout -s KILL $((l - 30))" bash bench/run_train.sh --set data.path=$D/kjv "${extra[@]}" "${variant[@]}" \
        | python3 -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l); print({k: r.get(k) for k in ("model", "seq", "rc", "wall_s", "steps_s", "tokens_per_s", "step_s",
                                                    "fwd_bwd_s", "host_optimizer_s", "host_optimizer_exposed_s", "mfu",
                                                    "peak_mem_gib")})'
    done
    (cd /tmp/easyctx-bench 2>/dev/null && tar -cJf "$OUT/logs.tar.xz" --exclude='*.h5' --exclude='checkpoints' .)
    t done
    bash bench/run_speed_families.sh summary "$OUT/train_results.jsonl" "$OUT/host_stream.txt" | tee "$OUT/summary.txt"
    ;;
  summary)
    # One row per easyctx run: step and forward + backward (medians over the steps after the
    # first), the host AdamW (parallel.zero.offload_optimizer: its wall seconds per step, the
    # part the step waited for, its GB/s and that over the host's STREAM triad), MFU, the device
    # peak beside the plan's, where the plan put the optimizer (gpu, gpu+inputs, split K, host),
    # the seconds of the run outside its steps (start-up and exit); then the peer in the same
    # call and the ratios (step: tokens/s over the peer's; fb: the peer's forward + backward
    # seconds over easyctx's).
    python3 - "${2:?usage: run_speed_families.sh summary RESULTS_JSONL [HOST_STREAM_TXT]}" "${3:-}" <<'PY'
import json, os, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
triad = None
stream = sys.argv[2] or os.path.join(os.path.dirname(sys.argv[1]), "host_stream.txt")
if os.path.exists(stream):
    for l in open(stream):
        if l.startswith("triad"):
            triad = float(l.split()[-1])
peer = {(r["model"], r["seq"]): r for r in rows if r.get("system") == "peer_hf_llama"}
def f(x, fmt="{:.2f}"):
    return fmt.format(x) if isinstance(x, (int, float)) and x >= 0 else "-"
def plan_of(r):
    lines = " ".join(r.get("memory_lines", []))
    m = re.search(r"device total predicted ([0-9.]+) GiB", lines)
    placed = "gpu"
    if "auto: split" in lines:
        k = re.search(r"offload_optimizer_layers (\d+)", lines)
        placed = f"split {k.group(1)}" if k else "split"
    elif "auto: in host memory" in lines:
        placed = "host"
    elif "auto: on the GPU, with the inputs" in lines:
        placed = "gpu+inputs"
    return (float(m.group(1)) if m else -1), placed
print(f"host STREAM triad: {triad} GB/s" if triad else "host STREAM triad: -")
print("(model*: --set activation.checkpoint=auto, a variant; the others out of the box)")
head = (f"{'model':12} {'seq':>6} {'step s':>6} {'fb s':>5} | {'opt s':>5} {'expo':>5} {'GB/s':>5} {'/tri':>4} | "
        f"{'MFU':>5} {'GiB':>6} {'plan':>6} {'optim':>8} {'start':>5} | {'peer s':>6} {'fb s':>5} {'GiB':>5} | "
        f"{'step x':>6} {'fb x':>5}")
print(head)
for r in rows:
    if r.get("system") != "easyctx":
        continue
    p = peer.get((r["model"], r["seq"]), {})
    plan_gib, placed = plan_of(r)
    name = r["model"] + ("*" if "checkpoint=auto" in r.get("extra", "") else "")
    gbs = r.get("host_optimizer_gb_s", -1)
    tri = f(gbs / triad) if triad and gbs > 0 else "-"
    pt, pfb = p.get("tokens_per_s"), p.get("fwd_bwd_s")
    x = f(r["tokens_per_s"] / pt, "{:.3f}") if pt and r.get("tokens_per_s") else "-"
    fx = f(pfb / r["fwd_bwd_s"], "{:.3f}") if pfb and r.get("fwd_bwd_s", -1) > 0 else "-"
    if "tokens_per_s" not in r:
        print(f"{name:12} {r['seq']:>6} rc {r.get('rc')}: {str(r.get('error', ''))[-200:]!r}")
        continue
    peer_s = p.get("step_s", p.get("error", "-")) if p else "-"
    print(f"{name:12} {r['seq']:>6} {f(r.get('step_s', -1)):>6} {f(r.get('fwd_bwd_s', -1)):>5} | "
          f"{f(r.get('host_optimizer_s', -1)):>5} {f(r.get('host_optimizer_exposed_s', -1)):>5} {f(gbs, '{:.0f}'):>5} "
          f"{tri:>4} | {f(100 * r.get('mfu', -1) if r.get('mfu', -1) >= 0 else -1, '{:.1f}'):>5} "
          f"{f(r.get('peak_mem_gib', -1)):>6} {f(plan_gib):>6} {placed:>8} "
          f"{f(r.get('wall_s', -1) - r.get('steps_s', 0) if r.get('steps_s', -1) > 0 else -1, '{:.0f}'):>5} | "
          f"{str(peer_s):>6} {f(pfb or -1):>5} "
          f"{f(p.get('peak_gib', -1)):>5} | {x:>6} {fx:>5}")
PY
    ;;
  collect)
    at=${2:?usage: run_speed_families.sh collect FILES_AT}
    dest=bench/logs/speed-$(date +%Y-%m-%d)
    mkdir -p "$dest"
    [ -f "$at/logs.tar.xz" ] && tar -C "$dest" -xJf "$at/logs.tar.xz"
    for f in host_stream.txt train_results.jsonl; do [ -f "$at/$f" ] && cp "$at/$f" "$dest/"; done
    cat "$dest/host_stream.txt" 2>/dev/null
    [ -f "$dest/train_results.jsonl" ] && bash bench/run_speed_families.sh summary "$dest/train_results.jsonl" "$dest/host_stream.txt"
    echo "logs in $dest"
    ;;
  *) echo "usage: run_speed_families.sh prepare [BUILD_DIR] | run | summary RESULTS_JSONL | collect FILES_AT" >&2; exit 2 ;;
esac
