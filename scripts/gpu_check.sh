#!/usr/bin/env bash
# gpu_check.sh: the one command to run on a GPU machine (one NVIDIA GPU; CUDA 13 and NCCL 2.28
# installed; nothing is installed by this script). It builds commtrace with CUDA in its own
# build folder (build-gpu/) and runs every check that needs the GPU, each printed as PASS, FAIL
# or SKIP with its reason, then a summary; exit 1 when any check fails.
#
# Checks so far:
#   cuda-kernels  tests/kernels/test_cuda: the CUDA backend against the CPU backend (the reference)
#                 on random inputs, f32, f64 and bf16.
#   cuda-verify   verify --device cuda (threads backend: several ranks on the one GPU) for the
#                 zoo's models and plans at world 1, 2 and 4.
#   cuda-trace    run --device cuda writes the CPU run's PyTorch-format dump byte for byte
#                 (modules, collectives, counts, shapes, shardings).
#   nccl-plugin   libcommtrace_nccl_profiler.so loaded by a real NCCL program (world 1,
#                 tests/nccl_profiler/nccl_world1.cpp): its trace holds every call it made.
#   torch-plugin  the same plugin under PyTorch's NCCL process group (world 1), when torch with
#                 CUDA is importable; and torch.profiler's trace of that run through
#                 `import kineto` (NCCL's record_param_comms events).
#
# Environment: BUILD_DIR (default build-gpu), OUT (where traces and logs go; default a fresh
# folder under /tmp), PYTHON (default python3), JOBS (default nproc).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
build="${BUILD_DIR:-build-gpu}"
out="${OUT:-$(mktemp -d /tmp/commtrace-gpu-XXXXXX)}"
python="${PYTHON:-python3}"
mkdir -p "$out"
failures=0
results=()
result() {  # result STATUS NAME DETAIL
  results+=("$(printf '%-5s %-13s %s' "$1" "$2" "$3")")
  echo "gpu_check: $1 $2: $3"
  [[ "$1" == FAIL ]] && failures=$((failures + 1))
}

echo "gpu_check: output in $out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4

# ---- build: CUDA on, the GPU machine's own libraries (Catch2 v3 there) ----
start=$(date +%s)
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMMTRACE_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log"
  result FAIL build "configure failed (log: $out/configure.log)"
else
  grep "commtrace:" "$out/configure.log"
  if cmake --build "$build" -j"${JOBS:-$(nproc)}" --target commtrace commtrace_nccl_profiler \
    nccl_world1 test_cuda >"$out/build.log" 2>&1; then
    result PASS build "$(($(date +%s) - start)) s"
  else
    tail -30 "$out/build.log"
    result FAIL build "build failed (log: $out/build.log)"
  fi
fi
ct="$build/commtrace"
plugin="$root/$build/libcommtrace_nccl_profiler.so"

# ---- cuda-kernels: every CUDA kernel against the CPU backend ----
if timeout 300 "$build/tests/kernels/test_cuda" >"$out/test_cuda.log" 2>&1; then
  result PASS cuda-kernels "$(tail -1 "$out/test_cuda.log")"
else
  tail -40 "$out/test_cuda.log"
  result FAIL cuda-kernels "test_cuda failed (log: $out/test_cuda.log)"
fi

# ---- cuda-verify: parallel on the GPU against one device, per zoo model and plan ----
verify_failed=()
verify_runs=0
for mp in "toy tp" "toy sp" "mlp tp" "transformer tp" "transformer sp" "decoder tp"; do
  read -r model plan <<<"$mp"
  for w in 1 2 4; do
    verify_runs=$((verify_runs + 1))
    if ! timeout 120 "$ct" verify --device cuda --model "$model" --plan "$plan" --world-size "$w" \
      >"$out/verify-$model-$plan-$w.log" 2>&1; then
      tail -5 "$out/verify-$model-$plan-$w.log"
      verify_failed+=("$model/$plan/w$w")
    fi
  done
