#!/usr/bin/env bash
# After a ctest run (scripts/test.sh): what was skipped and why, and the GoogleTest case
# counts over the whole run. Reads BUILD/test-results/: ctest's JUnit file (ctest-junit.xml,
# every ctest entry, GoogleTest or not) and the GoogleTest XML reports tests/gtest_run.sh
# writes there (one folder per ctest entry, one file per case and rank).
#
#   test_report.sh BUILD [--allowed-skips FILE]
#
# With --allowed-skips (CI: tests/ci_allowed_skips.txt) a skipped ctest entry that the file
# does not allow here is an error (exit 1). Prints its counts line last.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
build=${1:?usage: test_report.sh BUILD [--allowed-skips FILE]}
allowed=""
[ "${2:-}" = "--allowed-skips" ] && allowed=${3:?--allowed-skips needs a file}
results="$build/test-results"
junit="$results/ctest-junit.xml"
fixtures="$src/../shared/fixtures/tokenizers"
if [ ! -f "$junit" ]; then
  echo "test_report.sh: $junit not found (ctest --output-junit test-results/ctest-junit.xml)" >&2
  exit 1
fi

have_fixtures=1
for f in llama2/tokenizer.model llama3/tokenizer.json; do [ -s "$fixtures/$f" ] || have_fixtures=0; done
have_transformers=0
for py in python3 /usr/bin/python3; do "$py" -c "import transformers, sentencepiece" 2>/dev/null && have_transformers=1; done
have_gpu=0
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && have_gpu=1

# ctest entries: "STATUS<TAB>NAME<TAB>SKIP line of its output", STATUS run, skipped, fail,
# notrun (not run at all: a missing program, a failed dependency) or disabled.
entries=$(awk '
  /<testcase / {
    name = $0; sub(/.* name="/, "", name); sub(/".*/, "", name)
    st = $0; sub(/.* status="/, "", st); sub(/".*/, "", st)
    why = ""
  }
  /<skipped message="SKIP_RETURN_CODE=77"/ { st = "skipped" }
  why == "" && /SKIP: / { why = $0; sub(/.*SKIP: /, "", why) }
  /<\/testcase>/ { print st "\t" name "\t" why }' "$junit")
# GoogleTest cases: "STATUS<TAB>ENTRY:Suite.Case<TAB>reason" and the "total" line.
cases=""
xmls=$(find "$results" -mindepth 2 -name '*.xml' | sort)
[ -n "$xmls" ] && cases=$(printf '%s\n' "$xmls" | tr '\n' '\0' | xargs -0 awk -v list=1 -f "$here/gtest_xml.awk")

# A skip is allowed when a line of FILE matches the entry's name (a shell pattern) and its
# condition holds here: gpu (no GPU on this machine), fixtures (the Llama tokenizer
# fixtures are absent) or transformers (python3 cannot import transformers).
allowed_reason() {  # NAME -> prints "PATTERN<TAB>condition" and succeeds when allowed
  local name=$1 pattern cond reason
  [ -n "$allowed" ] || return 1
  while read -r pattern cond reason; do
    case "$pattern" in ''|'#'*) continue ;; esac
    # shellcheck disable=SC2254
    case "$name" in
      $pattern)
        case "$cond" in
          gpu) [ "$have_gpu" -eq 0 ] && { printf '%s\t%s\n' "$pattern" gpu; return 0; } ;;
          fixtures) [ "$have_fixtures" -eq 0 ] && { printf '%s\t%s\n' "$pattern" fixtures; return 0; } ;;
          transformers) [ "$have_transformers" -eq 0 ] && { printf '%s\t%s\n' "$pattern" transformers; return 0; } ;;
          *) echo "test_report.sh: $allowed: unknown condition '$cond' for $pattern" >&2 ;;
        esac ;;
    esac
  done < "$allowed"
  return 1
}

