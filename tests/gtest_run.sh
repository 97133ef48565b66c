#!/usr/bin/env bash
# Runs one ctest entry of a GoogleTest binary and tells ctest the truth about it.
#
#   gtest_run.sh XML -- COMMAND...     (COMMAND: [mpirun -np N ...] BINARY ARGS)
#
# COMMAND runs with --gtest_output=xml:XML appended (under mpirun each rank writes its own
# report, XML's .rank<r>.xml: tests/test_main.cpp). The exit status comes from the reports:
#   0   every case that ran passed;
#   77  every case skipped (ctest's SKIP_RETURN_CODE: the entry shows as "Skipped"), or
#       only some did: a partial skip is never reported as a pass;
#   1   a case failed on any rank, the program failed or died without a report, or no case
#       ran at all (a filter that matches nothing is an error, not a pass).
# Skip reasons and failures are printed from the reports too: under mpirun, ranks other
# than 0 print nothing themselves.
set -uo pipefail
xml=${1:?usage: gtest_run.sh XML -- COMMAND...}
shift
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "gtest_run.sh: no command" >&2; exit 2; }
mkdir -p "$(dirname "$xml")"
rm -f "$xml" "${xml%.xml}".rank*.xml
# Open MPI keeps its session directories under <tmpdir base>/ompi.<host>.<uid>/jf.<job family>,
# and every singleton (each GoogleTest binary calls MPI_Init) uses job family 0: one entry's
# cleanup could remove that directory while another entry's MPI_Init was creating it ("A call
# to mkdir was unable to create the desired directory: /tmp/ompi.vm.0/jf.0", orte_init failed).
# Each entry gets a base of its own (mpirun and the programs it starts inherit it).
ompi_tmp=$(mktemp -d "${TMPDIR:-/tmp}/easyctx-ompi.XXXXXX")
trap 'rm -rf "$ompi_tmp"' EXIT
export OMPI_MCA_orte_tmpdir_base=$ompi_tmp
"$@" "--gtest_output=xml:$xml"
rc=$?

reports=()
for f in "$xml" "${xml%.xml}".rank*.xml; do [ -f "$f" ] && reports+=("$f"); done
if [ ${#reports[@]} -eq 0 ]; then
  echo "gtest_run.sh: no GoogleTest report (exit status $rc): the program crashed or was killed" >&2
  exit 1
fi
summary=$(awk -f "$(dirname "$0")/gtest_xml.awk" "${reports[@]}")
printf '%s\n' "$summary" | sed '$d'
read -r _ run passed skipped failed <<<"$(printf '%s\n' "$summary" | tail -n 1)"
if [ "$rc" -ne 0 ] || [ "$failed" -gt 0 ]; then
  echo "gtest_run.sh: exit status $rc; $failed of $run cases failed" >&2
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; then exit 1; fi
  exit "$rc"
fi
if [ "$run" -eq 0 ]; then
  echo "gtest_run.sh: no test case ran (a filter that matches nothing?)" >&2
  exit 1
fi
if [ "$skipped" -gt 0 ]; then
  [ "$skipped" -lt "$run" ] && echo "gtest_run.sh: PARTIAL SKIP: $skipped of $run cases skipped, $passed passed" >&2
  exit 77
fi
exit 0
