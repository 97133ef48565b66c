#!/usr/bin/env bash
# The GPU side of document masking (issue 42) in device calls: the CUDA test, the Hugging
# Face golden fixture `packed`, llama2-7b at 128K tokens on documents of 2K-16K tokens with and
# without data.document_mask, and two peers beside it. Everything a call needs is carried in
# .deps/docmask (git-ignored), made here by `prepare`; run from the repository root.
#
#   here:    bash bench/run_document_mask.sh prepare [BUILD_DIR]
#            .deps/docmask: easyctx_train and test_cuda_documents (stripped, xz), the host
#            libraries the GPU image lacks (as bench/prebuilt.sh), a shard of the KJV cut into
#            documents of 2.2K-16K tokens (the demo tokenizer, h5tokenize from BUILD_DIR),
#            tests/golden/make_golden.py, both peers, and this script (about 11 MB)
#   there:   bash .deps/docmask/run_document_mask.sh run PARTS 2>&1 | tee $OUT/log.txt
#            (carry .deps/docmask); PARTS, comma-separated, default test,golden,bench:
#            test    $OUT/test_cuda_documents.txt
#            golden  $OUT/packed.tar (make_golden.py --only packed)
#            check   peer_hf_packed.py --check: the packed peer's logits against each document
#                    alone (it masks what it says it masks)
#            bench   RUNS=7b:131072 STEPS=2 bench/run_train.sh, data.packing best_fit,
#                    document_mask true then false; on a GPU under 100 GiB with the 14 layer
#                    inputs an 80 GB card needs at 128K in host memory (OFFLOAD_LAYERS; 0: none),
#                    else as the plan chooses; RUNS and STEPS as run_train.sh's
#            peer    peer_hf_packed.py (transformers' flex_attention with packed position_ids:
#                    the same block-diagonal attention), then peer_hf_llama.py (plain causal
#                    attention over the window: SDPA has no packed form)
#            rows in $OUT/train_results.jsonl, logs in $OUT/trainlogs.tar.gz. Each part stops
#            at its share of a 585 s budget (DEADLINE_S).
#   here:    bash bench/run_document_mask.sh collect FILES_AT
#            the fixture into tests/golden/data/packed, the test's largest errors per case
#            and mode group, the training rows
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_pack.sh"
D=.deps/docmask
case "${1:-}" in
  prepare)
    set -e
    build=${2:-build}
    pack_device_dir $D "$build" easyctx_train test_cuda_documents
    tok=$(bash scripts/make_demo_tokenizer.sh .deps/tok)
    python3 - .deps/tok/kjv.txt $D/docs.jsonl <<'PY'
import json, random, sys
random.seed(42)
text = open(sys.argv[1], encoding="utf-8").read()
cpt, out, i = 3.46, open(sys.argv[2], "w"), 0  # characters per token of the demo tokenizer on the KJV
while i < len(text):  # documents of about 2,200-16,000 tokens, cut at line ends
    j = text.find("\n", i + int(random.uniform(2200, 16000) * cpt))
    j = len(text) if j < 0 else j + 1
    out.write(json.dumps({"text": text[i:j], "meta": {"redpajama_set_name": "kjv"}}) + "\n")
    i = j
