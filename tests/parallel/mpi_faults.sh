#!/usr/bin/env bash
# mpi_faults.sh MPI_CHECK MPIRUN: the mpi backend under mpirun (oversubscribed): exact values of
# every collective at world sizes 1-4, then the fault matrix at world 3 — a throwing rank, a
# desync, a stalled rank and a rank that returns early must each end the job non-zero within
# the timeout, with a message naming the ranks; then the call check (the nccl backend's side
# channel). Each mpirun is wrapped in its own timeout.
set -uo pipefail
check="$1"
mpirun="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fails=0

# expect NAME NP RC REGEX ARGS...: exit status RC ("nonzero" for any but 0) and output matching
# the extended REGEX.
expect() {
  local name="$1" np="$2" rc_want="$3" regex="$4"
  shift 4
  local out rc
  # -k: an mpirun that does not end on SIGTERM is killed, so no run outlasts its limit.
  out="$(timeout -k 5 60 "$mpirun" -np "$np" "$check" "$@" 2>&1)"
  rc=$?
  if [[ $rc == 124 ]]; then
    echo "FAIL $name: hung (killed after 60 s)"
    fails=$((fails + 1))
  elif [[ "$rc_want" == nonzero && $rc == 0 ]] || [[ "$rc_want" != nonzero && $rc != "$rc_want" ]]; then
    echo "FAIL $name: exit $rc, expected $rc_want"
    echo "$out"
    fails=$((fails + 1))
  elif ! grep -Eq -- "$regex" <<<"$out"; then
    echo "FAIL $name: output does not match /$regex/"
    echo "$out"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

for np in 1 2 3 4; do
  expect "values at world $np" "$np" 0 "mpi_check values: ok" values
done
expect "a throwing rank" 3 nonzero "rank 1 failed: rank 1 was told to throw" throw 20
expect "a desync" 3 nonzero \
  "collective mismatch on group 'tp' seq 1: rank 0 called all_reduce\\(f32\\[4\\], sum\\), rank 1 called all_gather\\(f32\\[4\\]\\)" \
  desync 20
expect "a stalled rank" 3 nonzero \
  "timed out after 2s in all_reduce\\(f32\\[4\\], sum\\) seq 1 on group 'tp' \\{0, 1, 2\\}.*" stall 2
expect "the stalled rank's peers print their last collectives" 3 nonzero \
  "last collectives of rank [01] \\(oldest first\\):" stall 2
expect "a rank that returns early" 3 nonzero "timed out after 2s in all_reduce" exit 2
# The call check, the nccl backend's side channel under mpirun.
for np in 1 3; do
  expect "call check at world $np" "$np" 0 "mpi_check check: ok" check 20
done
expect "a call check desync" 3 nonzero \
  "collective mismatch on group 'tp' seq 1: rank 0 called all_reduce\\(f32\\[4\\], sum\\), rank 1 called all_reduce\\(f32\\[8\\], sum\\)" \
  check-desync 20
expect "a call check send/recv mismatch" 3 nonzero \
  "send/recv mismatch on group 'tp': rank 0 sends f32\\[4\\] at seq 0, rank 1 receives f32\\[8\\] at seq 0" \
  check-p2p 20

if [[ $fails != 0 ]]; then
  echo "mpi_faults.sh: $fails failed"
  exit 1
fi
echo "mpi_faults.sh: all passed"
