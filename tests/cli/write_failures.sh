#!/usr/bin/env bash
# write_failures.sh COMMTRACE: a write that fails on stdout or stderr (/dev/full) exits 2, with
# the reason on stderr when stdout failed, and never aborts; a command with several output files
# replaces none of them when one cannot be written, and leaves no temporary file behind; so does
# a write cut by a file-size limit; an output that cannot be created fails before the run.
set -u
ct="$1"
fail() { echo "write_failures.sh: $*" >&2; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

echo old >"$dir/t.json"
"$ct" run --model toy --world-size 2 --json "$dir/t.json" --torch-json "$dir/missing/x.json" \
  >/dev/null 2>"$dir/err"; rc=$?
[[ $rc == 2 ]] || fail "a failing --torch-json exited $rc, expected 2"
grep -q "missing/x.json" "$dir/err" || fail "the error does not name the file: $(cat "$dir/err")"
[[ "$(cat "$dir/t.json")" == old ]] || fail "--json replaced its target although --torch-json failed"
[[ "$(ls "$dir")" == "$(printf 'err\nt.json')" ]] || fail "files left behind: $(ls "$dir")"

# An output that cannot be created fails before the run: nothing of the run is printed (a long
# run is not wasted); so does --chrome-trace.
for opt in --json --chrome-trace; do
  out="$("$ct" run --model toy --iters 3 "$opt" "$dir/missing/y.json" 2>&1)"; rc=$?
  [[ $rc == 2 ]] || fail "an unwritable $opt exited $rc, expected 2"
  [[ "$out" == "commtrace: error: $dir/missing/y.json: cannot open for writing: No such file or directory" ]] ||
    fail "an unwritable $opt said (before failing): $out"
done
[[ "$(ls "$dir")" == "$(printf 'err\nt.json')" ]] || fail "files left behind: $(ls "$dir")"

# A file-size limit (ulimit -f, in KiB) cuts the write of a trace of about 100 KiB: the previous
# file stays, the temporary is removed, and the reason is printed.
echo old >"$dir/t.json"
(ulimit -f 8; "$ct" run --model transformer --world-size 2 --json "$dir/t.json" >/dev/null \
  2>"$dir/err"); rc=$?
[[ $rc == 2 ]] || fail "a write past the file-size limit exited $rc, expected 2"
grep -q "t.json: cannot write: File too large" "$dir/err" || fail "said: $(cat "$dir/err")"
[[ "$(cat "$dir/t.json")" == old ]] || fail "the previous file was not kept"
[[ "$(ls "$dir")" == "$(printf 'err\nt.json')" ]] || fail "files left behind: $(ls "$dir")"

[[ -w /dev/full ]] || { echo "no /dev/full: the rest skipped"; exit 0; }

err="$("$ct" models 2>&1 >/dev/full)"; rc=$?
[[ $rc == 2 ]] || fail "models > /dev/full exited $rc, expected 2"
grep -q "cannot write to standard output: No space left on device" <<<"$err" ||
  fail "models > /dev/full said: $err"

"$ct" train --model resnet 2>/dev/full; rc=$?
[[ $rc == 2 ]] || fail "an error printed to a full stderr exited $rc, expected 2"

out="$("$ct" models | head -1)"; rc=${PIPESTATUS[0]}
[[ -n "$out" ]] || fail "models | head printed nothing"
echo "ok"
