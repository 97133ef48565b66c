#!/usr/bin/env bash
# The context-extension proof over seeds (docs/results.md): bench/run_extension.sh runs one
# seed; this makes one run's tables and checks its targets, packs a run for the trip back from
# a device call, and collects several seeds into tables of mean and spread.
#
#   bash bench/extension_seeds.sh tables RUN [SCALE]
#       from RUN/eval/<model>/needle.csv and ppl.csv (whatever was evaluated):
#         accuracy.csv  model,length,context,score,samples  (the needle's mean over depths at
#                       each prompt length; context = the haystack's tokens)
#         accuracy.md   the same as a table, model x length; and the needle by depth
#         ppl.csv       model,tokens,ppl  (held-out perplexity)
#         targets.txt   one line per target, PASS or FAIL, the value, the threshold:
#           the base at S0 (its training length) >= 0.9
#           the base at every length >= 4 S0 <= 0.2
#           the extended model (the last stage evaluated) over the lengths > S0 >= 0.8
#           the extended model at the longest length >= 0.6
#           the control (the base with the last stage's RoPE theta) over the lengths > S0 <= 0.2
#           the extended model's held-out perplexity at the longest length <= at S0
#         and INFO lines for the ablation (the same stages at the base's theta), no threshold
#   bash bench/extension_seeds.sh pack RUN FILE.tar.gz
#       RUN's tables, targets, summary, timing, isolation check, the evaluations' CSVs, heatmaps
#       and summaries, the windows' h5recall.json and the training metrics: a few hundred KB.
#   bash bench/extension_seeds.sh collect OUT.md RUN... (or FILE.tar.gz...: unpacked beside it)
#       the targets per seed, then accuracy by model and length as the mean over the runs with
#       the spread (min-max), and perplexity likewise. A run's seed is read from its summary.txt.
set -euo pipefail
cmd=${1:-}
shift || true

# The models of a run in table order: the base (s0-*), the control, the stages, the ablation.
models_of() {
  local run=$1
  # (nullglob: an arm that did not run, e.g. no abl-* without ABLATION=1, is no name and no
  # failing ls under pipefail.)
  (cd "$run/eval" && shopt -s nullglob && printf '%s\n' s0-*; [ -d control ] && echo control
   printf '%s\n' s[1-9]* | sort -V; printf '%s\n' abl-* | sort -V) | awk 'NF'
}

tables() {
  local run=$1 m ov base last abl
  [ -d "$run/eval" ] || { echo "extension_seeds.sh: $run/eval missing" >&2; return 2; }
  ov=$(sed -nE 's/.*"needle": ([0-9]+).*/\1/p' "$(ls "$run"/data/*/h5recall.json | head -1)" | head -1)
  echo "model,length,context,score,samples" > "$run/accuracy.csv"
  echo "model,tokens,ppl" > "$run/ppl.csv"
  for m in $(models_of "$run"); do
    [ -s "$run/eval/$m/needle.csv" ] &&
      awk -F, -v m="$m" -v ov="$ov" 'NR > 1 { s[$1] += $3; n[$1] += $4; c[$1]++ }
        END { for (k in s) printf "%s,%d,%d,%.4f,%d\n", m, k + ov, k, s[k] / c[k], n[k] }' "$run/eval/$m/needle.csv" |
      sort -t, -k2,2n >> "$run/accuracy.csv"
    [ -s "$run/eval/$m/ppl.csv" ] && awk -F, -v m="$m" 'NR > 1 { print m "," $1 "," $2 }' "$run/eval/$m/ppl.csv" >> "$run/ppl.csv"
  done
  {
    echo "**needle** (EasyContext's wording, held-out haystack; accuracy by prompt length in tokens, mean over depths)"
    echo
    md_table "$run/accuracy.csv"
    echo
    echo "**held-out perplexity** by context length"
    echo
    md_table_ppl "$run/ppl.csv"
  } > "$run/accuracy.md"
  cat "$run/accuracy.md"
  # (awk, not grep: an arm that did not run gives an empty name, not a failing pipeline.)
  base=$(models_of "$run" | awk '/^s0-/' | head -1)
  last=$(models_of "$run" | awk '/^s[1-9]/' | tail -1)
  abl=$(models_of "$run" | awk '/^abl-/' | tail -1)
  targets "$run" "$base" "$last" "$abl" | tee "$run/targets.txt"
}

