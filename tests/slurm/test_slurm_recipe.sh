#!/usr/bin/env bash
# The recipe chain as a user submits it, on a private one-node Slurm cluster: from a copy of
# the checkout laid out as a fresh clone (build/ = this build; no EASYCTX_ROOT or EASYCTX_BIN),
# `bash slurm/recipe_llama2_7b_1m.sh`, scaled down only through its documented environment
# variables, flags and --set flags (docs/recipes.md, "Slurm"): stages s1, s2, s3 of the 16-GPU
# Llama-2-7B recipe with the demo model on the CPU, 2 tasks, sequence parallel 2, 40 steps each
# (--recipe llama2-7b-1m: 2 tasks is no recipe's world).
#   1. The whole chain on the recipe's layout (2 x 8 tasks) as a dry run (EASYCTX_DRY_RUN=1):
#      a GPU recipe refused on a CPU-only build (or planned with GPUs on a CUDA build);
#      EASYCTX_LENGTHS=easycontext gives 256000/512000; s8's sequence parallel 16 is accepted
#      for 16 ranks; afterok dependencies, each stage from the previous one's output.
#   2. An uninterrupted chain (the stage files' output folders).
#   3. The same chain (EASYCTX_OUT) with s2 sent SIGUSR1 mid-stage (what --signal=B:USR1@300
#      does before a time limit): checkpoint, requeue, resume; s3 waits for it (afterok).
#      The final weights of every stage equal the uninterrupted chain's byte for byte.
#   4. easyctx_report on the preempted chain, rendered by headless Chromium: the page's data
#      names every stage, s2 with its restart; a screenshot.
#   5. A chain whose first stage fails: its log says so, the second stage never starts.
#   6. The 8-GPU recipe (EasyContext's own stages): picked by the world (1 x 8 tasks) as a dry
#      run, each stage at EasyContext's tokens per optimizer step, then --final-rope-theta 1e9
#      after s7; worlds no recipe is sized for are refused, nothing submitted; scaled down,
#      its last two stages and the final-theta export run, and the exported config.json reads
#      rope_theta 1e9 back (s7's own export keeps its 2.5e8); run again, nothing is redone.
set -euo pipefail
src=$1
bin=$2
work=$(mktemp -d /tmp/easyctx-slurm-recipe.XXXXXX)
source "$src/tests/slurm/slurm_cluster.sh"
command -v chromium >/dev/null || { echo "FAIL: chromium not installed (apt-get install chromium; scripts/setup.sh does)"; exit 1; }
slurm_cluster_start
t0=$(date +%s)
slurm_tiny_data "$work/data"
clone=$work/clone
slurm_fresh_clone "$clone" 1
unset EASYCTX_ROOT EASYCTX_BIN EASYCTX_BUILD EASYCTX_OUT EASYCTX_INIT EASYCTX_STAGES EASYCTX_LENGTHS
cd "$clone"

# The scale-down: documented environment variables and --set flags only.
export EASYCTX_DEVICE=cpu EASYCTX_NODES=1 EASYCTX_TASKS_PER_NODE=2 EASYCTX_CPUS_PER_TASK=1
small=(--set model.config=demo --set data.path="$work/data" --set data.seq_length=128 --set train.steps=40
       --set parallel.sequence.size=2 --set train.lr=2e-3 --set train.warmup_steps=5)
chain16=(--recipe llama2-7b-1m)
jobs_of() { sed -nE 's/^easyctx: (s[0-9]+)-[^:]*: job ([0-9]+).*/\1 \2/p' "$1"; }
job_of() { jobs_of "$1" | awk -v s="$2" '$1 == s { print $2 }'; }

