#!/usr/bin/env bash
# cp_oracle.sh CP_CORE: ColossalAI's RingQK/RingAV and DeepSpeed-Ulysses (cp_oracle.py) against
# commtrace's rsa and ulysses cores. Skipped (exit 77) without torch, colossalai and deepspeed.
# Python: $COMMTRACE_TORCH_PYTHON, else the repo's .venv, else python3.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${COMMTRACE_TORCH_PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$here/../../.venv/bin/python" ]]; then py="$here/../../.venv/bin/python"; else py=python3; fi
fi
if ! "$py" -c "import torch" >/dev/null 2>&1; then
  echo "cp_oracle: torch is not importable with $py (see tests/oracle/README.md); skipped"
  exit 77
fi
OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore exec "$py" "$here/cp_oracle.py" --cp-core "$1"
