#!/usr/bin/env bash
# oracle_diff.sh COMMTRACE: PyTorch (DTensor + CommDebugMode on a fake process group) and
# commtrace run the same models and plans; `commtrace diff` must find no difference.
# Skipped (exit 77) when PyTorch is not importable. Python: $COMMTRACE_TORCH_PYTHON, else the
# repo's .venv, else python3.
set -uo pipefail
ct="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/torch_python.sh"
torch_python oracle "torch, torch.distributed.tensor.debug"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
fails=0
# compare NAME DEPTH: the PyTorch oracle run with the array torch_args, commtrace run with the
# array ours_args, and `commtrace diff` of the two at DEPTH. PyTorch files optimizer collectives
# under a forward pass: forward and backward only (no optimizer).
compare() {
  local name="$1" depth="$2" out
  if ! "$py" "$here/torch_oracle.py" "${torch_args[@]}" --no-optimizer --noise-level 0 \
      --out-json "$work/$name.torch.json" >"$work/$name.log" 2>&1; then
    echo "FAIL $name: the PyTorch oracle failed"; cat "$work/$name.log"; fails=$((fails + 1)); return
  fi
  if ! "$ct" run "${ours_args[@]}" --json "$work/$name.ours.json" >/dev/null; then
    echo "FAIL $name: commtrace run failed"; fails=$((fails + 1)); return
  fi
  if out="$("$ct" diff --depth "$depth" "$work/$name.torch.json" "$work/$name.ours.json")"; then
    echo "ok   $name (diff depth $depth)"
  else
    echo "FAIL $name"; echo "$out"; fails=$((fails + 1))
  fi
}
# case: model plan world [--input-requires-grad] [diff depth]
while read -r model plan world grad depth; do
  [[ -z "$model" ]] && continue
  flag=""; [[ "$grad" == "grad" ]] && flag="--input-requires-grad"
  name="$model-$plan-w$world${flag:+-grad}"
  # decoder:NAME is the model file samples/models/NAME.json (base decoder).
  torch_model=(--model "$model")
  if [[ "$model" == decoder:* ]]; then
    model="$here/../../samples/models/${model#decoder:}.json"
    name="${name#decoder:}"
    torch_model=(--model decoder --model-file "$model")
  fi
  torch_args=("${torch_model[@]}" --plan "$plan" --world-size "$world" $flag)
  ours_args=(--model "$model" --plan "$plan" --world-size "$world" $flag)
  compare "$name" "$depth"
done <<'CASES'
toy tp 1 - -1
toy tp 4 - -1
toy sp 4 - -1
toy tp 4 grad -1
toy sp 4 grad -1
mlp tp 4 - -1
mlp sp 4 - -1
mlp-stacked tp 4 - -1
transformer tp 4 - -1
transformer sp 4 - 3
decoder:llama-tiny torchtitan 1 - -1
decoder:llama-tiny tp 2 - -1
decoder:llama-tiny sp 2 - 3
decoder:llama-tiny torchtitan 2 - 3
decoder:llama-tiny tp 4 - -1
decoder:llama-tiny sp 4 - 3
decoder:llama-tiny torchtitan 4 - 3
decoder:llama-tiny-fused tp 4 - -1
decoder:llama-tiny-fused torchtitan 4 - 3
decoder:gpt-tiny tp 4 - -1
decoder:gpt-tiny sp 4 - 3
decoder:gpt-tiny torchtitan 4 - 3
decoder:llama-tiny-megatron megatron 2 - -1
decoder:llama-tiny-megatron megatron 4 - -1
decoder:llama-tiny-megatron torchtitan 4 - 3
decoder:gpt-tiny-fused megatron 4 - -1
CASES
# transformer and decoder sp / torchtitan at depth 3 (down to layers.i.attention): PyTorch files
# the attention (feed-forward) input's backward reduce_scatter under attention.wq
# (feed_forward.w1), the last backward hook; commtrace under attention (feed_forward), whose
# pre-hook created it (DESIGN §1). Rolled-up counts agree from there up.
# Frozen parameters: a model file's "freeze" (samples/models) against torch_oracle.py --freeze
# with the same globs on the file's base model; the backward of what is frozen disappears alike.
while read -r file plan world depth; do
  [[ -z "$file" ]] && continue
  name="frozen-$file-$plan-w$world"
  model="$here/../../samples/models/$file.json"
  base="$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["base"])' "$model")"
  mapfile -t globs < <("$py" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["freeze"]))' "$model")
  torch_args=(--model "$base" --plan "$plan" --world-size "$world" --freeze "${globs[@]}")
  ours_args=(--model "$model" --plan "$plan" --world-size "$world")
  compare "$name" "$depth"