# 1. The whole recipe on its own layout (2 nodes x 8), checked stage by stage on this node
#    and printed, not submitted (EASYCTX_DRY_RUN=1): EasyContext's lengths, s8's sequence
#    parallel 16 accepted for 16 ranks, afterok on the previous stage, each stage's model.init
#    the previous stage's output.
build=$("$bin/easyctx_train" configs/recipes/llama2-7b-1m/s8-1m.yaml --print-config | grep '^# this build: ')
rc=0
EASYCTX_DEVICE='' EASYCTX_NODES=2 EASYCTX_TASKS_PER_NODE=8 EASYCTX_DRY_RUN=1 EASYCTX_OUT=$work/dry EASYCTX_INIT=random \
  bash slurm/recipe_llama2_7b_1m.sh -- --set data.path="$work/data" > "$work/gpu-dry.log" 2>&1 || rc=$?
case $build in
  *"CPU only"*)  # a GPU recipe on a CPU-only build: refused on the submit node, one message
    [ "$rc" = 2 ] && grep -q "easyctx: error: .*s1-32k.yaml runs on GPUs (train.device: cuda), but .* was built without the CUDA backend" "$work/gpu-dry.log" ||
      { cat "$work/gpu-dry.log"; slurm_fail "the GPU recipe on a CPU-only build: expected the refusal (exit 2), got exit $rc"; }
    echo "ok: the GPU recipe is refused on this CPU-only build: $(grep -o 'was built without the CUDA backend' "$work/gpu-dry.log")" ;;
  *)
    [ "$rc" = 0 ] && [ "$(grep -c -- '--gpus-per-node=8' "$work/gpu-dry.log")" = 8 ] ||
      { cat "$work/gpu-dry.log"; slurm_fail "the GPU recipe's dry run on a CUDA build: exit $rc, expected 8 stages with --gpus-per-node=8"; }
    echo "ok: the GPU recipe's dry run on this CUDA build: 8 stages with --gpus-per-node=8" ;;
esac
EASYCTX_NODES=2 EASYCTX_TASKS_PER_NODE=8 EASYCTX_LENGTHS=easycontext EASYCTX_DRY_RUN=1 EASYCTX_OUT=$work/dry EASYCTX_INIT=random \
  bash slurm/recipe_llama2_7b_1m.sh -- --set data.path="$work/data" > "$work/dry.log" 2>&1 || { cat "$work/dry.log"; slurm_fail "the dry run failed"; }
prev=""
for s in "s1-32k 32768" "s2-64k 65536" "s3-256k 256000" "s4-256k 256000" "s5-256k 256000" "s6-512k 512000" \
         "s7-512k 512000" "s8-1m 1048576"; do
  set -- $s
  line=$(grep "^easyctx: $1: dry run, seq_length $2, output $work/dry/$1: sbatch " "$work/dry.log") ||
    { cat "$work/dry.log"; slurm_fail "EASYCTX_LENGTHS=easycontext: $1 not planned with seq_length $2"; }
  case $line in *"--nodes=2 --ntasks-per-node=8 "*) ;; *) slurm_fail "$1: not on 2 nodes x 8 tasks: $line" ;; esac
  if [ -n "$prev" ]; then
    case $line in *"afterok:\<job\ of\ $prev\>"*"model.init=ckpt:$work/dry/$prev "*) ;;
      *) slurm_fail "$1: no afterok on $prev or model.init from its output: $line" ;; esac
  fi
  prev=$1
done
grep -q "dry run (EASYCTX_DRY_RUN=1): nothing submitted" "$work/dry.log" || slurm_fail "the dry run did not say so"
[ -z "$(squeue -h)" ] || slurm_fail "the dry run submitted jobs: $(squeue -h)"
echo "ok: dry run of all 8 stages on 2 x 8 tasks: EasyContext's 256000/512000, s8 at sequence parallel 16, afterok chain"

# 2. The uninterrupted chain.
EASYCTX_STAGES=s1,s2,s3 EASYCTX_INIT=random bash slurm/recipe_llama2_7b_1m.sh "${chain16[@]}" -- "${small[@]}" > "$work/a.log" 2>&1 ||
  { cat "$work/a.log"; slurm_fail "the chain was not submitted"; }