# md_table CSV: model x length of accuracy.csv.
md_table() {
  awk -F, 'NR == 1 { next }
    { v[$1 SUBSEP $2] = $4; if (!($1 in sm)) { sm[$1] = 1; ms[++nm] = $1 } if (!($2 in sl)) { sl[$2] = 1; ls[++nl] = $2 } }
    END {
      for (i = 2; i <= nl; i++) for (j = i; j > 1 && ls[j - 1] + 0 > ls[j] + 0; j--) { x = ls[j]; ls[j] = ls[j - 1]; ls[j - 1] = x }
      printf "| model |"; for (i = 1; i <= nl; i++) printf " %s |", ls[i]; printf "\n|---|"
      for (i = 1; i <= nl; i++) printf "---|"; printf "\n"
      for (m = 1; m <= nm; m++) { printf "| %s |", ms[m]
        for (i = 1; i <= nl; i++) { k = ms[m] SUBSEP ls[i]; if (k in v) printf " %.2f |", v[k]; else printf " - |" }
        printf "\n" } }' "$1"
}
md_table_ppl() {
  awk -F, 'NR == 1 { next }
    { v[$1 SUBSEP $2] = $3; if (!($1 in sm)) { sm[$1] = 1; ms[++nm] = $1 } if (!($2 in sl)) { sl[$2] = 1; ls[++nl] = $2 } }
    END {
      for (i = 2; i <= nl; i++) for (j = i; j > 1 && ls[j - 1] + 0 > ls[j] + 0; j--) { x = ls[j]; ls[j] = ls[j - 1]; ls[j - 1] = x }
      printf "| model |"; for (i = 1; i <= nl; i++) printf " %s |", ls[i]; printf "\n|---|"
      for (i = 1; i <= nl; i++) printf "---|"; printf "\n"
      for (m = 1; m <= nm; m++) { printf "| %s |", ms[m]
        for (i = 1; i <= nl; i++) { k = ms[m] SUBSEP ls[i]; if (k in v) printf " %.1f |", v[k]; else printf " - |" }
        printf "\n" } }' "$1"
}

# acc MODEL OP LO HI: the mean (OP mean) or the largest (OP max) score of MODEL over lengths in
# [LO, HI]; "none" when no row matches.
acc() {
  awk -F, -v m="$1" -v op="$2" -v lo="$3" -v hi="$4" 'NR > 1 && $1 == m && $2 >= lo && $2 <= hi {
      s += $4; n++; if (n == 1 || $4 > mx) mx = $4 }
    END { if (!n) print "none"; else printf "%.3f\n", op == "max" ? mx : s / n }' "$RUNDIR/accuracy.csv"
}
ppl() { awk -F, -v m="$1" -v t="$2" 'NR > 1 && $1 == m && $2 == t { print $3; exit }' "$RUNDIR/ppl.csv"; }

targets() {
  local run=$1 base=$2 last=$3 abl=$4 S0 SL v
  RUNDIR=$run
  S0=$(awk -F, 'NR > 1 { if (!m || $2 < m) m = $2 } END { print m + 0 }' "$run/accuracy.csv")
  SL=$(awk -F, 'NR > 1 { if ($2 > m) m = $2 } END { print m + 0 }' "$run/accuracy.csv")
  line() {  # line VALUE OP THRESHOLD TEXT
    local ok=FAIL
    if [ "$1" != none ] && [ -n "$1" ] && [ -n "$3" ] &&
      awk -v a="$1" -v b="$3" -v op="$2" 'BEGIN { exit !(op == ">=" ? a >= b : a <= b) }'; then ok=PASS; fi
    echo "$ok $4: ${1:-none} ($2 ${3:-none})"
  }
  line "$(acc "$base" mean "$S0" "$S0")" ">=" 0.9 "base $base at $S0"
  line "$(acc "$base" max $((4 * S0)) "$SL")" "<=" 0.2 "base $base at every length $((4 * S0))-$SL (largest)"
  [ -n "$last" ] || { echo "FAIL no extended model evaluated"; return 0; }
  line "$(acc "$last" mean $((S0 + 1)) "$SL")" ">=" 0.8 "extended $last over $((2 * S0))-$SL (mean)"
  line "$(acc "$last" mean "$SL" "$SL")" ">=" 0.6 "extended $last at $SL"
  line "$(acc control mean $((S0 + 1)) "$SL")" "<=" 0.2 "control over $((2 * S0))-$SL (mean)"
  v=$(ppl "$last" "$SL")
  line "${v:-none}" "<=" "$(ppl "$last" "$S0")" "extended $last held-out perplexity at $SL, at most its perplexity at $S0"
  if [ -n "$abl" ]; then
    echo "INFO ablation $abl over $((2 * S0))-$SL (mean): $(acc "$abl" mean $((S0 + 1)) "$SL"); at $SL: $(acc "$abl" mean "$SL" "$SL");" \
      "held-out perplexity at $SL: $(ppl "$abl" "$SL")"
  fi
}

