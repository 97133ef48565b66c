#!/usr/bin/env bash
# LoRA on one GPU (issue 54) in one device call of about 8 minutes: llama3-8b with LoRA rank 16
# on q/k/v/o and the embeddings and norms trainable (configs/bench/llama3-8b-lora-1gpu.yaml),
#   1. the CUDA LoRA tests (test_cuda_lora: bf16 against the fp32 CPU reference, the trainer's
#      steps, resume, export, ZeRO-3 with the base in host memory);
#   2. tokens/s at 32K and 64K beside bench/peer_hf_lora.py (transformers + PEFT LoRA, gradient
#      checkpointing) in the same call (target >= 1.2x);
#   3. the long context: a full step (2 steps) of a 2-layer slice of llama3-8b at 512K tokens on
#      an 80 GB GPU, 640K on an H200 (the whole model's knobs: the layer inputs in pinned host
#      memory, 8 head groups, the optimizer in host memory), its memory against its plan, and
#      the whole model's plan on this machine;
#   4. the export against transformers and PEFT (test_golden's LoRA export, check_lora_export.py);
# then a summary table. A whole 32-layer step at 512K takes ~10-12 minutes (attention ~20 s per
# layer), beyond one call, hence the slice: its per-layer time x 32 estimates the whole step.
#
#   here:    bash bench/run_lora.sh prepare [BUILD_DIR]
#            .deps/lora: easyctx_train, test_cuda_lora, test_golden (stripped, xz), the host
#            libraries the GPU image lacks, a KJV token shard (demo tokenizer; vocabulary 2000),
#            the 2-layer slice's model YAML; prints the plans (bash bench/run_lora.sh plans)
#   there:   bash bench/run_lora.sh run 2>&1 | tee $OUT/log.txt     (carry .deps/lora)
#            $OUT/lora_results.jsonl (easyctx and peer runs), lora_cuda.txt, lora_export.txt,
#            lora_plan.txt (the whole model's plan there), summary.txt
#   here:    bash bench/run_lora.sh collect FILES_AT
#   no GPU:  bash bench/run_lora.sh plans [BIN]    the plans of the runs and of the longest
#            sequence on one H100-80GB / H200 with 128 GiB and with 1 TiB of host memory
# PARTS (default 1234) picks the parts, e.g. the correctness check alone, in well under 2 minutes:
#   here:    PARTS=1 bash bench/run_lora.sh prepare    (test_cuda_lora only: no data, no plans)
#   there:   PARTS=1 bash bench/run_lora.sh run 2>&1 | tee $OUT/log.txt     (carry .deps/lora)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_pack.sh"
PARTS=${PARTS:-1234}
part() { [[ "$PARTS" == *"$1"* ]]; }
D=.deps/lora
CFG=configs/bench/llama3-8b-lora-1gpu.yaml
# The long-context knobs (docs/training.md, "LoRA"): every layer input that the GPU cannot hold
# in pinned host memory, the attention in 8 head groups, the optimizer (the embedding's master
# weights and moments) in host memory.
LONG_SETS="--set activation.offload=cpu --set activation.attention_head_groups=8 --set parallel.zero.offload_optimizer=true"

# long_of GPU: "SEQ OFFLOAD_LAYERS" of the long run on one such GPU with 128 GiB of host memory
# (the plan's: bench/run_lora.sh plans).
long_of() {
  case "$1" in
    H200) echo "655360 22" ;;
    *) echo "524288 27" ;;
  esac
}

# plan_line BIN GPU HOST_GIB SEQ [--set ...]: "fits|NO gpu X/Y GiB host X/Y GiB" of one plan.
plan_line() {
  local bin=$1 gpu=$2 host=$3 seq=$4
  shift 4
  "$bin" $CFG --plan-json --set target.gpu="$gpu" --set target.gpus_per_node=1 --set target.nodes=1 \
    --set target.host_memory_gib="$host" --set data.seq_length="$seq" "$@" 2>&1 | tail -n 1 | python3 -c '
import json, sys
try:
    j = json.loads(sys.stdin.read())
except ValueError:
    print("error"); sys.exit(0)
g, h = j["gpu"], j["host"]
print("%s GPU %.2f of %.2f GiB, host %.2f of %.2f GiB" % ("fits" if j["fits"] else "does not fit",
      g["device_total_bytes"] / 2**30, g["usable_bytes"] / 2**30, h["per_node_peak_bytes"] / 2**30,
      h["usable_bytes"] / 2**30))'
}