cat "$work/a.log"
a3=$(job_of "$work/a.log" s3)
[ -n "$a3" ] || slurm_fail "no job for s3 in the chain script's output"
slurm_wait_state "$a3" "COMPLETED FAILED CANCELLED" 300
straight=$clone/out/llama2-7b-1m
for s in s1-32k s2-64k s3-256k; do
  [ -f "$straight/$s/DONE" ] || slurm_fail "uninterrupted chain: $straight/$s/DONE missing"
done
echo "ok: uninterrupted chain finished ($(( $(date +%s) - t0 )) s since start)"

# 3. The preempted chain.
pre=$work/preempted
EASYCTX_STAGES=s1,s2,s3 EASYCTX_INIT=random EASYCTX_OUT=$pre bash slurm/recipe_llama2_7b_1m.sh "${chain16[@]}" -- "${small[@]}" \
  > "$work/b.log" 2>&1 || { cat "$work/b.log"; slurm_fail "the second chain was not submitted"; }
b2=$(job_of "$work/b.log" s2) b3=$(job_of "$work/b.log" s3)
# The same command again while the chain's jobs are queued or running: nothing new is submitted
# (each stage is finished, or kept with its job), and the queue holds the same jobs.
queue_before=$(squeue -h -o %i | sort | tr '\n' ' ')
EASYCTX_STAGES=s1,s2,s3 EASYCTX_INIT=random EASYCTX_OUT=$pre bash slurm/recipe_llama2_7b_1m.sh "${chain16[@]}" -- "${small[@]}" \
  > "$work/b-again.log" 2>&1 || { cat "$work/b-again.log"; slurm_fail "running the chain again failed"; }
cat "$work/b-again.log"
grep -q "^easyctx: submitted 0 job(s)" "$work/b-again.log" || slurm_fail "running the chain again submitted jobs"
for j in $(jobs_of "$work/b-again.log" | awk '{ print $2 }'); do
  jobs_of "$work/b.log" | awk '{ print $2 }' | grep -qx "$j" || slurm_fail "running the chain again named job $j, not one of the chain's"
done
[ "$(grep -c "queued or running for $pre/s3-256k already" "$work/b-again.log")" = 1 ] ||
  slurm_fail "running the chain again did not keep s3's job $b3"
queue_after=$(squeue -h -o %i | sort | tr '\n' ' ')
for j in $queue_after; do
  case " $queue_before " in *" $j "*) ;; *) slurm_fail "job $j appeared after running the chain again" ;; esac
done
echo "ok: the chain run again while queued submitted nothing and kept its jobs"
log2=$clone/slurm-easyctx-s2-64k-$b2.out
slurm_wait_line "$log2" "^step 5/40 " 120
scancel --batch --signal=USR1 "$b2"
echo "sent SIGUSR1 to s2 (job $b2)"
slurm_wait_line "$log2" "requeueing job $b2" 60
[ "$(slurm_job_field "$b3" JobState)" = PENDING ] || slurm_fail "s3 (job $b3) did not wait for the requeued s2"
slurm_release_requeued "$b2"
slurm_wait_state "$b3" "COMPLETED FAILED CANCELLED" 300
for j in $(jobs_of "$work/b.log" | awk '{ print $2 }'); do
  [ "$(slurm_job_field "$j" JobState)" = COMPLETED ] || slurm_fail "job $j ended $(slurm_job_field "$j" JobState)"
done
[ "$(slurm_job_field "$b2" Restarts)" = 1 ] || slurm_fail "s2 (job $b2) restarted $(slurm_job_field "$b2" Restarts) times, expected 1"
grep -q "stop requested" "$log2" || slurm_fail "s2: no checkpoint on SIGUSR1"
grep -q "resuming from" "$log2" || slurm_fail "s2: the requeued job did not resume"
steps=$(grep -o '"step":[0-9]*' "$pre/s2-64k/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$steps" = "$(seq -s ' ' 1 40) " ] || slurm_fail "s2's metrics.jsonl steps are '$steps', expected 1..40 once each"
grep -q "initial weights from $pre/s2-64k/checkpoints/step-00000040" "$clone"/slurm-easyctx-s3-256k-"$b3".out ||
  slurm_fail "s3 did not start from s2's last checkpoint"
