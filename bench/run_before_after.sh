#!/usr/bin/env bash
# Two builds of easyctx_train on the same full training steps, alternated in one call (A B A B
# ...), so a change that must not cost speed is measured against the code before it on the
# same GPU at the same time: bench/run_train.sh per run (its median tokens/s over the steps
# after the first), tagged with the build.
#
#   BIN_A=before/easyctx_train BIN_B=after/easyctx_train RUNS="1b:65536 7b:131072" REPEAT=2 \
#     bash bench/run_before_after.sh [extra --set for both ...]
#
# REPEAT (default 2) rounds; STEPS as run_train.sh (default 3). One JSON line per run, with
# "build": "A" or "B"; then, per model:tokens, the two builds' median tokens/s and B / A.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_A=${BIN_A:?the first easyctx_train}
BIN_B=${BIN_B:?the second easyctx_train}
RUNS=${RUNS:-"1b:65536"}
REPEAT=${REPEAT:-2}
lines=$(mktemp)
for run in $RUNS; do
  for ((i = 0; i < REPEAT; ++i)); do
    for build in A B; do
      bin=$BIN_A
      [ "$build" = B ] && bin=$BIN_B
      BIN=$bin RUNS=$run RESULTS=/dev/null bash bench/run_train.sh "$@" | python3 -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l); r["build"] = sys.argv[1]; print(json.dumps(r), flush=True)' "$build" | tee -a "$lines"
    done
  done
done
python3 - "$lines" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for key in sorted({(r["model"], r["seq"]) for r in rows}):
    tps = {b: [r["tokens_per_s"] for r in rows if (r["model"], r["seq"]) == key and r["build"] == b and "tokens_per_s" in r]
           for b in "AB"}
    if tps["A"] and tps["B"]:
        a, b = statistics.median(tps["A"]), statistics.median(tps["B"])
        print(f"{key[0]} {key[1]}: A {tps['A']} B {tps['B']} tok/s, median B / A = {b / a:.4f}")
PY
rm -f "$lines"
