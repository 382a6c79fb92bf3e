#!/usr/bin/env bash
# hostile.sh COMMTRACE: the hostile inputs of issue 13, each rebuilt here. Every one must exit 2
# with a message naming the file (or option) and what is wrong, never crash, hang or allocate
# without bound: each runs under `timeout`, and outside sanitizer builds under a 1 GiB
# address-space limit (ASan reserves far more address space than it uses).
set -u
ct="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
failures=0
limit=""
# A sanitizer reserves terabytes of shadow memory: no address-space limit under one.
if ! grep -aqE '__(a|t)san_init' "$ct"; then limit="ulimit -v 1048576;"; fi

# expect NAME REGEX CMD...: exit 2 and the combined output matches the extended REGEX.
expect() {
  local name="$1" regex="$2"
  shift 2
  local out rc
  out="$(bash -c "$limit"' exec timeout 20 "$@"' _ "$ct" "$@" 2>&1)"
  rc=$?
  if [[ $rc != 2 ]]; then
    echo "FAIL $name: exit $rc, expected 2: $out" >&2
    failures=$((failures + 1))
  elif ! grep -Eq -- "$regex" <<<"$out"; then
    echo "FAIL $name: output does not match /$regex/: $out" >&2
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

# n copies of s.
rep() { python3 -c 'import sys; sys.stdout.write(sys.argv[1] * int(sys.argv[2]))' "$1" "$2"; }

"$ct" run --model mlp --world-size 2 --json trace.json --torch-json dump.json >/dev/null ||
  { echo "hostile.sh: could not make the seed files" >&2; exit 1; }
"$ct" check trace.json --baseline base.json --update >/dev/null || exit 1

# Nested JSON in every reader.
node='{"fqn":"x","collectives_forward":[],"collectives_backward":[],"children":['
printf '{"fqn":"Global","collectives_forward":[],"collectives_backward":[],"children":[%s%s]}' \
  "$(rep "$node" 10000)" "$(rep ']}' 10000)" >dump_deep.json
expect dump_deep "dump_deep.json: JSON nested deeper than 64 levels" show dump_deep.json
python3 -c 'import sys; t = open("base.json").read()
sys.stdout.write(t.replace("\"world_size\": 2", "\"world_size\": " + "[" * 100000 + "]" * 100000))' \
  >base_deep.json
expect baseline_deep "base_deep.json: JSON nested deeper than 64 levels" \
  check trace.json --baseline base_deep.json
printf '{"schema":"commtrace.model","version":"1.0","name":"m","base":"toy","args":%s%s}' \
  "$(rep '[' 1000000)" "$(rep ']' 1000000)" >model_deep.json
expect model_deep "model_deep.json: JSON nested deeper than 64 levels" train --model model_deep.json
printf '{"schema":"commtrace.plan","version":"1.0","name":"p","plan":{"in_proj":{"style":"ColwiseParallel","input_layouts":%s%s}}}' \
  "$(rep '[' 1000000)" "$(rep ']' 1000000)" >plan_deep.json
expect plan_deep "plan_deep.json: JSON nested deeper than 64 levels" run --plan plan_deep.json
python3 -c 'import sys; t = open("trace.json").read()
sys.stdout.write(t.replace("\"metadata\":{", "\"metadata\":{\"x\":" + "[" * 200000 + "]" * 200000 + ",", 1))' \
  >trace_deep.json
expect trace_deep "trace_deep.json: JSON nested deeper than 64 levels" show trace_deep.json

# Overflowing and huge numbers.
expect mesh_overflow "mesh 65536x65536 has 4294967296 ranks but the world size is 4" \
  run --mesh 65536x65536
printf '{"schema":"commtrace.model","version":"1.0","name":"m","base":"transformer","args":{"dim":1099511627776}}' \
  >model_huge.json
expect model_huge_dim "model_huge.json: args.dim: 1099511627776 is out of range" \
  run --model model_huge.json --device meta --backend fake
printf '{"schema":"commtrace.model","version":"1.0","name":"m","base":"transformer","args":{"batch":2147483648,"seq_len":2147483648,"max_seq_len":2147483648,"vocab_size":2147483648}}' \
  >model_numel.json
expect model_numel "model_numel.json: args: the logits \\(batch × seq_len × vocab_size\\) hold more than" \
  run --model model_numel.json --device meta --backend fake
python3 -c 'import json, sys; d = json.load(open("dump.json"))
d["collectives_forward"][0][1] = 2**63 - 1
json.dump(d, sys.stdout)' >dump_max.json
expect dump_count_max "dump_max.json: collectives_forward\\[0\\]: count 9223372036854775807 is larger than" \
  show dump_max.json

# Integers that a conversion would truncate.
for n in 4294967297 2147483648; do
  printf '{"schema":"commtrace.model","version":"1.0","name":"m","base":"transformer","args":{"n_layers":%s}}' \
    "$n" >layers_$n.json
  expect "n_layers_$n" "layers_$n.json: args.n_layers: $n is out of range \\[1, 100000\\]" \
    train --model layers_$n.json
done
printf '{"schema":"commtrace.plan","version":"1.0","name":"p","plan":{"norm":{"style":"SequenceParallel","sequence_dim":4294967297}}}' \
  >plan_seqdim.json
expect sequence_dim "plan_seqdim.json: plan.norm.sequence_dim: 4294967297 is out of range" \
  run --model transformer --plan plan_seqdim.json

# Messages name the file and the JSON path.
printf '{"schema":"commtrace.model","version":"1.0","name":7,"base":"toy"}' >model_name.json
expect model_name "model_name.json: name: expected a string, got number" train --model model_name.json
printf '{"schema":"commtrace.plan","version":"1.0","name":["x"],"plan":{}}' >plan_name.json
expect plan_name "plan_name.json: name: expected a string, got array" run --plan plan_name.json
printf '{"schema":"commtrace.model","version":"1.0","name":"m","base":"resnet"}' >model_base.json
expect model_base "model_base.json: base: unknown model 'resnet'" train --model model_base.json
printf '{"schema":"commtrace.plan","version":"1.0","name":7,"plan":{}}' >plan_name_int.json
expect plan_name_int "plan_name_int.json: name: expected a string" run --plan plan_name_int.json

# A 30,000-deep module chain in a trace (was 2.7 GB of output).
python3 - trace.json chain.json <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
n = 30000
mods = [{"fqn": "Global", "type": "", "parent": -1, "depth": 0, "children": [1], "params": []}]
for i in range(1, n):
    mods.append({"fqn": f"m{i}", "type": "X", "parent": i - 1, "depth": i,
                 "children": [i + 1] if i + 1 < n else [], "params": []})
for r in d["ranks"]:
    r["modules"] = mods
json.dump(d, open(sys.argv[2], "w"))
EOF
expect module_chain "chain.json: ranks\\[0\\].modules\\[31\\].depth: 31 is out of range \\[0, 30\\]" \
  show chain.json

if [[ $failures != 0 ]]; then
  echo "hostile.sh: $failures failed" >&2
  exit 1
fi
echo "hostile.sh: all passed"