# Byte for byte: every stage's exported weights, and the metrics less their wall-clock fields.
strip() { sed -E 's/,"(tokens_per_s|fwd_bwd_s|elapsed|mfu|peak_mem_gib|host_peak_gib)":[^,}]*//g' "$1"; }
for s in s1-32k s2-64k s3-256k; do
  ha=$(sha256sum < "$straight/$s/final/model.safetensors" | cut -c1-64)
  hb=$(sha256sum < "$pre/$s/final/model.safetensors" | cut -c1-64)
  [ "$ha" = "$hb" ] || slurm_fail "$s: final/model.safetensors differs: uninterrupted $ha, preempted $hb"
  cmp -s <(strip "$straight/$s/metrics.jsonl") <(strip "$pre/$s/metrics.jsonl") ||
    slurm_fail "$s: metrics.jsonl (loss, lr, grad norm) differs between the two chains"
  echo "ok: $s final/model.safetensors sha256 $ha in both chains"
done
echo "ok: preempted chain: s2 checkpointed on SIGUSR1, requeued, resumed; weights equal ($(( $(date +%s) - t0 )) s)"

# 4. The report page in headless Chromium.
"$bin/easyctx_report" "$pre/s1-32k" "$pre/s2-64k" "$pre/s3-256k" --output "$work/report.html" \
  --title "easyctx CI chain: llama2-7b-1m s1-s3 (demo model, CPU, 2 ranks), s2 preempted" >/dev/null ||
  slurm_fail "easyctx_report failed"
chrome=(chromium --headless --no-sandbox --disable-gpu --user-data-dir="$work/chromium")
timeout 120 "${chrome[@]}" --dump-dom "file://$work/report.html" > "$work/dom.html" 2>"$work/chromium.log" ||
  { tail "$work/chromium.log"; slurm_fail "chromium --dump-dom failed"; }
timeout 120 "${chrome[@]}" --hide-scrollbars --window-size=1280,2000 --screenshot="$work/report.png" \
  "file://$work/report.html" >/dev/null 2>>"$work/chromium.log" || { tail "$work/chromium.log"; slurm_fail "chromium --screenshot failed"; }
python3 - "$work/dom.html" "$work/report.png" <<'PY' || slurm_fail "the report page rendered by Chromium is not the chain's"
import json, re, struct, sys
dom = open(sys.argv[1]).read()
m = re.search(r'<script type="application/json" id="easyctx-report-data">(.*?)</script>', dom, re.S)
assert m, "no easyctx-report-data in the DOM Chromium rendered"
stages = json.loads(m.group(1))["stages"]
names = [s["name"] for s in stages]
assert names == ["s1-32k", "s2-64k", "s3-256k"], names
for s in stages:
    assert s["done"] and s["steps"] == list(range(1, 41)), (s["name"], s["done"], s["steps"])
    assert s.get("plan_fits") is True, (s["name"], "no memory plan")
restarts = {s["name"]: s["restarts_at_step"] for s in stages}
assert restarts["s1-32k"] == [] and restarts["s3-256k"] == [] and len(restarts["s2-64k"]) == 1, restarts
for n in names:
    assert dom.count(n) >= 3, (n, "shown fewer than 3 times on the page")
