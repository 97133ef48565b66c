#!/usr/bin/env bash
# The context-extension experiment over seeds (docs/results.md): bench/run_extension.sh runs one
# seed; this checks one run against the targets, packs a run's results for the trip back from
# a device call, and collects several seeds into tables of mean and spread.
#
#   bash bench/extension_seeds.sh targets RUN BASE LAST S0 S_LAST
#       one line per target, PASS or FAIL, from RUN/accuracy.csv and RUN/ppl.csv (BASE, LAST:
#       the base and last stage's model names; S0: the base length; S_LAST: the last stage's):
#         the base retrieves at S0: needle and pass key each >= 0.9 (each task that was scored)
#         the base beyond 2 S0 (lengths > 2 S0, all tasks): <= 0.2
#         the control (base + the last stage's RoPE theta) beyond 2 S0: <= 0.2
#         the last stage over [2 S0, S_LAST] (lengths never trained with retrieval): >= 0.8
#         held-out perplexity at S_LAST: the last stage's below the base's
#   bash bench/extension_seeds.sh pack RUN FILE.tar.gz
#       RUN's tables, targets, summary, perplexity, heatmaps, report page, the stages' data
#       summaries (h5synth.json) and training metrics: a few hundred KB.
#   bash bench/extension_seeds.sh collect OUT.md RUN... (or FILE.tar.gz...: unpacked beside it)
#       per-seed targets, then accuracy by model and prompt length as the mean over the runs
#       with the spread (min-max), per task and all tasks together, and perplexity likewise.
#       A run's seed is read from its summary.txt.
set -euo pipefail
cmd=${1:-}
shift || true

# mean_of ACC MODEL TASK LO HI: mean score of the rows with the model, the task ("all": every
# task) and a prompt length in [LO, HI]; "none" when no row matches.
mean_of() {
  awk -F, -v m="$2" -v t="$3" -v lo="$4" -v hi="$5" 'NR > 1 && $1 == m && (t == "all" || $2 == t) && $3 >= lo && $3 <= hi { s += $5; n++ }
    END { if (n) printf "%.3f\n", s / n; else print "none" }' "$1"
}
ppl_of() { awk -F, -v m="$2" -v t="$3" 'NR > 1 && $1 == m && $2 == t { print $3; exit }' "$1"; }

targets() {
  local run=$1 base=$2 last=$3 S0=$4 SL=$5 acc=$1/accuracy.csv ppl=$1/ppl.csv t v ok
  [ -s "$acc" ] && [ -s "$ppl" ] || { echo "extension_seeds.sh: $acc or $ppl missing" >&2; return 2; }
  line() {  # line VALUE OP THRESHOLD TEXT
    if [ "$1" != none ] && awk -v a="$1" -v b="$3" -v op="$2" 'BEGIN { exit !(op == ">=" ? a >= b : op == "<=" ? a <= b : a < b) }'
    then ok=PASS; else ok=FAIL; fi
    echo "$ok $4: $1 ($2 $3)"
  }
  for t in $(awk -F, 'NR > 1 { print $2 }' "$acc" | sort -u); do
    line "$(mean_of "$acc" "$base" "$t" "$S0" "$S0")" ">=" 0.9 "base $t at $S0"
  done
  line "$(mean_of "$acc" "$base" all $((2 * S0 + 1)) "$SL")" "<=" 0.2 "base beyond $((2 * S0)) (all tasks)"
  line "$(mean_of "$acc" control all $((2 * S0 + 1)) "$SL")" "<=" 0.2 "control beyond $((2 * S0)) (all tasks)"
  line "$(mean_of "$acc" "$last" all $((2 * S0)) "$SL")" ">=" 0.8 "$last over $((2 * S0))-$SL (all tasks)"
  v=$(ppl_of "$ppl" "$last" "$SL")
  line "${v:-none}" "<" "$(ppl_of "$ppl" "$base" "$SL")" "$last held-out perplexity at $SL, below the base's"
}

