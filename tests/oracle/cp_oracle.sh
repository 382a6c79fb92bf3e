#!/usr/bin/env bash
# cp_oracle.sh CP_CORE: ColossalAI's RingQK/RingAV and DeepSpeed-Ulysses (cp_oracle.py) against
# commtrace's rsa and ulysses cores. Skipped (exit 77) without torch, colossalai and deepspeed.
# Python: $COMMTRACE_TORCH_PYTHON, else the repo's .venv, else python3.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/torch_python.sh"
torch_python cp_oracle torch
OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore exec "$py" "$here/cp_oracle.py" --cp-core "$1"