png = open(sys.argv[2], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
w, h = struct.unpack(">II", png[16:24])
assert (w, h) == (1280, 2000) and len(png) > 50000, (w, h, len(png))
print("ok: Chromium rendered the report: stages", names, "restart in s2 at step", restarts["s2-64k"][0],
      "; screenshot %dx%d, %d bytes" % (w, h, len(png)))
PY
art=$(cd "$bin/.." && pwd)/test-artifacts/slurm_recipe
mkdir -p "$art" && cp "$work/report.html" "$work/report.png" "$art/"
echo "report page and screenshot: $art/report.html, $art/report.png"

# 5. A failing stage stops the chain (a data folder without shards: the trainer refuses it).
mkdir -p "$work/no-shards"
EASYCTX_STAGES=s1,s2 EASYCTX_INIT=random EASYCTX_OUT=$work/failing bash slurm/recipe_llama2_7b_1m.sh "${chain16[@]}" -- "${small[@]}" \
  --set data.path="$work/no-shards" > "$work/c.log" 2>&1 || { cat "$work/c.log"; slurm_fail "the failing chain was not submitted"; }
c1=$(job_of "$work/c.log" s1) c2=$(job_of "$work/c.log" s2)
slurm_wait_state "$c1" "FAILED" 120
slurm_wait_state "$c2" "CANCELLED" 60
grep -q "easyctx: error: stage .*s1-32k.yaml failed" "$clone/slurm-easyctx-s1-32k-$c1.out" ||
  slurm_fail "the failed stage's log does not say it failed"
grep -q "no-shards" "$clone/slurm-easyctx-s1-32k-$c1.out" || slurm_fail "the failed stage's log does not name the missing data"
[ ! -e "$clone/slurm-easyctx-s2-64k-$c2.out" ] || slurm_fail "s2 ran after s1 failed"
echo "ok: a failing s1 (job $c1) stops the chain: s2 (job $c2) $(slurm_job_field "$c2" JobState), reason $(slurm_job_field "$c2" Reason)"
# 6. The 8-GPU recipe. A dry run on one node x 8 tasks (EASYCTX_NODES x EASYCTX_TASKS_PER_NODE,
#    no --recipe): the world picks configs/recipes/llama2-7b-1m-8gpu, EasyContext's 7 stages at
#    its lengths and tokens per optimizer step, afterok, each from the previous output, and the
#    final-theta export after s7.
t6=$(date +%s)
EASYCTX_NODES=1 EASYCTX_TASKS_PER_NODE=8 EASYCTX_LENGTHS=easycontext EASYCTX_DRY_RUN=1 EASYCTX_OUT=$work/dry8 EASYCTX_INIT=random \
  bash slurm/recipe_llama2_7b_1m.sh --final-rope-theta 1e9 -- --set data.path="$work/data" > "$work/dry8.log" 2>&1 ||
  { cat "$work/dry8.log"; slurm_fail "the 8-GPU dry run failed"; }
grep -q "^easyctx: chain of 7 stage(s) from configs/recipes/llama2-7b-1m-8gpu on 1 node(s) x 8 task(s)" "$work/dry8.log" ||
  { cat "$work/dry8.log"; slurm_fail "1 x 8 tasks did not pick the 8-GPU recipe"; }
prev=""
for s in "s1-32k 32768 1048576 4 8" "s2-64k 65536 1048576 2 8" "s3-256k 256000 1024000 4 1" "s4-256k 256000 1024000 4 1" \
         "s5-256k 256000 1024000 4 1" "s6-512k 512000 1024000 2 1" "s7-512k 512000 1024000 2 1"; do
  set -- $s
  grep -q "^easyctx: $1: $3 tokens per optimizer step (seq_length $2 x batch_size 1 x grad_accum $4 x $5 data-parallel)$" "$work/dry8.log" ||
    { cat "$work/dry8.log"; slurm_fail "8 GPUs: $1 is not EasyContext's $3 tokens per step ($2 x grad_accum $4 x $5)"; }
  line=$(grep "^easyctx: $1: dry run, seq_length $2, output $work/dry8/$1: sbatch " "$work/dry8.log") ||
    slurm_fail "8 GPUs: $1 not planned with seq_length $2"
  case $line in *"--nodes=1 --ntasks-per-node=8 "*"/configs/recipes/llama2-7b-1m-8gpu/$1.yaml "*) ;;
    *) slurm_fail "8 GPUs: $1 not on 1 node x 8 tasks from the 8-GPU recipe: $line" ;; esac
  if [ -n "$prev" ]; then
    case $line in *"afterok:\<job\ of\ $prev\>"*"model.init=ckpt:$work/dry8/$prev "*) ;;
      *) slurm_fail "8 GPUs: $1: no afterok on $prev or model.init from its output: $line" ;; esac
  fi
  prev=$1