done
if ((${#verify_failed[@]} == 0)); then
  result PASS cuda-verify "$verify_runs runs"
else
  result FAIL cuda-verify "${#verify_failed[@]} of $verify_runs failed: ${verify_failed[*]}"
fi

# ---- cuda-trace: the GPU run's collective summary equals the CPU run's ----
trace_failed=()
for w in 2 4; do
  for plan in tp sp; do
    for dev in cpu cuda; do
      timeout 120 "$ct" run --device "$dev" --model transformer --plan "$plan" --world-size "$w" \
        --noise 2 --torch-json "$out/trace-$plan-$w-$dev.json" >"$out/trace-$plan-$w-$dev.log" 2>&1 ||
        echo "run failed" >"$out/trace-$plan-$w-$dev.json"
    done
    cmp -s "$out/trace-$plan-$w-cpu.json" "$out/trace-$plan-$w-cuda.json" || trace_failed+=("$plan/w$w")
  done
done
if ((${#trace_failed[@]} == 0)); then
  result PASS cuda-trace "transformer tp and sp at world 2 and 4"
else
  result FAIL cuda-trace "cpu and cuda dumps differ: ${trace_failed[*]} (see $out/trace-*)"
fi

# ---- nccl-plugin: a real NCCL program at world 1 ----
if [[ ! -x "$build/tests/nccl_profiler/nccl_world1" ]]; then
  result FAIL nccl-plugin "nccl_world1 was not built (CUDA or NCCL not found?)"
else
  iters=3
  if NCCL_PROFILER_PLUGIN="$plugin" COMMTRACE_NCCL_TRACE="$out/nccl-rank%r.json" \
    NCCL_DEBUG=WARN timeout 120 "$build/tests/nccl_profiler/nccl_world1" "$iters" \
    >"$out/nccl_world1.log" 2>&1; then
    cat "$out/nccl_world1.log"
    if [[ -f "$out/nccl-rank0.json" ]] && "$ct" show "$out/nccl-rank0.json" >"$out/nccl.txt" 2>&1; then
      cat "$out/nccl.txt"
      missing=()
      for op in all_reduce all_gather reduce_scatter broadcast send recv; do
        grep -Eq "forward +$op +[^ ]+ +1 +1 " "$out/nccl.txt" || missing+=("$op")
      done
      if ((${#missing[@]} == 0)); then
        result PASS nccl-plugin "$iters iterations, each call once per iteration"
      else
        result FAIL nccl-plugin "not once per iteration in the trace: ${missing[*]}"
      fi
    else
      result FAIL nccl-plugin "no readable trace $out/nccl-rank0.json"
    fi
  else
    cat "$out/nccl_world1.log"
    result FAIL nccl-plugin "nccl_world1 failed (log: $out/nccl_world1.log)"
  fi
fi

# ---- torch-plugin: PyTorch's NCCL process group, and its profiler trace ----
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  >/dev/null 2>&1; then
  result SKIP torch-plugin "no importable torch with CUDA ($python)"
else
  cat >"$out/torch_world1.py" <<'PY'
import os, sys
import torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule
out = sys.argv[1]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.set_device(0)
x = torch.ones(1 << 20, device="cuda")
y = torch.empty(1 << 20, device="cuda")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
             schedule=schedule(wait=0, warmup=1, active=2),
             on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out, "kineto-rank0.json"))) as p:
    for _ in range(3):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(y, x)
        dist.reduce_scatter_tensor(x, y)
        dist.broadcast(x, 0)
        torch.cuda.synchronize()
        p.step()
dist.destroy_process_group()
print("torch_world1: done")
PY
  if NCCL_PROFILER_PLUGIN="$plugin" COMMTRACE_NCCL_TRACE="$out/torch-nccl-rank%r.json" \
    timeout 300 "$python" "$out/torch_world1.py" "$out" >"$out/torch.log" 2>&1; then
    ok=1
    if "$ct" show "$out/torch-nccl-rank0.json" >"$out/torch-nccl.txt" 2>&1; then
      cat "$out/torch-nccl.txt"
    else
      ok=0
      echo "gpu_check: no plugin trace from torch (NCCL may not have loaded the plugin):"
      grep -i "profiler\|commtrace" "$out/torch.log" | head
    fi
    if "$ct" import kineto "$out/kineto-rank0.json" -o "$out/kineto.json" >"$out/kineto.txt" 2>&1; then
      cat "$out/kineto.txt"
    else
      ok=0
      cat "$out/kineto.txt"
    fi
    if ((ok)); then
      result PASS torch-plugin "plugin trace and import kineto of the NCCL run (see above)"
    else
      result FAIL torch-plugin "see $out/torch.log, torch-nccl.txt, kineto.txt"
    fi
  else
    tail -20 "$out/torch.log"
    result FAIL torch-plugin "the torch run failed (log: $out/torch.log)"
  fi
fi

echo
echo "gpu_check summary (output in $out):"
printf '  %s\n' "${results[@]}"
((failures == 0))
