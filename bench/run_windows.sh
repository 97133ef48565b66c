#!/usr/bin/env bash
# The GPU side of sliding windows and dynamic RoPE (issue 52) in one device call: the
# transformers float64 fixtures mistral, qwen2_window, dynamic_short and dynamic_long
# (tests/golden/make_golden_families.py) and test_golden on them, easyctx's exports of them
# loaded by transformers (check_export.py), the CUDA window tests (test_cuda_windows: the
# attention against the CPU reference; test_cuda_trainer's window and dynamic families: whole
# small models against the CPU model), and mistral-7b at 128K tokens with its 4K window against
# the same model without one (sliding_window 0: every layer full). Everything the call needs
# is carried in .deps/windows (git-ignored), made here by `prepare`; run from the repository root.
#
#   here:    bash bench/run_windows.sh prepare [BUILD_DIR]
#            .deps/windows: easyctx_train, test_golden, test_cuda_windows, test_cuda_trainer
#            (stripped, xz), the host libraries the GPU image lacks (device_pack.sh), a token
#            shard of the KJV (the demo tokenizer: vocabulary 2000 < mistral's 32000), the
#            generators, the no-window model YAML and this script (about 12 MB)
#   there:   bash .deps/windows/run_windows.sh run [PARTS] 2>&1 | tee $OUT/log.txt   (carry .deps/windows)
#            PARTS, comma-separated, default golden,cuda (bench: only once the model's refusal
#            of a window on CUDA is lifted, after `cuda` has passed on a GPU; until then
#            easyctx_train refuses mistral-7b at start and the part records that refusal):
#            golden  $OUT/windows_fixtures.tar, golden_cpu.txt (test_golden), the exports' check
#            cuda    $OUT/test_cuda_windows.txt, windows_cuda_trainer.txt (test_cuda_trainer's
#                    families, the window ones below the refusal, and the refusal itself)
#            bench   RUNS=mistral-7b-v0.1:131072 STEPS=3 bench/run_train.sh, with the window then
#                    with sliding_window 0 (one process each; medians over the steps after the
#                    first); on a GPU under 100 GiB the first OFFLOAD_LAYERS (20) layer inputs in
#                    host memory (the plan: 73.6 GiB of an H100's 78 usable; 14 do not fit);
#                    rows in
#                    $OUT/train_results.jsonl, logs in $OUT/trainlogs.tar.gz
#            Ends with a summary table (tests passed/failed, tok/s with and without the window,
#            their ratio). Each part stops at its share of a 470 s budget (DEADLINE_S): under 8
#            minutes in all.
#   here:    bash bench/run_windows.sh collect FILES_AT
#            the fixtures into tests/golden/data/{mistral,qwen2_window,dynamic_short,dynamic_long}
#            (then commit them), the tests' summaries, the training rows
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_pack.sh"
D=.deps/windows
FIXTURES="mistral qwen2_window dynamic_short dynamic_long"

# The summary at the end of `run`: one line per part that ran.
summary() {
  echo "== summary"
  printf '%-34s %s\n' "part" "result"
  for f in golden_cpu.txt test_cuda_windows.txt windows_cuda_trainer.txt; do
    [ -f "$OUT/$f" ] || continue
    printf '%-34s %s\n' "$f" "$(grep -E '^\[ +(PASSED|FAILED) +\]' "$OUT/$f" | tr '\n' ' ')"
  done
  [ -f "$OUT/check_export.txt" ] && printf '%-34s %s\n' "check_export.py" "$(tail -n 1 "$OUT/check_export.txt")"
  [ -f "$OUT/train_results.jsonl" ] && python3 - "$OUT/train_results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tps, fb = {}, {}
for r in rows:
    kind = "without window" if "nowindow" in r.get("extra", "") else "with 4K window"
    tps[kind], fb[kind] = r.get("tokens_per_s", -1), r.get("fwd_bwd_s", -1)
    print("%-34s %s tok/s, step %s s, fwd+bwd %s s, MFU %s, peak %s GiB, rc %s" % (
        "mistral-7b 128K " + kind, r.get("tokens_per_s"), r.get("step_s"), r.get("fwd_bwd_s"), r.get("mfu"),
        r.get("peak_mem_gib"), r.get("rc")))
w, n = tps.get("with 4K window", -1), tps.get("without window", -1)
if w and n and w > 0 and n > 0:
    print("%-34s %.2fx tok/s (target >= 3x)" % ("window / no window", w / n))
fw, fn = fb.get("with 4K window", -1), fb.get("without window", -1)
if fw and fn and fw > 0 and fn > 0:
    print("%-34s %.2fx (forward + backward alone)" % ("window / no window", fn / fw))
PY
}