PY
    "$build/bin/h5tokenize" -t "$tok" -o $D/docs2k16k --deflate 6 $D/docs.jsonl > /dev/null && rm $D/docs.jsonl
    cp tests/golden/make_golden.py bench/run_document_mask.sh bench/device_pack.sh $D/
    cp bench/peer_hf_packed.py $D/
    cp ../shared/bench/peer_hf_llama.py $D/ 2>/dev/null || echo "no ../shared/bench/peer_hf_llama.py: no peer" >&2
    du -sh $D
    ;;
  run)
    what=${2:-test,golden,bench}
    T0=$(date +%s)
    t() { echo "== [$(($(date +%s) - T0)) s] $*"; }
    cap() {  # seconds left of DEADLINE_S, at most $1
      local r=$((T0 + ${DEADLINE_S:-585} - $(date +%s)))
      echo $((r < $1 ? (r > 5 ? r : 5) : $1))
    }
    unpack_device_dir $D
    nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader
    echo "cores $(nproc); $(free -g | sed -n 2p)"
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    ldd $D/bin/* | grep "not found"
    if [[ $what == *test* ]]; then
      t test_cuda_documents
      timeout "$(cap 120)" stdbuf -oL -eL $D/bin/test_cuda_documents > "$OUT/test_cuda_documents.txt" 2>&1
      echo "test_cuda_documents rc $?"
      grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) +\]|Failure|not an sm_90" "$OUT/test_cuda_documents.txt" | head -30
    fi
    if [[ $what == *golden* ]]; then
      t golden packed
      rm -rf /tmp/golden
      timeout "$(cap 60)" python3 $D/make_golden.py --out /tmp/golden --only packed 2>&1 | grep -v -i warn | tail -12
      (cd /tmp/golden && tar -cf "$OUT/packed.tar" packed && find packed -type f -exec ls -la {} +)
    fi
    if [[ $what == *check* ]]; then
      t peer check
      timeout "$(cap 150)" python3 $D/peer_hf_packed.py --check 2>&1 | grep -v -i warn | tail -5
    fi
    if [[ $what == *bench* || $what == *peer* ]]; then
      python3 - $D/docs2k16k <<'PY'
import glob, sys, h5py, numpy as np
for f in sorted(glob.glob(sys.argv[1] + "/*.h5")):
    o = h5py.File(f, "r")["doc_offsets"][:]
    n = np.diff(o)
    print(f, "documents", len(n), "tokens", int(o[-1]), "min", int(n.min()), "max", int(n.max()), "mean", round(float(n.mean())))
PY
    fi
    export BIN=$D/bin/easyctx_train PEER_SCRIPT=$D/peer_hf_llama.py STEPS=${STEPS:-2} RUNS=${RUNS:-7b:131072}
    if [[ $what == *bench* ]]; then
      F=(--set "data.path=$D/docs2k16k" --set data.packing=best_fit)
      gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
      if ((gib < 100 * 1024 && ${OFFLOAD_LAYERS:-14} > 0)); then
        F+=(--set activation.offload=cpu --set activation.offload_layers=${OFFLOAD_LAYERS:-14})
      fi
      t easyctx document_mask true
      LAUNCH="timeout $(cap 150)" bash bench/run_train.sh "${F[@]}" --set data.document_mask=true
      t easyctx document_mask false
      LAUNCH="timeout $(cap 230)" bash bench/run_train.sh "${F[@]}" --set data.document_mask=false
    fi
    if [[ $what == *peer* ]]; then
      t peer packed
      timeout "$(cap 240)" python3 $D/peer_hf_packed.py --data $D/docs2k16k --runs "${RUNS// /,}" \
        --steps $((STEPS - 1)) > "$OUT/peer_packed.txt" 2>&1
      echo "peer_hf_packed rc $?"
      grep -v '^{' "$OUT/peer_packed.txt" | grep -v -i warn | tail -n 5
      grep '^{' "$OUT/peer_packed.txt" | python3 -c 'import json, sys
for l in sys.stdin:
    print(json.dumps(dict(system="peer_hf_packed", **json.loads(l))), flush=True)' | tee -a "$OUT/train_results.jsonl"
      t peer causal
      PEER_ONLY=1 timeout "$(cap 240)" bash bench/run_train.sh
    fi
    if [ -d /tmp/easyctx-bench ]; then
      (cd /tmp/easyctx-bench && tar -czf "$OUT/trainlogs.tar.gz" ./*.log ./*/metrics.jsonl 2>/dev/null)
    fi
    t "all done"
    ;;
  collect)
    at=${2:?usage: run_document_mask.sh collect FILES_AT}
    [ -f "$at/packed.tar" ] && tar -C tests/golden/data -xf "$at/packed.tar" && ls -la tests/golden/data/packed
    [ -f "$at/test_cuda_documents.txt" ] && python3 - "$at/test_cuda_documents.txt" <<'PY'
import collections, re, sys
worst, lse = collections.defaultdict(float), collections.defaultdict(float)
for line in open(sys.argv[1]):
    m = re.match(r"\[accuracy\] lse (.*?) \[.*\]: max abs err (\S+) nats", line)
    if m:
        lse[m.group(1)] = max(lse[m.group(1)], float(m.group(2)))
    m = re.match(r"\[accuracy\] \S+\s+(.*?) \[.*?\]( \w+ grads)?\s+(.+?)\s+rel err (\S+)", line)
    if m:
        k = (m.group(1), m.group(3) + (m.group(2) or ""))
        worst[k] = max(worst[k], float(m.group(4)))
for c in sorted(lse):
    print(c, "| lse %.3g nats |" % lse[c], ", ".join("%s %.3g" % (w, v) for (cc, w), v in sorted(worst.items()) if cc == c))
PY
    [ -f "$at/train_results.jsonl" ] && cat "$at/train_results.jsonl"
    ;;
  *) echo "usage: run_document_mask.sh prepare [BUILD_DIR] | run [test,golden,check,bench,peer] | collect FILES_AT" >&2; exit 2 ;;
esac
