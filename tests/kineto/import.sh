#!/usr/bin/env bash
# import.sh COMMTRACE DATA: the PyTorch profiler fixtures (make_fixtures.py: real torch.profiler
# traces of the zoo models under PyTorch's TP/SP styles, gloo, 2 iterations) imported with
# `import kineto` give commtrace's own counts and bytes for the same model and plan, per module
# and phase (diff finds nothing), except the one difference README states: PyTorch's foreach
# AdamW all-reduces each Partial gradient 3 times (lerp, then addcmul reads it twice), commtrace
# once. TP vs SP diffs of imported and own traces print the same totals line; imported traces
# pass --rank all, check against a baseline of commtrace's own trace, and say what they lack.
set -u
ct="$1"
data="$2"
fail() { echo "import.sh: $*" >&2; exit 1; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

imp() {  # imp CASE [ARGS...]: import data/CASE into $dir/k_CASE.json, output in $dir/k_CASE.txt
  local c="$1"
  shift
  "$ct" import kineto "$data/$c" -o "$dir/k_$c.json" "$@" >"$dir/k_$c.txt" 2>&1 ||
    fail "import $c: $(cat "$dir/k_$c.txt")"
}
own() {  # own MODEL PLAN WORLD: commtrace's trace of the fixture's run
  "$ct" run --model "$1" --plan "$2" --world-size "$3" --iters 2 \
    --json "$dir/o_$1_$2_w$3.json" >/dev/null || fail "run $*"
}

for c in "toy tp 2" "toy sp 2" "mlp sp 4" "transformer tp 2" "transformer sp 2"; do
  set -- $c
  name="$1_$2_w$3"
  imp "$name" --model "$1" --plan "$2"
  own "$1" "$2" "$3"
  grep -q "^imported $3 ranks (2 iterations)" "$dir/k_$name.txt" ||
    fail "$name: $(head -1 "$dir/k_$name.txt")"
  out="$("$ct" diff "$dir/o_$name.json" "$dir/k_$name.json")"
  rc=$?
  if [[ "$name" == transformer_sp_w2 ]]; then
    # Only the optimizer's all_reduces of the SequenceParallel norms' Partial gradients differ.
    [[ $rc == 1 && "$(grep -v '^bus bytes' <<<"$out" | grep -c '→')" == 1 &&
      "$out" == *"optimizer   all_reduce   10 → 30   (+20)   bytes 640 B → 1.88 KiB"* &&
      "$out" == *"totals: optimizer +20 all_reduce"$'\n'"bus bytes: optimizer 640 B → 1.88 KiB"* ]] || fail "$name: diff (exit $rc):
$out"
  else
    [[ $rc == 0 ]] || fail "$name: imported differs from commtrace's own trace (exit $rc):
$out"
  fi
  out="$("$ct" show "$dir/k_$name.json" --rank all)" || fail "$name: --rank all: $out"
  [[ "$out" == *"ranks consistent: $3 ranks"* ]] || fail "$name: --rank all: $out"
done

# TP vs SP: the same totals line from imported traces as from commtrace's own.
a="$("$ct" diff "$dir/k_toy_tp_w2.json" "$dir/k_toy_sp_w2.json" | grep '^totals:')"
b="$("$ct" diff "$dir/o_toy_tp_w2.json" "$dir/o_toy_sp_w2.json" | grep '^totals:')"
[[ "$a" == "$b" && "$a" == "totals: forward -1 all_reduce, +1 all_gather, +1 reduce_scatter; backward +1 all_gather" ]] ||
  fail "toy TP vs SP totals: imported '$a', own '$b'"
a="$("$ct" diff "$dir/k_transformer_tp_w2.json" "$dir/k_transformer_sp_w2.json" | grep '^totals:')"
b="$("$ct" diff "$dir/o_transformer_tp_w2.json" "$dir/o_transformer_sp_w2.json" | grep '^totals:')"
# The same but for the optimizer count (+30 against +10, above).
[[ "${a/optimizer +30/optimizer +10}" == "$b" ]] ||
  fail "transformer TP vs SP totals: imported '$a', own '$b'"

# CI baselines: one made from commtrace's own trace checks the imported one; it pins the groups,
# which PyTorch names default_pg here and commtrace tp.
"$ct" check "$dir/o_toy_sp_w2.json" --baseline "$dir/base.json" --update >/dev/null
out="$("$ct" check "$dir/k_toy_sp_w2.json" --baseline "$dir/base.json")"
[[ $? == 1 && "$out" == *"forward.all_gather groups: expected tp(2), got default_pg(2)"* ]] ||
  fail "groups: $out"
"$ct" import kineto "$data/toy_sp_w2" --model toy --plan sp --group-name default_pg=tp \
  -o "$dir/renamed.json" >/dev/null || fail "--group-name"
out="$("$ct" check "$dir/renamed.json" --baseline "$dir/base.json")" ||
  fail "the imported toy sp trace fails the baseline of commtrace's own: $out"
"$ct" import kineto "$data/toy_tp_w2" --model toy --plan sp -o "$dir/wrong.json" >/dev/null
"$ct" check "$dir/wrong.json" --baseline "$dir/base.json" >/dev/null
[[ $? == 1 ]] || fail "a TP trace passed the SP baseline"

# What a trace lacks is said: no module ranges, or PyTorch's instance names only.
imp toy_sp_w2_plain
grep -q "note: modules: not in the trace" "$dir/k_toy_sp_w2_plain.txt" ||
  fail "plain: $(cat "$dir/k_toy_sp_w2_plain.txt")"
out="$("$ct" diff --depth 0 "$dir/o_toy_sp_w2.json" "$dir/k_toy_sp_w2_plain.json")" ||
  fail "plain: totals differ: $out"
imp toy_sp_w2_stack
grep -q "note: modules: instance names of the trace's nn.Module ranges" \
  "$dir/k_toy_sp_w2_stack.txt" || fail "stack: $(cat "$dir/k_toy_sp_w2_stack.txt")"
out="$("$ct" show "$dir/k_toy_sp_w2_stack.json")"
[[ "$out" == *"ToyModel_0.Linear_1  (Linear)"* ]] || fail "stack: $out"
out="$("$ct" diff --depth 0 "$dir/o_toy_sp_w2.json" "$dir/k_toy_sp_w2_stack.json")" ||
  fail "stack: totals differ: $out"

# Files one by one, gzipped or not, give the same trace as their folder.
gunzip -c "$data/toy_sp_w2/rank1.json.gz" >"$dir/rank1.json"
"$ct" import kineto "$dir/rank1.json" "$data/toy_sp_w2/rank0.json.gz" --model toy --plan sp \
  -o "$dir/files.json" >/dev/null || fail "import of single files"
out="$("$ct" diff "$dir/files.json" "$dir/k_toy_sp_w2.json")" || fail "files vs folder: $out"

# Ranks of different runs: show --rank all names the divergence and exits 1.
"$ct" import kineto "$data/toy_tp_w2/rank0.json.gz" "$data/toy_sp_w2/rank1.json.gz" \
  -o "$dir/mixed.json" >/dev/null || fail "import of mixed ranks"
out="$("$ct" show "$dir/mixed.json" --rank all)"
[[ $? == 1 && "$out" == *"ranks diverge"* ]] || fail "mixed ranks: $out"

# Bad input: exit 2 naming the problem.
err="$("$ct" import kineto "$data/toy_sp_w2/rank0.json.gz" "$data/toy_sp_w2/rank0.json.gz" \
  -o "$dir/x.json" 2>&1)"
[[ $? == 2 && "$err" == *"both hold rank 0"* ]] || fail "a rank twice: $err"
head -c 3000 "$data/toy_sp_w2/rank0.json.gz" >"$dir/cut.json.gz"
err="$("$ct" import kineto "$dir/cut.json.gz" -o "$dir/x.json" 2>&1)"
[[ $? == 2 && "$err" == *"cut.json.gz: the gzip data ends early"* ]] || fail "truncated: $err"
err="$("$ct" import kineto "$dir" -o "$dir/x.json" 2>&1)"  # a folder of commtrace traces
[[ $? == 2 && "$err" == *"traceEvents"* ]] || fail "a commtrace trace as input: $err"
[[ ! -e "$dir/x.json" ]] || fail "a failed import wrote its output"
echo ok
