#!/usr/bin/env bash
# Full training steps of easyctx on one GPU beside the Hugging Face peer
# (peer_hf_llama.py: LlamaForCausalLM, torch SDPA, gradient checkpointing, pure bf16,
# fused AdamW) in the same call. Run on the GPU host from the repository root after
# building build-gpu (bench/gpu_host_env.sh):
#   RUNS="7b:65536 7b:131072" PEER=1 bash bench/run_train.sh [extra --set for easyctx ...]
# RUNS: model:tokens pairs (7b = configs/bench/llama2-7b-1gpu.yaml, 1b = the TinyLlama shape
# through the same file with model.config tinyllama-1b; qwen2.5-7b and qwen3-8b likewise with
# their presets, as the peer names them). STEPS (default 3) steps each; the
# figures are medians over the steps after the first, the whole step's and (fwd_bwd_*) the
# forward + backward's alone. The optimizer's place is the plan's (offload_optimizer auto: the
# fp32 master weights and Adam moments on the GPU when the run fits there with them, the 1B
# always and the 7B at 32K on an H200, at 64K with 12 layer inputs moved to host memory to make
# room, else in host memory; the trainer's "plan:
# parallel.zero.offload_optimizer auto: ..." line says which); the peer's bf16 AdamW is on the
# GPU. Prints one JSON line per run
# (easyctx, then the peer when PEER=1) and appends them to $OUT/train_results.jsonl if OUT
# is set. PEER_SCRIPT: the peer's path (default ../shared/bench/peer_hf_llama.py, else
# .deps/peer_hf_llama.py). LAUNCH: a launcher prefix for several GPUs (mpirun ...), with
# --set parallel.sequence.size=N among the extra arguments; tokens/s is then the whole
# job's, MFU per GPU. A time limit there is `timeout -s KILL N`: a plain timeout's SIGTERM makes
# easyctx_train finish its step and save a checkpoint (a 7B's weights and optimizer state: tens
# of GB and minutes) before it ends.
set -euo pipefail
RUNS=${RUNS:-"7b:65536"}
STEPS=${STEPS:-3}
PEER=${PEER:-0}
PEER_ONLY=${PEER_ONLY:-0}  # 1: only the peer (easyctx runs elsewhere in the same call)
BIN=${BIN:-build-gpu/bin/easyctx_train}
LAUNCH=${LAUNCH:-}  # e.g. "mpirun -np 2 --bind-to none" for sequence parallelism over 2 GPUs
CFG=${CFG:-configs/bench/llama2-7b-1gpu.yaml}
PEER_SCRIPT=${PEER_SCRIPT:-../shared/bench/peer_hf_llama.py}
[ -f "$PEER_SCRIPT" ] || PEER_SCRIPT=.deps/peer_hf_llama.py
results=${RESULTS:-${OUT:+$OUT/train_results.jsonl}}
# The peer for one model:tokens pair (STEPS - 1 timed steps after its warm-up step), tagged.
peer() {
  python3 "$PEER_SCRIPT" --runs "$1:$2" --steps $((STEPS - 1)) --sdpa cudnn 2>/dev/null \
    | grep '^{' | python3 -c 'import json, sys
for l in sys.stdin:
    r = dict(system="peer_hf_llama", **json.loads(l))
    if r.get("fwd_bwd_s"): r["fwd_bwd_tokens_per_s"] = round(r["seq"] / r["fwd_bwd_s"])
    print(json.dumps(r), flush=True)' | tee -a ${results:-/dev/null}
}
for run in $RUNS; do
  model=${run%%:*}
  seq=${run##*:}
  case "$model" in  # the peer's model names -> easyctx's presets
    7b) mcfg=llama2-7b ;;
    1b) mcfg=tinyllama-1b ;;
    *) mcfg=$model ;;  # qwen2.5-7b, qwen3-8b: the same names
  esac
  if [ "$PEER_ONLY" = 1 ]; then
    peer "$model" "$seq"
    continue
  fi
  dir=/tmp/easyctx-bench/$model-$seq-$$  # per script: two jobs on two GPUs of one host must not share it
  rm -rf "$dir"; mkdir -p "$(dirname "$dir")"
  log=$dir.log
  start=$(date +%s)
  set +e
  $LAUNCH "$BIN" "$CFG" --set model.config=$mcfg --set data.seq_length=$seq --set train.steps=$STEPS \
    --set output.dir=$dir "$@" > "$log" 2>&1
  rc=$?
  set -e
  wall=$(( $(date +%s) - start ))
  grep -E "memory|device|plan|error|step [0-9]+/|attention (forward|backward) " "$log" | tail -n 10 >&2 || true
  python3 - "$dir/metrics.jsonl" "$model" "$seq" "$rc" "$wall" "$log" "$*" <<'PY' | tee -a ${results:-/dev/null}
import json, sys, statistics
path, model, seq, rc, wall, log, extra = sys.argv[1:]
rows = []
try:
    rows = [json.loads(l) for l in open(path)]
except OSError:
    pass
out = dict(system="easyctx", model=model, seq=int(seq), rc=int(rc), wall_s=int(wall), extra=extra)
timed = rows[1:] if len(rows) > 1 else rows
if timed:
    tps = statistics.median(r["tokens_per_s"] for r in timed)
    fb = statistics.median(r.get("fwd_bwd_s", -1) for r in timed)
    out.update(steps=len(rows), tokens_per_s=round(tps), step_s=round(int(seq) / tps, 2), fwd_bwd_s=round(fb, 2),
               fwd_bwd_tokens_per_s=round(int(seq) / fb) if fb > 0 else -1,
               mfu=round(statistics.median(r.get("mfu", -1) for r in timed), 4),
               peak_mem_gib=max(r.get("peak_mem_gib", -1) for r in rows), loss=rows[-1]["loss"],
               steps_s=round(rows[-1].get("elapsed", -1), 1))  # (wall_s - steps_s: start-up and exit)
    host = [r for r in timed if "host_optimizer_s" in r]  # parallel.zero.offload_optimizer: the host AdamW
    if host:
        out.update({k: round(statistics.median(r[k] for r in host), 3)
                    for k in ("host_optimizer_s", "host_optimizer_exposed_s", "host_optimizer_gb_s")})
else:
    out["error"] = open(log).read()[-600:]
for line in open(log):
    if "memory:" in line or "plan" in line.lower():
        out.setdefault("memory_lines", []).append(line.strip()[-300:])
    elif "attention forward " in line or "attention backward " in line:  # the routes the trainer logs
        out.setdefault("attention_routes", []).append(line.strip().split("attention ", 1)[1][:200])
print(json.dumps(out), flush=True)
PY
  if [ "$PEER" = 1 ]; then peer "$model" "$seq"; fi
done
