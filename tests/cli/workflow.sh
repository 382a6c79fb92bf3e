#!/usr/bin/env bash
# workflow.sh COMMTRACE SAMPLES_DIR DATA_DIR: the user-facing jobs end to end in a scratch dir:
# run → JSON → show / diff / check (exit codes 0, 1, 2 as documented), the PyTorch-compatible
# outputs byte-identical to PyTorch's at noise 0, --expect, --rank all, meta + fake at world 64,
# and bad inputs failing with a message and exit 2.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/check.sh"
ct="$1"; data="$3"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

check run_tp 0 "all_reduce +×1" -- "$ct" run --model toy --plan tp --world-size 4 --json tp.json
check run_sp 0 "reduce_scatter" -- "$ct" run --model toy --plan sp --world-size 4 --json sp.json
check show 0 "ToyModel.out_proj" -- "$ct" show tp.json
check show_torch 0 "\*c10d_functional.all_reduce: 1" -- "$ct" show tp.json --compat torch
check diff_same 0 "no differences" -- "$ct" diff tp.json tp.json
check diff_tp_sp 1 "totals: forward -1 all_reduce, \+1 all_gather, \+1 reduce_scatter; backward \+1 all_gather" \
  -- "$ct" diff tp.json sp.json
check baseline_update 0 "wrote baseline" -- "$ct" check tp.json --baseline base.json --update
check baseline_ok 0 "^OK" -- "$ct" check tp.json --baseline base.json
"$ct" run --model toy --plan tp --world-size 4 --input-requires-grad --json tp_grad.json >/dev/null
check baseline_changed 1 "backward.all_reduce: expected 0, got 1" -- "$ct" check tp_grad.json --baseline base.json
check baseline_other_model 2 "made for model 'toy'" -- \
  bash -c "'$ct' run --model mlp --plan tp --world-size 2 --json mlp.json >/dev/null && '$ct' check mlp.json --baseline base.json"
check expect_ok 0 "expectations met: 2" -- "$ct" run --model toy --plan sp --world-size 4 \
  --expect forward.all_gather=1 --expect backward.all_gather=1
check expect_fail 1 "expectation failed: forward.all_reduce" -- "$ct" run --model toy --plan sp \
  --world-size 4 --expect forward.all_reduce=1
check rank_all 0 "ranks consistent: 3 ranks" -- "$ct" run --model mlp --plan sp --world-size 3 --rank all

# PyTorch compatibility: noise 0 byte-identical to the goldens.
sed -n '/noise_level=0 =====/,/noise_level=1 =====/p' "$data/torch/golden_mlp_tp_tables.txt" | sed '1d;$d' >golden0.txt
"$ct" run --model mlp --plan tp --world-size 4 --compat torch --torch-json mlp0.json 2>/dev/null >table0.txt
if cmp -s table0.txt golden0.txt && cmp -s mlp0.json "$data/torch/golden_mlp_tp_comm_mode_log_noise0.json"; then
  echo "ok   torch_noise0_byte_identical"
else
  echo "FAIL torch_noise0_byte_identical"; diff table0.txt golden0.txt; fails=$((fails + 1))
fi
check diff_vs_torch 0 "no differences" -- "$ct" diff mlp0.json "$data/torch/golden_mlp_tp_comm_mode_log_noise0.json"

# Any world size on meta tensors with the fake backend.
check fake_meta_64 0 "ranks consistent: 64 ranks" -- "$ct" run --model transformer --plan sp \
  --world-size 64 --device meta --backend fake --rank all

# Bad input: a message and exit 2, never a crash.
printf '{"schema": "commtrace.trace", "version": "3.0"}' >v3.json
check bad_version 2 "version 3.0 is not supported" -- "$ct" show v3.json
printf '{"schema": "commtrace.trace", "ver' >trunc.json
check bad_truncated 2 "trunc.json" -- "$ct" diff trunc.json tp.json
check bad_missing_file 2 "nope.json" -- "$ct" show nope.json
check bad_meta_threads 2 "needs the fake backend" -- "$ct" run --device meta
check bad_rank 2 "rank 9 out of range" -- "$ct" run --model toy --world-size 4 --rank 9
check bad_plan_file 2 "cannot open plan file" -- "$ct" run --model toy --plan ./missing.json
printf '{"schema": "commtrace.plan", "version": "1.0", "plan": {"decoder": {"style": "ColwiseParallel"}}}' >p.json
check bad_plan_pattern 2 "pattern 'decoder' matches no module" -- "$ct" run --model toy --plan p.json
check bad_shape_mesh 2 "mesh 2x3 has 6 ranks but the world size is 4" -- "$ct" run --world-size 4 --mesh 2x3
printf '{"schema": "commtrace.model", "version": "1.0", "base": "transformer", "args": {"dim": 10, "n_heads": 4}}' >m.json
check bad_model_args 2 "dim 10 is not divisible by n_heads 4" -- "$ct" run --model m.json
printf '{"schema": "commtrace.model", "version": "1.0", "name": "tiny", "base": "transformer", "args": {"n_layers": 1, "dim": 32, "n_heads": 8}}' >tiny.json
check model_file 0 "Transformer.layers.0" -- "$ct" run --model tiny.json --plan tp --world-size 2

echo "workflow: $fails failed"
[[ $fails -eq 0 ]]
