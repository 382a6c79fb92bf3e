#!/usr/bin/env bash
# escapes.sh COMMTRACE: an error message never carries a terminal escape sequence: control
# characters from an argument are shown as \xNN (those from files are refused by the reader).
set -u
ct="$1"
fail() { echo "escapes.sh: $*" >&2; exit 1; }
err="$("$ct" train --model $'bad\e]0;title\aname' 2>&1 >/dev/null)"; rc=$?
[[ $rc == 2 ]] || fail "exit $rc, expected 2"
[[ "$err" == *'bad\x1b]0;title\x07name'* ]] || fail "message not escaped: $err"
[[ "$err" != *$'\e'* ]] || fail "the message holds a raw ESC"
echo ok