done
line=$(grep "^easyctx: final rope theta: dry run, rope_theta 1e9, output $work/dry8/s7-512k-rope-theta-1e9: sbatch " "$work/dry8.log") ||
  { cat "$work/dry8.log"; slurm_fail "8 GPUs: no final-theta export in the dry run"; }
case $line in *"afterok:\<job\ of\ s7-512k\>"*"slurm/export.sbatch $work/dry8/s7-512k $work/dry8/s7-512k-rope-theta-1e9 1e9") ;;
  *) slurm_fail "8 GPUs: the final-theta export does not follow s7 or export its output: $line" ;; esac
echo "ok: 1 x 8 tasks pick the 8-GPU recipe: 7 stages at EasyContext's tokens per step (1,048,576; 1,024,000 at 256000/512000), afterok, final rope theta 1e9 after s7"

# Worlds no recipe is sized for: refused on the submit node with one message, nothing submitted.
refused() {  # LOG MESSAGE-REGEX COMMAND...: exit 2, the message, no job
  local log=$1 re=$2 rc=0
  shift 2
  "$@" > "$log" 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -q "^easyctx: error: $re" "$log" || { cat "$log"; slurm_fail "expected a refusal ($re), got exit $rc"; }
  [ -z "$(squeue -h)" ] || slurm_fail "a refused chain submitted jobs: $(squeue -h)"
  echo "ok: refused: $(grep -o "^easyctx: error: .\{0,150\}" "$log")..."
}
refused "$work/w4.log" "no recipe of this chain is sized for 4 GPUs (1 node(s) x 4, from --gpus 4); its recipes: configs/recipes/llama2-7b-1m for 16 GPUs, configs/recipes/llama2-7b-1m-8gpu for 8 GPUs. On 4 GPUs every stage's tokens per optimizer step would change" \
  env -u EASYCTX_NODES -u EASYCTX_TASKS_PER_NODE EASYCTX_DRY_RUN=1 EASYCTX_INIT=random bash slurm/recipe_llama2_7b_1m.sh --gpus 4 -- --set data.path="$work/data"
refused "$work/l3.log" "no recipe of this chain is sized for 8 GPUs .*configs/recipes/llama3-8b-1m for 16 GPUs" \
  env EASYCTX_NODES=1 EASYCTX_TASKS_PER_NODE=8 EASYCTX_INIT=random bash slurm/recipe_llama3_8b_1m.sh -- --set data.path="$work/data"
refused "$work/r16.log" "configs/recipes/llama2-7b-1m is sized for 16 GPUs (2 x 8), this chain has 8 .*tokens per optimizer step would change" \
  env -u EASYCTX_NODES -u EASYCTX_TASKS_PER_NODE EASYCTX_INIT=random bash slurm/recipe_llama2_7b_1m.sh --recipe llama2-7b-1m --gpus 8 -- --set data.path="$work/data"
refused "$work/theta.log" "--final-rope-theta 1e9 exports the recipe's last stage, s7-512k, but EASYCTX_STAGES=s5 ends at s5-256k" \
  env -u EASYCTX_NODES -u EASYCTX_TASKS_PER_NODE EASYCTX_STAGES=s5 EASYCTX_INIT=random bash slurm/recipe_llama2_7b_1m.sh --gpus 8 --final-rope-theta 1e9 -- --set data.path="$work/data"

# Scaled down: its last two stages on 2 tasks (sized by --set, so --recipe may run them on 2),
# then the final-theta export, which reads the exported config.json back.
eight=$work/eight
small8=("${small[@]}" --set train.steps=10)
EASYCTX_STAGES=s6,s7 EASYCTX_INIT=random EASYCTX_OUT=$eight bash slurm/recipe_llama2_7b_1m.sh --recipe llama2-7b-1m-8gpu \
  --final-rope-theta 1e9 -- "${small8[@]}" > "$work/e.log" 2>&1 || { cat "$work/e.log"; slurm_fail "the 8-GPU chain was not submitted"; }