# Skipped entries, grouped by (pattern of the allowed-skip list, or else ENTRY:*) and reason:
# "  COUNT  NAME-or-GROUP: reason  [verdict]".
skipped_entries=$(printf '%s\n' "$entries" | awk -F'\t' '$1 == "skipped" {print $2}')
raw=""
if [ -n "$skipped_entries" ]; then
  raw=$(while IFS= read -r name; do
    # ENTRY:all-cases (a GPU binary where no GPU is visible): the reason of its first case
    why=$(printf '%s\n' "$cases" | awk -F'\t' -v n="$name" '
      BEGIN { p = n; sub(/:all-cases$/, ":", p) }
      $2 == n || (p != n && index($2, p) == 1) {print $3; exit}')
    [ -n "$why" ] || why=$(printf '%s\n' "$entries" | awk -F'\t' -v n="$name" '$2 == n {print $3; exit}')
    group=$name verdict=""
    [[ $name == *:* ]] && group=${name%%:*}
    if [ -n "$allowed" ]; then
      if ok=$(allowed_reason "$name"); then group=${ok%%$'\t'*} verdict="  [allowed: ${ok#*$'\t'}]"
      else group=$name verdict="  [NOT ALLOWED here]"; fi
    fi
    printf '%s\t%s\t%s\t%s\n' "$group" "$name" "${why:-see its output}" "$verdict"
  done <<<"$skipped_entries")
  echo "== $(printf '%s\n' "$raw" | wc -l) skipped ctest entries: how many, which, why (the test's own words)"
  printf '%s\n' "$raw" | sort | awk -F'\t' '
    { k = $1 "\t" $3 "\t" $4; if (!(k in n)) order[++m] = k; n[k]++; one[k] = $2 }
    END { for (i = 1; i <= m; ++i) { split(order[i], f, "\t"); k = order[i]
            printf "  %3d  %s: %s%s\n", n[k], n[k] == 1 ? one[k] : f[1], f[2], f[3] } }'
fi
bad=$(printf '%s\n' "$raw" | grep -c 'NOT ALLOWED here' || true)
not_run=$(printf '%s\n' "$entries" | awk -F'\t' '$1 == "notrun" {print "  " $2}')
[ -z "$not_run" ] || { echo "== ctest entries that did not run (counted as failed by ctest)"; echo "$not_run"; }
# Entries that ran a GoogleTest case but left no report: crashed, killed or timed out
# (ENTRY:all-cases: no report of any of its cases).
no_report=$(printf '%s\n' "$entries" | awk -F'\t' -v c="$cases" '
  BEGIN { k = split(c, l, "\n")
          for (i = 1; i <= k; ++i) { split(l[i], f, "\t"); seen[f[2]] = 1; e = f[2]; sub(/:.*/, "", e); any[e] = 1 } }
  $2 ~ /:/ && $1 != "notrun" && !($2 in seen) { e = $2; sub(/:.*/, "", e)
    if (!($2 ~ /:all-cases$/ && (e in any))) print "  " $2 }')
if [ -n "$no_report" ]; then
  echo "== GoogleTest entries without a report (crashed, killed or timed out)"
  echo "$no_report"
fi

if [ "$have_fixtures" -eq 0 ]; then
  echo "NOTE: Llama tokenizer fixtures absent ($fixtures): the tokenizer-equality tests were reported skipped"
fi
if [ "$bad" -gt 0 ]; then
  echo "ERROR: $bad ctest entries skipped that must run here (not allowed by $allowed)"
fi
read -r e_run e_fail e_skip <<<"$(printf '%s\n' "$entries" | awk -F'\t' '
  $1 == "run" {r++} $1 == "fail" || $1 == "notrun" {f++} $1 == "skipped" {s++}
  END {print r + 0, f + 0, s + 0}')"
e_disabled=$(printf '%s\n' "$entries" | awk -F'\t' '$1 == "disabled"' | wc -l)
read -r _ run passed skipped failed <<<"$(printf '%s\n' "${cases:-total 0 0 0 0}" | tail -n 1)"
echo "ctest entries: $((e_run + e_fail + e_skip + e_disabled)) ($e_run passed, $e_skip skipped," \
     "$e_fail failed or not run, $e_disabled disabled)"
echo "GoogleTest cases: $run run, $passed passed, $skipped skipped, $failed failed" \
     "(an mpirun case counts once over its ranks)"
[ "$bad" -eq 0 ]
