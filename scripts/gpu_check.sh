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
#                 zoo's models and plans at world 1, 2, 4 and 8 (where the heads divide), and in
#                 bf16 at world 2.
#   cuda-trace    run --device cuda writes the CPU run's PyTorch-format dump byte for byte
#                 (modules, collectives, counts, shapes, shardings), but for the meshes'
#                 device type ('cuda').
#   nccl-verify   verify --backend nccl (world 1: NCCL takes one rank per GPU) for the zoo.
#   nccl-trace    run --backend nccl at world 1 writes the threads run's dump byte for byte.
#   nccl-two      --backend nccl at world 2 on one GPU stops with the error naming the GPUs.
#   nccl-mpirun   mpirun -np 1 commtrace run --backend nccl: the transformer TP step with the
#                 NCCL unique id over MPI (when mpirun is there).
#   bench         one table: the op layer's GEMM against cuBLAS (bench_cuda_gemm), the
#                 transformer step traced/untraced on cuda at dim 1024 (world 4, threads),
#                 NCCL's world-1 all_reduce of 256 MiB.
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
    nccl_world1 test_cuda bench_cuda_gemm >"$out/build.log" 2>&1; then
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
verify_one() {  # verify_one LABEL ARGS...: one verify run, its log under $out
  local label="$1"
  shift
  verify_runs=$((verify_runs + 1))
  if ! timeout 120 "$ct" verify "$@" >"$out/verify-$label.log" 2>&1; then
    tail -5 "$out/verify-$label.log"
    verify_failed+=("$label")
  fi
}
for mp in "toy tp" "toy sp" "mlp tp" "mlp sp" "mlp-stacked tp" "transformer tp" "transformer sp" \
  "decoder tp" "decoder sp"; do
  read -r model plan <<<"$mp"
  for w in 1 2 4 8; do
    # The zoo's transformer and decoder have 4 heads: tensor parallel up to 4 ranks.
    [[ $w == 8 && ($model == transformer || $model == decoder) ]] && continue
    verify_one "$model-$plan-w$w" --device cuda --model "$model" --plan "$plan" --world-size "$w"
  done
  verify_one "$model-$plan-w2-bf16" --device cuda --model "$model" --plan "$plan" \
    --world-size 2 --dtype bf16
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
    # The meshes name their device ('cuda' where the cpu run says 'cpu'); all else is equal.
    sed "s/'cuda'/'cpu'/g" "$out/trace-$plan-$w-cuda.json" | cmp -s "$out/trace-$plan-$w-cpu.json" - ||
      trace_failed+=("$plan/w$w")
  done
done
if ((${#trace_failed[@]} == 0)); then
  result PASS cuda-trace "transformer tp and sp at world 2 and 4"
else
  result FAIL cuda-trace "cpu and cuda dumps differ: ${trace_failed[*]} (see $out/trace-*)"
fi

# ---- nccl-verify, nccl-trace, nccl-two, nccl-mpirun: the nccl communicator backend ----
verify_failed=()
verify_runs=0
for mp in "toy tp" "toy sp" "mlp tp" "mlp sp" "mlp-stacked tp" "transformer tp" "transformer sp" \
  "decoder tp" "decoder sp"; do
  read -r model plan <<<"$mp"
  verify_one "nccl-$model-$plan" --backend nccl --device cuda --model "$model" --plan "$plan" \
    --world-size 1
done
if ((${#verify_failed[@]} == 0)); then
  result PASS nccl-verify "$verify_runs runs at world 1"
else
  result FAIL nccl-verify "${#verify_failed[@]} of $verify_runs failed: ${verify_failed[*]}"
fi
for backend in threads nccl; do
  timeout 120 "$ct" run --device cuda --backend "$backend" --model transformer --plan tp \
    --world-size 1 --noise 2 --torch-json "$out/nccl-trace-$backend.json" \
    >"$out/nccl-trace-$backend.log" 2>&1 || echo "run failed" >"$out/nccl-trace-$backend.json"
done
if cmp -s "$out/nccl-trace-threads.json" "$out/nccl-trace-nccl.json"; then
  result PASS nccl-trace "transformer tp at world 1: nccl dump = threads dump"
else
  tail -5 "$out/nccl-trace-nccl.log"
  result FAIL nccl-trace "nccl and threads dumps differ (see $out/nccl-trace-*)"
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if ((gpus == 1)); then
  timeout 60 "$ct" run --device cuda --backend nccl --world-size 2 >"$out/nccl-two.log" 2>&1
  rc=$?
  if ((rc == 2)) && grep -q "need 2 GPUs" "$out/nccl-two.log"; then
    result PASS nccl-two "$(grep -o 'nccl backend: .*GPUs' "$out/nccl-two.log" | head -1)"
  else
    cat "$out/nccl-two.log"
    result FAIL nccl-two "exit $rc, expected 2 with the GPU count named"
  fi
else
  result SKIP nccl-two "$gpus GPUs visible (the check is for one)"
fi
if command -v mpirun >/dev/null; then
  if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 180 mpirun -np 1 \
    --oversubscribe "$ct" run --device cuda --backend nccl --model transformer --plan tp \
    >"$out/nccl-mpirun.log" 2>&1; then
    result PASS nccl-mpirun "$(grep -E '^  total' "$out/nccl-mpirun.log" | head -1 | tr -s ' ')"
  else
    tail -20 "$out/nccl-mpirun.log"
    result FAIL nccl-mpirun "mpirun -np 1 with the nccl backend failed (log: $out/nccl-mpirun.log)"
  fi
else
  result SKIP nccl-mpirun "no mpirun"
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

# ---- bench: the figures of issue 8, in one table ----
{
  echo "== op-layer GEMM vs direct cuBLAS (bench_cuda_gemm) =="
  timeout 300 "$build/tests/bench/bench_cuda_gemm" 50 2>&1
  echo "== transformer step traced/untraced on cuda, dim 1024, 4 layers, world 4 (threads) =="
  timeout 300 "$ct" bench step --device cuda --backend threads --world-size 4 \
    --model "$root/samples/models/transformer_1024.json" --plan tp --steps 3 --rounds 7 2>&1
  echo "== NCCL world-1 all_reduce, 256 MiB =="
  timeout 120 "$ct" bench allreduce --backend nccl --device cuda --world-size 1 --mib 256 \
    --rounds 20 2>&1
  echo "== threads all_reduce over device buffers, world 2, 256 MiB =="
  timeout 120 "$ct" bench allreduce --backend threads --device cuda --world-size 2 --mib 256 \
    --rounds 20 2>&1
} >"$out/bench.txt"
cat "$out/bench.txt"
if grep -q "op/cuBLAS" "$out/bench.txt" && grep -q "traced/untraced" "$out/bench.txt" &&
  grep -q "algbw" "$out/bench.txt"; then
  result PASS bench "table in $out/bench.txt (targets: op/cuBLAS >= 0.95, traced/untraced <= 1.02)"
else
  result FAIL bench "a benchmark did not print its figures (see $out/bench.txt)"
fi

echo
echo "gpu_check summary (output in $out):"
printf '  %s\n' "${results[@]}"
((failures == 0))