done <<'FROZEN'
transformer_frozen tp 2 -1
transformer_frozen tp 4 -1
transformer_frozen sp 4 3
FROZEN
# Activation checkpointing: PyTorch's ModelArgs(checkpoint_activations=True) (every block under
# non-reentrant torch.utils.checkpoint) against samples/models/transformer_checkpointed.json;
# CommDebugMode counts the recomputed collectives as backward, commtrace's diff folds its
# recompute phase into backward for the comparison.
while read -r plan world depth; do
  [[ -z "$plan" ]] && continue
  name="checkpointed-$plan-w$world"
  torch_args=(--model transformer --plan "$plan" --world-size "$world" --checkpoint-activations)
  ours_args=(--model "$here/../../samples/models/transformer_checkpointed.json" --plan "$plan"
             --world-size "$world")
  compare "$name" "$depth"
done <<'CHECKPOINTED'
tp 2 -1
tp 4 -1
sp 2 3
sp 4 3
CHECKPOINTED
# DDP's buckets (dp 2, tp 1): per iteration, the elements of each dp all_reduce, in order,
# against PyTorch's DistributedDataParallel (its first iteration one bucket, then rebuilt ones).
while read -r file cap; do
  [[ -z "$file" ]] && continue
  name="ddp-$file-$cap"
  capflag=(); torchcap=()
  [[ "$cap" != default ]] && capflag=(--ddp-buckets "$cap") && torchcap=("$cap")
  model="$here/../../samples/models/$file.json"
  if ! PYTHONPATH="$here" "$py" "$here/torch_ddp_buckets.py" "$model" 3 "${torchcap[@]}" \
      >"$work/$name.torch" 2>"$work/$name.log"; then
    echo "FAIL $name: the PyTorch oracle failed"; cat "$work/$name.log"; fails=$((fails + 1)); continue
  fi
  "$ct" run --model "$model" --plan tp --world-size 2 --mesh 2x1 --iters 3 "${capflag[@]}" \
    --json "$work/$name.json" >/dev/null || { echo "FAIL $name: commtrace run failed"; fails=$((fails + 1)); continue; }
  "$py" - "$work/$name.json" >"$work/$name.ours" <<'PY'
import json, sys
rank = json.load(open(sys.argv[1]))["ranks"][0]
for b in rank["blocks"]:
    sizes = [r["collective"]["bytes"] // 4 for r in b["records"]
             if r.get("kind") == "collective" and r["collective"]["group"] == "dp"]
    for _ in range(b.get("repeat", 1)):
        print(json.dumps(sizes))
PY
  if diff "$work/$name.torch" "$work/$name.ours" >"$work/$name.diff"; then
    echo "ok   $name ($(wc -l <"$work/$name.ours") iterations)"
  else
    echo "FAIL $name"; cat "$work/$name.diff"; fails=$((fails + 1))
  fi
done <<'DDP'
llama-tiny default
llama-tiny 0.01
gpt-tiny 0.02
DDP
# FSDP2 on dp x the plan on tp (fully_shard on every block and the root): per-phase counts.
# Depth 1 (the root's totals per phase): below it the only difference is the root's
# reduce_scatter (FSDP2's final backward callback), which PyTorch's module tracker files under
# tok_embeddings, the last module it entered, and commtrace under the root it reduces.
while read -r file plan mesh raf depth; do
  [[ -z "$file" ]] && continue
  name="fsdp-$file-$plan-$mesh-$raf"
  dp="${mesh%x*}"; tp="${mesh#*x}"; world=$((dp * tp))
  flag=(); [[ "$raf" == keep ]] && flag=(--no-reshard-after-forward)
  model="$here/../../samples/models/$file.json"
  if ! "$py" "$here/torch_oracle.py" --model decoder --model-file "$model" --plan "$plan" \
      --world-size "$world" --mesh "$mesh" --data-parallel fsdp "${flag[@]}" --no-optimizer \
      --noise-level 0 --out-json "$work/$name.torch.json" >"$work/$name.log" 2>&1; then
    echo "FAIL $name: the PyTorch oracle failed"; cat "$work/$name.log"; fails=$((fails + 1)); continue
  fi
  "$ct" run --model "$model" --plan "$plan" --world-size "$world" --mesh "$mesh" \
    --data-parallel fsdp "${flag[@]}" --json "$work/$name.ours.json" >/dev/null ||
    { echo "FAIL $name: commtrace run failed"; fails=$((fails + 1)); continue; }
  if out="$("$ct" diff --depth "$depth" "$work/$name.torch.json" "$work/$name.ours.json")"; then
    echo "ok   $name (diff depth $depth)"
  else
    echo "FAIL $name"; echo "$out"; fails=$((fails + 1))
  fi
done <<'FSDP'
llama-tiny tp 2x2 reshard 1
llama-tiny torchtitan 2x2 reshard 1
llama-tiny sp 2x2 keep 1
gpt-tiny torchtitan 2x2 reshard 1
llama-tiny tp 4x1 reshard 1
llama-tiny-megatron megatron 2x2 reshard 1
FSDP
echo "oracle: $fails failed"
[[ $fails -eq 0 ]]