# longest BIN GPU HOST_GIB [--set ...]: the longest multiple of 32K that the plan fits.
longest() {
  local bin=$1 gpu=$2 host=$3 lo=1 hi=128
  shift 3
  while [ $((hi - lo)) -gt 1 ]; do
    local mid=$(((lo + hi) / 2))
    if plan_line "$bin" "$gpu" "$host" $((mid * 32768)) "$@" | grep -q "^fits"; then lo=$mid; else hi=$mid; fi
  done
  echo "$((lo * 32768)) tokens: $(plan_line "$bin" "$gpu" "$host" $((lo * 32768)) "$@")"
}

plans() {
  local bin=${1:-build/bin/easyctx_train}
  [ -x "$bin" ] || { echo "run_lora.sh plans: $bin not found (build first)" >&2; return 2; }
  echo "== plans of $CFG (LoRA rank 16 on q/k/v/o + embed_tokens, norm; llama3-8b), one GPU"
  for gpu in H100-80GB H200; do
    for seq in 32768 65536; do
      echo "$gpu 128 GiB host, $seq tokens (checkpoint auto): $(plan_line "$bin" $gpu 128 $seq --set activation.checkpoint=auto)"
    done
    read -r seq k <<< "$(long_of $gpu)"
    echo "$gpu 128 GiB host, $seq tokens, the first $k layer inputs in host memory: $(plan_line "$bin" $gpu 128 $seq $LONG_SETS --set activation.offload_layers=$k)"
    echo "$gpu longest with 128 GiB of host memory (offload_layers as above): $(longest "$bin" $gpu 128 $LONG_SETS --set activation.offload_layers=$k)"
    echo "$gpu longest with 1 TiB of host memory (every layer input offloaded, ZeRO-3 with the base, gradients and optimizer in host memory): $(longest "$bin" $gpu 1024 $LONG_SETS --set parallel.zero.stage=3 --set parallel.zero.offload_params=true --set parallel.zero.offload_grads=true)"
  done
}

case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    if [ "$PARTS" = 1 ]; then  # (the CUDA tests alone)
      pack_device_dir $D "$build" test_cuda_lora
      du -sh $D
      exit 0
    fi
    pack_device_dir $D "$build" easyctx_train test_cuda_lora test_golden
    tok=$(bash scripts/make_demo_tokenizer.sh .deps/tok)
    python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' .deps/tok/kjv.txt > $D/kjv.jsonl
    "$build/bin/h5tokenize" -t "$tok" -o $D/kjv --deflate 6 $D/kjv.jsonl > /dev/null && rm $D/kjv.jsonl
    sed -E 's/^num_hidden_layers: .*/num_hidden_layers: 2/' configs/models/llama3-8b.yaml > $D/llama3-8b-2layers.yaml
    grep -q "^num_hidden_layers: 2$" $D/llama3-8b-2layers.yaml
    du -sh $D
    plans "$build/bin/easyctx_train"
    ;;
  plans) plans "${2:-build/bin/easyctx_train}" ;;
  run)
    T0=$(date +%s)
    DEADLINE=$((T0 + ${DEADLINE_S:-500}))
    t() { echo "== [$(($(date +%s) - T0)) s] $*"; }
    left() { echo $((DEADLINE - $(date +%s))); }
    budget() { local b=$(($(left) - $1)); echo $((b > 30 ? b : 30)); }  # seconds for a part, leaving $1
    # At most $1 seconds, ending by DEADLINE + 60 (part 4 comes after part 3 has used all but 40 s
    # of the deadline: its own 60 + 120 s would end past the call's 600 s).
    upto() { local b=$(($(left) + 60)); b=$((b > 10 ? b : 10)); echo $((b < $1 ? b : $1)); }
    unpack_device_dir $D
    BIN=$D/bin/easyctx_train
    R=$OUT/lora_results.jsonl
    : > "$R"
    gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)
    echo "$gpu"
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    python3 -c 'import peft; print("peft", peft.__version__)' 2>&1 | tail -n 1
    mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
    if [ "$mem" -gt 120000 ]; then kind=H200; else kind=H100-80GB; fi
    read -r LONG K <<< "$(long_of $kind)"
    if part 1; then
      t "1. test_cuda_lora"
      timeout 100 $D/bin/test_cuda_lora > "$OUT/lora_cuda.txt" 2>&1
      echo "test_cuda_lora rc $?"
      grep -E "^\[ +(FAILED|PASSED) +\]|\[accuracy\]|\[memory\]|\[lora offload|Failure" "$OUT/lora_cuda.txt" | head -40
    fi
    if part 2; then
      t "2. 32K and 64K: easyctx, then the peer ($(left) s left)"
      RUNS="llama3-8b:32768 llama3-8b:65536" STEPS=3 PEER=0 BIN=$BIN CFG=$CFG RESULTS=$R \
        timeout -s KILL $(budget 300) bash bench/run_train.sh --set data.path=$D/kjv --set activation.checkpoint=auto
      timeout $(budget 200) python3 bench/peer_hf_lora.py --runs llama3-8b:32768,llama3-8b:65536 --steps 2 \
        2>/dev/null | grep '^{' | tee -a "$R"
    fi
    if part 3; then
      t "3. the long context: a 2-layer slice at $LONG tokens ($(left) s left)"
      RUNS="$D/llama3-8b-2layers.yaml:$LONG" STEPS=2 PEER=0 BIN=$BIN CFG=$CFG RESULTS=$R \
        timeout -s KILL $(budget 40) bash bench/run_train.sh --set data.path=$D/kjv $LONG_SETS
      "$BIN" $CFG --plan --set data.seq_length=$LONG --set data.path=$D/kjv $LONG_SETS --set activation.offload_layers=$K \
        > "$OUT/lora_plan.txt" 2>&1
      echo "the whole model at $LONG tokens here (the first $K layer inputs in host memory):"
      grep -E "^  (GPU|host) +peak|^  note  lora" "$OUT/lora_plan.txt"
    fi
    if part 4; then
      t "4. the export in transformers and PEFT ($(left) s left)"
      rm -rf /tmp/lx && mkdir -p /tmp/lx
      EASYCTX_GOLDEN_EXPORT=/tmp/lx timeout "$(upto 60)" $D/bin/test_golden --gtest_filter='GoldenExport.Lora*' > /dev/null 2>&1
      timeout "$(upto 120)" python3 tests/golden/check_lora_export.py /tmp/lx tests/golden/data 2>&1 | grep -v -i warn \
        | tee "$OUT/lora_export.txt" | tail -n 12
    fi
    t summary
    python3 - "$R" "$OUT/lora_cuda.txt" "$OUT/lora_export.txt" <<'PY' | tee "$OUT/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("%-10s %-28s %8s %10s %8s %9s %s" % ("system", "model", "tokens", "tok/s", "step s", "peak GiB", "note"))