pack() {
  local run=$1 dest=$2 files
  files=$(cd "$run" && ls accuracy.csv accuracy.md targets.txt summary.txt timing.txt isolation.txt ppl.csv \
    eval/*/needle.csv eval/*/needle.png eval/*/summary.json eval/*/ppl.csv eval/*/*.log data/*/h5recall.json \
    runs/*/metrics.jsonl runs/*.log 2> /dev/null || true)
  [ -n "$files" ] || { echo "extension_seeds.sh: nothing to pack in $run" >&2; return 2; }
  # shellcheck disable=SC2086  # a list of relative paths without spaces
  tar -C "$run" -czf "$dest" $files
  echo "packed $(echo "$files" | wc -w) files of $run into $dest ($(du -h "$dest" | cut -f1))"
}

collect() {
  local md=$1 r dir seed runs=() seeds=()
  shift
  for r in "$@"; do
    if [ -f "$r" ] && [[ "$r" == *.tar.gz ]]; then
      dir=${r%.tar.gz}
      mkdir -p "$dir"
      tar -C "$dir" -xzf "$r"
    else
      dir=$r
    fi
    [ -s "$dir/accuracy.csv" ] || { echo "extension_seeds.sh: $dir/accuracy.csv missing" >&2; return 2; }
    seed=$(sed -nE 's/.*seed ([0-9]+).*/\1/p' "$dir/summary.txt" | head -n 1)
    runs+=("$dir")
    seeds+=("${seed:-?}")
  done
  {
    echo "Runs: ${#runs[@]} (seeds ${seeds[*]})."
    echo
    echo "**Targets, per seed** (bench/extension_seeds.sh tables)"
    echo
    echo "| seed | target | value | threshold | |"
    echo "|---|---|---|---|---|"
    for i in "${!runs[@]}"; do
      [ -s "${runs[$i]}/targets.txt" ] || continue
      grep -E '^(PASS|FAIL) ' "${runs[$i]}/targets.txt" |
        sed -E 's/^(PASS|FAIL) (.*): ([^ ]+) \(([^)]*)\)$/| '"${seeds[$i]}"' | \2 | \3 | \4 | \1 |/'
      # (INFO: the ablation's, on one seed only; sed -n prints what matches and never fails.)
      sed -nE 's/^INFO (.*)$/| '"${seeds[$i]}"' | \1 | | | info |/p' "${runs[$i]}/targets.txt"
    done
    for i in "${!runs[@]}"; do
      awk -F, -v s="${seeds[$i]}" 'NR > 1 { print s "," $1 "," $2 "," $4 }' "${runs[$i]}/accuracy.csv"
    done | spread "needle accuracy" "%.2f"
    for i in "${!runs[@]}"; do
      awk -F, -v s="${seeds[$i]}" 'NR > 1 { print s "," $1 "," $2 "," $3 }' "${runs[$i]}/ppl.csv"
    done | spread "held-out perplexity" "%.1f"
  } > "$md"
  echo "collected ${#runs[@]} runs into $md"
}

# spread TITLE FORMAT: rows "seed,model,length,value" -> a model x length table of the mean
# over the seeds with the spread (min-max).
spread() {
  awk -F, -v title="$1" -v f="$2" '
    { c = $2 SUBSEP $3; s[c] += $4; n[c]++; if (!(c in lo) || $4 < lo[c]) lo[c] = $4; if (!(c in hi) || $4 > hi[c]) hi[c] = $4
      if (!($1 in ss)) { ss[$1] = 1; ns++ }
      if (!($2 in sm)) { sm[$2] = 1; ms[++nm] = $2 } if (!($3 in sl)) { sl[$3] = 1; ls[++nl] = $3 } }
    END {
      for (i = 2; i <= nl; i++) for (j = i; j > 1 && ls[j - 1] + 0 > ls[j] + 0; j--) { x = ls[j]; ls[j] = ls[j - 1]; ls[j - 1] = x }
      printf "\n**%s** by length (tokens), mean over %d seed(s) (min-max)\n\n| model |", title, ns
      for (i = 1; i <= nl; i++) printf " %s |", ls[i]; printf "\n|---|"
      for (i = 1; i <= nl; i++) printf "---|"; printf "\n"
      for (m = 1; m <= nm; m++) { printf "| %s |", ms[m]
        for (i = 1; i <= nl; i++) { c = ms[m] SUBSEP ls[i]
          if (c in n) printf " " f " (" f "-" f ") |", s[c] / n[c], lo[c], hi[c]; else printf " - |" }
        printf "\n" } }'
}

case "$cmd" in
  tables) [ $# -ge 1 ] || { echo "usage: extension_seeds.sh tables RUN [SCALE]" >&2; exit 2; }; tables "$1" ;;
  pack) [ $# -eq 2 ] || { echo "usage: extension_seeds.sh pack RUN FILE.tar.gz" >&2; exit 2; }; pack "$@" ;;
  collect) [ $# -ge 2 ] || { echo "usage: extension_seeds.sh collect OUT.md RUN..." >&2; exit 2; }; collect "$@" ;;
  *) echo "usage: extension_seeds.sh tables|pack|collect ... (see its header)" >&2; exit 2 ;;
esac
