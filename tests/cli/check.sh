# check.sh: sourced by the CLI scripts. check NAME EXPECTED_RC REGEX -- CMD... runs CMD, and
# counts a failure in $fails (printing the output) unless it exits EXPECTED_RC and its combined
# output matches the extended regex REGEX (empty: any output).
fails=0
check() {
  local name="$1" want="$2" regex="$3"; shift 4
  local out rc
  out="$("$@" 2>&1)"; rc=$?
  if [[ "$rc" != "$want" ]] || { [[ -n "$regex" ]] && ! grep -Eq -- "$regex" <<<"$out"; }; then
    printf 'FAIL %s: exit %s (want %s), /%s/\n%s\n' "$name" "$rc" "$want" "$regex" "$out"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
