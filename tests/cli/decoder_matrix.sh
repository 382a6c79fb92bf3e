#!/usr/bin/env bash
# decoder_matrix.sh COMMTRACE SAMPLES: `commtrace verify` must PASS for every decoder model (the
# zoo's decoder and the tiny presets of samples/models) and every built-in decoder plan at world
# sizes 1, 2, 4 and 8 and on a 2x2 dp × tp mesh (DDP; FSDP; FSDP alone on 4x1 without reshard
# after forward); the Megatron plans for the fused-QKV models (megatron-sp refuses FSDP: its
# coalesced gradient all_reduce needs whole gradients).
# The zoo's decoder has 4 heads: at world 8 it must fail with the clear head-count error.
# llama-tiny-gqa2 has 2 kv heads: at world 4 and 8 they are duplicated onto the ranks.
set -uo pipefail
ct="$1" samples="$2"
fails=0 runs=0
for model in decoder "$samples/llama-tiny.json" "$samples/llama-tiny-fused.json" "$samples/gpt-tiny.json" \
    "$samples/llama-tiny-megatron.json" "$samples/gpt-tiny-fused.json" "$samples/llama-tiny-gqa2.json"; do
  plans="tp sp torchtitan"
  [[ "$model" == *fused* || "$model" == *megatron* ]] && plans="$plans megatron megatron-sp"
  for plan in $plans; do
    for world in "1" "2" "4" "8" "4 --mesh 2x2" "4 --mesh 2x2 --data-parallel fsdp" \
        "4 --mesh 4x1 --data-parallel fsdp --no-reshard-after-forward"; do
      runs=$((runs + 1))
      # shellcheck disable=SC2086
      out="$("$ct" verify --model "$model" --plan "$plan" --world-size $world 2>&1)"
      rc=$?
      if [[ "$model" == decoder && "$world" == 8 ]]; then
        if [[ $rc -ne 2 || "$out" != *"must be divisible by the tensor-parallel degree"* ]]; then
          fails=$((fails + 1))
          printf 'FAILED (expected the head-count error): verify --model %s --plan %s --world-size 8\n%s\n' \
            "$model" "$plan" "$out"
        fi
      elif [[ "$plan" == megatron-sp && "$world" == *fsdp* ]]; then
        if [[ $rc -ne 2 || "$out" != *"coalesce_partial_grads"* ]]; then
          fails=$((fails + 1))
          printf 'FAILED (expected the FSDP refusal): verify --model %s --plan megatron-sp --world-size %s\n%s\n' \
            "$model" "$world" "$out"
        fi
      elif [[ $rc -ne 0 ]]; then
        fails=$((fails + 1))
        printf 'FAILED: verify --model %s --plan %s --world-size %s\n%s\n' "$model" "$plan" "$world" "$out"
      fi
    done
  done
done
echo "decoder matrix: $((runs - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
