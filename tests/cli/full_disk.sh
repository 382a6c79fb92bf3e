#!/usr/bin/env bash
# full_disk.sh COMMTRACE: a write that fails on stdout or stderr (/dev/full) exits 2, with the
# reason on stderr when stdout failed, and never aborts.
set -u
ct="$1"
fail() { echo "full_disk.sh: $*" >&2; exit 1; }
[[ -w /dev/full ]] || { echo "no /dev/full: skipped"; exit 0; }

err="$("$ct" models 2>&1 >/dev/full)"; rc=$?
[[ $rc == 2 ]] || fail "models > /dev/full exited $rc, expected 2"
grep -q "cannot write to standard output: No space left on device" <<<"$err" ||
  fail "models > /dev/full said: $err"

"$ct" train --model resnet 2>/dev/full; rc=$?
[[ $rc == 2 ]] || fail "an error printed to a full stderr exited $rc, expected 2"

out="$("$ct" models | head -1)"; rc=${PIPESTATUS[0]}
[[ -n "$out" ]] || fail "models | head printed nothing"
echo "ok"
