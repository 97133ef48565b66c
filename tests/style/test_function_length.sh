#!/usr/bin/env bash
# No function in lib/ is longer than 80 lines (signature to closing brace; the issue's rule for
# the next engineer): scripts/check_function_length.py lists any that is. First the checker
# itself on function_length_cases.cpp, so that a change to it that stops finding functions
# cannot pass unnoticed.
# Usage: test_function_length.sh [SOURCE_DIR]   (default: the repository this script is in)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
check=$root/scripts/check_function_length.py
cases=$root/tests/style/function_length_cases.cpp
found=$({ python3 "$check" --limit 4 "$cases" 2>/dev/null || true; } | sed 's/^[0-9]* [^ ]*:\([0-9]*\) .*/\1/' | sort -n | tr '\n' ' ')
expected="7 18 33 42 "
if [[ $found != "$expected" ]]; then
  echo "check_function_length.py on $cases: functions at lines '$found', expected '$expected'"
  python3 "$check" --limit 4 "$cases" || true
  exit 1
fi
cd "$root"
python3 "$check" --limit 80 lib