cat "$work/e.log"
grep -q "^easyctx: configs/recipes/llama2-7b-1m-8gpu is sized for 8 GPUs; on 2, sized by --set .*parallel.sequence.size=2" "$work/e.log" ||
  slurm_fail "the scaled-down 8-GPU chain did not say it runs on 2 sized by --set"
grep -q "^easyctx: s7-512k: 256 tokens per optimizer step (seq_length 128 x batch_size 1 x grad_accum 2 x 1 data-parallel)$" "$work/e.log" ||
  slurm_fail "the scaled-down s7 does not print its tokens per step"
e7=$(job_of "$work/e.log" s7)
ef=$(sed -nE 's/^easyctx: final rope theta: job ([0-9]+) \(after ([0-9]+)\), rope_theta 1e9, output (.*)$/\1 \2 \3/p' "$work/e.log")
set -- $ef
[ "${2:-}" = "$e7" ] && [ "${3:-}" = "$eight/s7-512k-rope-theta-1e9" ] || slurm_fail "no final-theta job after s7 (job $e7): '$ef'"
efj=$1
slurm_wait_state "$efj" "COMPLETED FAILED CANCELLED" 240
[ "$(slurm_job_field "$efj" JobState)" = COMPLETED ] || slurm_fail "the final-theta export (job $efj) ended $(slurm_job_field "$efj" JobState)"
flog=$clone/slurm-easyctx-final-rope-theta-$efj.out
grep -q "^easyctx: exported: $eight/s7-512k-rope-theta-1e9 (config.json rope_theta " "$flog" || slurm_fail "the export's log does not say it exported"
grep -q "^converted .*$eight/s7-512k/checkpoints/step-00000010" "$flog" || { cat "$flog"; slurm_fail "the export is not s7's last checkpoint (step 10)"; }
python3 - "$eight/s7-512k-rope-theta-1e9" "$eight/s7-512k/final" <<'PY' || slurm_fail "the final-theta export is not s7's model with rope_theta 1e9"
import json, os, struct, sys
fin, s7 = sys.argv[1], sys.argv[2]
c, c7 = json.load(open(os.path.join(fin, "config.json"))), json.load(open(os.path.join(s7, "config.json")))
assert c["rope_theta"] == 1e9, c["rope_theta"]
assert c7["rope_theta"] == 2.5e8, ("s7's own export", c7["rope_theta"])
for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
    assert c[k] == c7[k], (k, c[k], c7[k])
def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            b = open(os.path.join(d, f), "rb").read()
            n = struct.unpack("<Q", b[:8])[0]
            out.update({k: v["shape"] for k, v in json.loads(b[8:8 + n]).items() if k != "__metadata__"})
    return out
t, t7 = tensors(fin), tensors(s7)
assert t and t == t7, "tensors differ from s7's export"
print("ok: final-theta export: config.json rope_theta", c["rope_theta"], "(s7's own:", c7["rope_theta"], "),", len(t), "tensors as s7's")
PY
# Run again: the stages are DONE and the export exists, so nothing is submitted or overwritten.
EASYCTX_STAGES=s6,s7 EASYCTX_INIT=random EASYCTX_OUT=$eight bash slurm/recipe_llama2_7b_1m.sh --recipe llama2-7b-1m-8gpu \
  --final-rope-theta 1e9 -- "${small8[@]}" > "$work/e-again.log" 2>&1 || { cat "$work/e-again.log"; slurm_fail "running the 8-GPU chain again failed"; }
grep -q "^easyctx: final rope theta: $eight/s7-512k-rope-theta-1e9 exists already: not exported again" "$work/e-again.log" &&
  grep -q "^easyctx: submitted 0 job(s)" "$work/e-again.log" || { cat "$work/e-again.log"; slurm_fail "the finished 8-GPU chain run again submitted jobs"; }
echo "ok: the finished 8-GPU chain and its export, run again, submit nothing (the 8-GPU part: $(( $(date +%s) - t6 )) s)"
echo "PASS: recipe chain from a fresh clone: submission, preemption + resume, equal weights, report, failure; the 8-GPU recipe by world size, refusals, final rope theta ($(( $(date +%s) - t0 )) s)"
