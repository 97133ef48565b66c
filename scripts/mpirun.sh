#!/usr/bin/env bash
# mpirun whose stop signals checkpoint: `bash scripts/mpirun.sh -np 8 build/bin/easyctx_train
# stage.yaml` takes mpirun's arguments and runs it.
#
# Why: Open MPI's mpirun (4.1) forwards SIGUSR1 and SIGUSR2 to every rank, which the trainer
# answers with a checkpoint at the next step boundary and exit 0; but on SIGTERM or SIGINT it
# ends the job itself (SIGTERM to the ranks after odls_base_sigkill_timeout, 1 s, SIGKILL
# after another) and exits 1, which leaves a long-context step no time to save. This script
# runs mpirun in a session of its own, so a terminal's Ctrl-C and `timeout`'s signal to the
# process group reach only this script, and turns SIGTERM, SIGINT and SIGHUP into SIGUSR1 for
# mpirun (SIGUSR1 and SIGUSR2 pass as they are). Exit code: mpirun's, or 130 when the stop
# came from SIGINT and the ranks stopped cleanly. A second SIGINT ends the job at once (no
# checkpoint). docs/training.md, "Stopping a run".
set -uo pipefail
command -v mpirun >/dev/null || { echo "mpirun.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 127; }
launch=()
command -v setsid >/dev/null && launch=(setsid)
# stdin from /dev/null: a process outside the terminal's foreground group must not read it.
"${launch[@]}" mpirun "$@" </dev/null &
pid=$!
got=""
forward() {
  local sig=$1 to=USR1
  [ "$sig" = USR2 ] && to=USR2
  if [ "$sig" = INT ] && [ "$got" = INT ]; then
    echo "mpirun.sh: second SIGINT: ending the job now, without a checkpoint" >&2
    kill -TERM "$pid" 2>/dev/null
    return
  fi
  [ "$got" = INT ] || got=$sig
  echo "mpirun.sh: SIG$sig: every rank checkpoints at its next step and stops (SIG$to through mpirun)" >&2
  kill -"$to" "$pid" 2>/dev/null
}
for s in TERM INT HUP USR1 USR2; do
  # shellcheck disable=SC2064
  trap "forward $s" "$s"
done
# A trapped signal interrupts `wait`: wait again until mpirun itself has exited.
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid"
done
wait "$pid"
rc=$?
trap - TERM INT HUP USR1 USR2
[ "$got" = INT ] && [ "$rc" -eq 0 ] && rc=130
exit "$rc"