pack() {
  local run=$1 dest=$2 files
  files=$(cd "$run" && ls accuracy.csv accuracy.md targets.txt summary.txt ppl.csv ppl.png report.html \
    runs/*/eval/*.csv runs/*/eval/*.png runs/*/eval/control/*.png runs/*/metrics.jsonl runs/*.probe/*.csv \
    data/*/h5synth.json 2>/dev/null || true)
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
    echo "**Targets, per seed** (bench/extension_seeds.sh targets)"
    echo
    echo "| seed | target | value | threshold | |"
    echo "|---|---|---|---|---|"
    for i in "${!runs[@]}"; do
      [ -s "${runs[$i]}/targets.txt" ] || continue
      sed -E 's/^(PASS|FAIL) (.*): ([^ ]+) \(([^)]*)\)$/| '"${seeds[$i]}"' | \2 | \3 | \4 | \1 |/' "${runs[$i]}/targets.txt"
    done
    for i in "${!runs[@]}"; do
      awk -F, -v s="${seeds[$i]}" 'NR > 1 { print s "," $0 }' "${runs[$i]}/accuracy.csv"
    done | awk -F, '
      { key = $2 SUBSEP $3 SUBSEP $4; v[key, $1] = $6; if (!(key in seen)) { seen[key] = 1; keys[++nk] = key }
        if (!($2 in mseen)) { mseen[$2] = 1; models[++nm] = $2 } if (!($4 in lseen)) { lseen[$4] = 1; lens[++nl] = $4 }
        if (!($3 in tseen)) { tseen[$3] = 1; tasks[++nt] = $3 } if (!($1 in sseen)) { sseen[$1] = 1; seeds[++ns] = $1 }
        all[$2 SUBSEP $4 SUBSEP $1] += $6; alln[$2 SUBSEP $4 SUBSEP $1]++ }
      END {
        for (i = 2; i <= nl; i++) for (j = i; j > 1 && lens[j - 1] + 0 > lens[j] + 0; j--) { x = lens[j]; lens[j] = lens[j - 1]; lens[j - 1] = x }
        for (i = 2; i <= nt; i++) for (j = i; j > 1 && tasks[j - 1] > tasks[j]; j--) { x = tasks[j]; tasks[j] = tasks[j - 1]; tasks[j - 1] = x }
        if (nt > 1) tasks[++nt] = "all"
        for (t = 1; t <= nt; t++) {
          printf "\n**%s**: accuracy by prompt length (tokens), mean over %d seeds (min-max)\n\n| model |", tasks[t], ns
          for (i = 1; i <= nl; i++) printf " %d |", lens[i]
          printf "\n|---|"
          for (i = 1; i <= nl; i++) printf "---|"
          printf "\n"
          for (m = 1; m <= nm; m++) {
            printf "| %s |", models[m]
            for (i = 1; i <= nl; i++) {
              s = 0; n = 0; lo = 2; hi = -1
              for (k = 1; k <= ns; k++) {
                if (tasks[t] == "all") { c = models[m] SUBSEP lens[i] SUBSEP seeds[k]; if (!(c in alln)) continue; x = all[c] / alln[c] }
                else { c = models[m] SUBSEP tasks[t] SUBSEP lens[i]; if (!((c, seeds[k]) in v)) continue; x = v[c, seeds[k]] }
                s += x; n++; if (x < lo) lo = x; if (x > hi) hi = x
              }
              if (n) printf " %.2f (%.2f-%.2f) |", s / n, lo, hi; else printf " - |"
            }
            printf "\n"
          }
        }
      }'
    echo
    echo "**Held-out perplexity** by context length (tokens), mean over seeds (min-max)"
    for i in "${!runs[@]}"; do
      awk -F, -v s="${seeds[$i]}" 'NR > 1 { print s "," $1 "," $2 "," $3 }' "${runs[$i]}/ppl.csv"
    done | awk -F, '
      { c = $2 SUBSEP $3; s[c] += $4; n[c]++; if (!(c in lo) || $4 < lo[c]) lo[c] = $4; if (!(c in hi) || $4 > hi[c]) hi[c] = $4
        if (!($2 in mseen)) { mseen[$2] = 1; models[++nm] = $2 } if (!($3 in lseen)) { lseen[$3] = 1; lens[++nl] = $3 } }
      END {
        for (i = 2; i <= nl; i++) for (j = i; j > 1 && lens[j - 1] + 0 > lens[j] + 0; j--) { x = lens[j]; lens[j] = lens[j - 1]; lens[j - 1] = x }
        printf "\n| model |"; for (i = 1; i <= nl; i++) printf " %d |", lens[i]
        printf "\n|---|"; for (i = 1; i <= nl; i++) printf "---|"
        printf "\n"
        for (m = 1; m <= nm; m++) {
          printf "| %s |", models[m]
          for (i = 1; i <= nl; i++) { c = models[m] SUBSEP lens[i]; if (c in n) printf " %.0f (%.0f-%.0f) |", s[c] / n[c], lo[c], hi[c]; else printf " - |" }
          printf "\n"
        }
      }'
  } > "$md"
  echo "collected ${#runs[@]} runs into $md"
}

case "$cmd" in
  targets) [ $# -eq 5 ] || { echo "usage: extension_seeds.sh targets RUN BASE LAST S0 S_LAST" >&2; exit 2; }; targets "$@" ;;
  pack) [ $# -eq 2 ] || { echo "usage: extension_seeds.sh pack RUN FILE.tar.gz" >&2; exit 2; }; pack "$@" ;;
  collect) [ $# -ge 2 ] || { echo "usage: extension_seeds.sh collect OUT.md RUN..." >&2; exit 2; }; collect "$@" ;;
  *) echo "usage: extension_seeds.sh targets|pack|collect ... (see its header)" >&2; exit 2 ;;
esac
