#!/usr/bin/env bash
# h5tokenize's peak memory on one huge record (docs/data.md, "Memory"; bench/RESULTS.md):
# a record of MB megabytes (default 50) with and without spaces, in text mode and as the
# answer of a chat, through each h5tokenize binary given. Runs on the CPU, one case at a time;
# prints a table of maximum RSS (`/usr/bin/time -v`), wall time and the forced cuts warned.
#   bash bench/h5tokenize_memory.sh [H5TOKENIZE...]   # default: build/bin/h5tokenize
# Environment: MB (50), TOKENIZER (../shared/fixtures/tokenizers/llama2/tokenizer.model),
# CAP_KB (16000000: a `ulimit -v` guard so a binary that would take all memory fails instead),
# OUT (a scratch folder, default /tmp/h5tokenize-memory).
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${MB:-50}
TOKENIZER=${TOKENIZER:-../shared/fixtures/tokenizers/llama2/tokenizer.model}
CAP_KB=${CAP_KB:-16000000}
OUT=${OUT:-/tmp/h5tokenize-memory}
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=(build/bin/h5tokenize)
mkdir -p "$OUT"
python3 - "$OUT" "$MB" <<'EOF'
import json, random, sys
out, mb = sys.argv[1], int(sys.argv[2])
rng = random.Random(53)
words = "the river ran under a stone bridge and nine birds sang over the old town".split()
def text(spaces):
    parts, n = [], 0
    while n < mb * 1000000:
        w = rng.choice(words) + (" " if spaces else "")
        parts.append(w)
        n += len(w)
    return "".join(parts)
for spaces in (True, False):
    t = text(spaces)
    name = "spaces" if spaces else "nospaces"
    with open(f"{out}/text-{name}.jsonl", "w") as f:
        f.write(json.dumps({"text": t}) + "\n")
    chat = {"messages": [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": t}]}
    with open(f"{out}/chat-{name}.jsonl", "w") as f:
        f.write(json.dumps(chat) + "\n")
EOF
printf '| binary | record (%s MB) | peak RSS MB | wall s | forced cuts |\n|---|---|---|---|---|\n' "$MB"
for bin in "${BINS[@]}"; do
  for mode in text chat; do
    for kind in spaces nospaces; do
      flags=(--format "$mode" --threads 1)
      [ "$mode" = chat ] && flags+=(--chat-template llama2)
      log="$OUT/$mode-$kind.log"
      set +e
      ( ulimit -v "$CAP_KB"; /usr/bin/time -v "$bin" -t "$TOKENIZER" "${flags[@]}" --overwrite -o "$OUT/out" \
          "$OUT/$mode-$kind.jsonl" ) > "$log" 2>&1
      rc=$?
      set -e
      rss=$(awk '/Maximum resident set size/ {printf "%.0f", $6 / 1024}' "$log")
      wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; printf "%.1f", s}' "$log")
      cuts=$(grep -o 'cut [0-9]* time' "$log" | awk '{print $2}' | head -1 || true)
      status=""
      [ "$rc" = 0 ] || status=" (exit $rc: $(grep -m1 -o 'error: .*' "$log" | cut -c1-60 || true))"
      printf '| %s | %s, %s | %s%s | %s | %s |\n' "$bin" "$mode" "$kind" "$rss" "$status" "$wall" "${cuts:-0}"
    done
  done
done