case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    pack_device_dir $D "$build" easyctx_train test_golden test_cuda_windows test_cuda_trainer
    tok=$(bash scripts/make_demo_tokenizer.sh .deps/tok)
    python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' .deps/tok/kjv.txt > $D/kjv.jsonl
    "$build/bin/h5tokenize" -t "$tok" -o $D/kjv --deflate 6 $D/kjv.jsonl > /dev/null && rm $D/kjv.jsonl
    cp tests/golden/make_golden.py tests/golden/make_golden_families.py tests/golden/check_export.py $D/
    cp bench/device_pack.sh bench/run_windows.sh $D/
    # The same model without a window: the preset with sliding_window 0 (a Llama of Mistral's shape).
    sed -e 's/^sliding_window: .*/sliding_window: 0/' -e 's/^# .*//' configs/models/mistral-7b-v0.1.yaml \
      | grep -v '^$' > $D/mistral-7b-nowindow.yaml
    grep -q '^sliding_window: 0$' $D/mistral-7b-nowindow.yaml
    du -sh $D
    ;;
  run)
    what=${2:-golden,cuda}
    T0=$(date +%s)
    t() { echo "== [$(($(date +%s) - T0)) s] $*"; }
    cap() {  # seconds left of DEADLINE_S, at most $1
      local r=$((T0 + ${DEADLINE_S:-470} - $(date +%s)))
      echo $((r < $1 ? (r > 5 ? r : 5) : $1))
    }
    unpack_device_dir $D
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "cores $(nproc); $(free -g | sed -n 2p)"
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    ldd $D/bin/* | grep "not found"
    if [[ $what == *golden* ]]; then
      t "fixtures ($FIXTURES)"
      rm -rf /tmp/gw
      only=()
      for f in $FIXTURES; do only+=(--only "$f"); done
      timeout "$(cap 90)" python3 $D/make_golden_families.py --out /tmp/gw "${only[@]}" 2>&1 | grep -v -i warn | tail -20
      (cd /tmp/gw && tar -cf "$OUT/windows_fixtures.tar" .) && tar -C tests/golden/data -xf "$OUT/windows_fixtures.tar"
      t test_golden
      timeout "$(cap 120)" $D/bin/test_golden > "$OUT/golden_cpu.txt" 2>&1
      echo "test_golden rc $?"
      grep -E "^\[ +(FAILED|PASSED) +\]|Failure|\[golden\]" "$OUT/golden_cpu.txt" | sort | uniq | head -30
      rm -rf /tmp/ex && EASYCTX_GOLDEN_EXPORT=/tmp/ex timeout "$(cap 60)" $D/bin/test_golden \
        --gtest_filter='GoldenExport*' > /dev/null 2>&1
      timeout "$(cap 90)" python3 $D/check_export.py /tmp/ex tests/golden/data 2>&1 | grep -v -i warn \
        > "$OUT/check_export.txt"
      tail -n 12 "$OUT/check_export.txt"
    fi
    if [[ $what == *cuda* ]]; then
      t test_cuda_windows
      timeout "$(cap 150)" stdbuf -oL -eL $D/bin/test_cuda_windows > "$OUT/test_cuda_windows.txt" 2>&1
      echo "test_cuda_windows rc $?"
      grep -E "^\[ +(FAILED|PASSED) +\]|Failure|not an sm_90" "$OUT/test_cuda_windows.txt" | head -20
      t "test_cuda_trainer: window and dynamic families"
      timeout "$(cap 90)" $D/bin/test_cuda_trainer --gtest_filter='*Window*:*Families*' \
        > "$OUT/windows_cuda_trainer.txt" 2>&1
      echo "test_cuda_trainer rc $?"
      grep -E "^\[ +(FAILED|PASSED) +\]|\[accuracy\]|Failure" "$OUT/windows_cuda_trainer.txt" | head -30
    fi
    if [[ $what == *bench* ]]; then
      export BIN=$D/bin/easyctx_train STEPS=${STEPS:-3} RUNS=${RUNS:-mistral-7b-v0.1:131072}
      F=(--set "data.path=$D/kjv")
      gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
      if ((gib < 100 * 1024 && ${OFFLOAD_LAYERS:-20} > 0)); then
        F+=(--set activation.offload=cpu --set activation.offload_layers=${OFFLOAD_LAYERS:-20})
      fi
      t "mistral-7b 128K, sliding window 4096"
      LAUNCH="timeout -s KILL $(cap 150)" bash bench/run_train.sh "${F[@]}"
      t "mistral-7b 128K, sliding_window 0 (nowindow)"
      LAUNCH="timeout -s KILL $(cap 300)" bash bench/run_train.sh "${F[@]}" --set model.config=$D/mistral-7b-nowindow.yaml
      if [ -d /tmp/easyctx-bench ]; then
        (cd /tmp/easyctx-bench && tar -czf "$OUT/trainlogs.tar.gz" ./*.log ./*/metrics.jsonl 2>/dev/null)
      fi
    fi
    t "all done"
    summary
    ;;
  collect)
    at=${2:?usage: run_windows.sh collect FILES_AT}
    if [ -f "$at/windows_fixtures.tar" ]; then
      tar -C tests/golden/data -xf "$at/windows_fixtures.tar"
      for f in $FIXTURES; do ls -la tests/golden/data/$f; done
    fi
    for f in golden_cpu.txt test_cuda_windows.txt windows_cuda_trainer.txt; do
      [ -f "$at/$f" ] && echo "== $f" && grep -E "^\[ +(PASSED|FAILED) +\]|FAILED  " "$at/$f"
    done
    [ -f "$at/check_export.txt" ] && tail -n 12 "$at/check_export.txt"
    [ -f "$at/test_cuda_windows.txt" ] && python3 - "$at/test_cuda_windows.txt" <<'PY'
import collections, re, sys
worst = collections.defaultdict(float)
for line in open(sys.argv[1]):
    m = re.match(r"\[accuracy\] \S+\s+(.*?) \[.*?\]( \w+ grads)?\s+(.+?)\s+rel err (\S+)", line)
    if m:
        k = (m.group(1), m.group(3) + (m.group(2) or ""))
        worst[k] = max(worst[k], float(m.group(4)))
for (c, w), v in sorted(worst.items()):
    print("%-60s %-30s %.3g" % (c, w, v))
PY
    [ -f "$at/train_results.jsonl" ] && OUT=$at summary
    ;;
  *) echo "usage: run_windows.sh prepare [BUILD_DIR] | run [golden,cuda[,bench]] | collect FILES_AT" >&2; exit 2 ;;
esac
