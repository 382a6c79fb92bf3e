# Sourced by the oracle scripts: `torch_python NAME MODULES` sets $py to the Python that has
# torch ($COMMTRACE_TORCH_PYTHON, else the repo's .venv, else python3), or exits 77 (skipped)
# naming NAME when MODULES ("torch, ...") do not import with it.
torch_python() {
  local here
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  py="${COMMTRACE_TORCH_PYTHON:-}"
  if [[ -z "$py" ]]; then
    if [[ -x "$here/../../.venv/bin/python" ]]; then py="$here/../../.venv/bin/python"; else py=python3; fi
  fi
  local why
  if ! why="$("$py" -c "import $2" 2>&1)"; then
    echo "$1: $2 not importable with $py ($(tail -n 1 <<<"$why"); see tests/oracle/README.md); skipped"
    exit 77
  fi
}
