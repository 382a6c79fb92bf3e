#!/usr/bin/env bash
# expect.sh CODE REGEX -- CMD...: runs CMD, fails unless it exits with CODE and its combined
# output matches the extended regex REGEX (empty REGEX: any output).
set -u
code="$1"; regex="$2"; shift 3
out="$("$@" 2>&1)"; rc=$?
printf '%s\n' "$out"
if [[ "$rc" != "$code" ]]; then echo "expect.sh: exit code $rc, expected $code" >&2; exit 1; fi
if [[ -n "$regex" ]] && ! grep -Eq -- "$regex" <<<"$out"; then
  echo "expect.sh: output does not match /$regex/" >&2; exit 1
fi