ez = {}
for r in rows:
    name = r.get("model", "").split("/")[-1]
    tps = r.get("tokens_per_s", "-")
    if r.get("system") == "easyctx": ez[r["seq"]] = tps
    note = r.get("error", "")[:40]
    if r.get("system") == "peer_hf_lora" and r.get("seq") in ez and isinstance(tps, int):
        note = "easyctx / peer = %.2fx" % (ez[r["seq"]] / tps)
    if r.get("system") == "easyctx":
        mem = [l for l in r.get("memory_lines", []) if "memory: predicted" in l]
        note = note or (mem[-1].split("memory: ")[-1][:90] if mem else "")
    peak = r.get("peak_mem_gib", r.get("peak_gib", "-"))
    print("%-10s %-28s %8s %10s %8s %9s %s" % (r.get("system", "?")[:10], name[:28], r.get("seq", "?"), tps,
                                             r.get("step_s", "-"), peak, note))
for f in sys.argv[2:]:
    try:
        last = [l.strip() for l in open(f) if "PASSED" in l or "FAILED" in l or l.strip() in ("OK", "MISMATCH")]
        print(f.split("/")[-1] + ":", last[-1] if last else "no result")
    except OSError:
        print(f.split("/")[-1] + ": not run")
PY
    t done
    ;;
  collect)
    at=${2:?usage: run_lora.sh collect FILES_AT}
    for f in summary.txt lora_cuda.txt lora_export.txt; do
      [ -f "$at/$f" ] && { echo "== $f"; grep -E "PASSED|FAILED|accuracy|memory\]|error|OK|MISMATCH|x$|tok" "$at/$f" | head -40; }
    done
    [ -f "$at/lora_plan.txt" ] && grep -E "^  (GPU|host) +peak" "$at/lora_plan.txt"
    [ -f "$at/lora_results.jsonl" ] && cat "$at/lora_results.jsonl"
    ;;
  *) echo "usage: run_lora.sh prepare [BUILD_DIR] | plans [BIN] | run | collect FILES_AT" >&2; exit 2 ;;
esac
